// Creates a compute backend by name, for binaries that take --backend.
#ifndef MLA_OFFLOAD_KERNELS_BACKEND_FACTORY_H_
#define MLA_OFFLOAD_KERNELS_BACKEND_FACTORY_H_

#include <memory>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "kernels/backend.h"

namespace mla {

struct BackendOptions {
  int cpu_threads = 0;  // 0: every hardware thread
  int device = 0;       // GPU ordinal for the CUDA backend
};

// The backend names this build knows, for --help: "cpu, cuda".
inline constexpr absl::string_view kBackendNames = "cpu, cuda";

// "cpu" or "cuda"; InvalidArgument for anything else, Unimplemented for a
// backend this build cannot run yet, each with a message saying what to do.
absl::StatusOr<std::unique_ptr<ComputeBackend>> CreateBackend(absl::string_view name,
                                                              const BackendOptions& options);

}  // namespace mla

#endif  // MLA_OFFLOAD_KERNELS_BACKEND_FACTORY_H_

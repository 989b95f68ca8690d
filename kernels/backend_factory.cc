#include "kernels/backend_factory.h"

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "kernels/cpu_backend.h"

namespace mla {

absl::StatusOr<std::unique_ptr<ComputeBackend>> CreateBackend(absl::string_view name,
                                                              const BackendOptions& options) {
  if (name == "cpu") return std::make_unique<CpuBackend>(options.cpu_threads);
  if (name == "cuda") {
    return absl::UnimplementedError(
        "the CUDA backend is not part of this build yet; use --backend=cpu");
  }
  return absl::InvalidArgumentError(
      absl::StrCat("unknown backend '", name, "'; choose one of: ", kBackendNames));
}

}  // namespace mla

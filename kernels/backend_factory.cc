#include "kernels/backend_factory.h"

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "kernels/cpu_backend.h"
#ifdef MLA_HAVE_CUDA
#include "kernels/cuda/cuda_backend.h"
#endif

namespace mla {

absl::StatusOr<std::unique_ptr<ComputeBackend>> CreateBackend(absl::string_view name,
                                                              const BackendOptions& options) {
  if (name == "cpu") return std::make_unique<CpuBackend>(options.cpu_threads);
  if (name == "cuda") {
#ifdef MLA_HAVE_CUDA
    absl::StatusOr<std::unique_ptr<CudaBackend>> backend = CudaBackend::Create(options.device);
    if (!backend.ok()) return backend.status();
    return std::unique_ptr<ComputeBackend>(std::move(*backend));
#else
    return absl::UnimplementedError(
        "this build has no CUDA: nvcc was not found when it was built");
#endif
  }
  return absl::InvalidArgumentError(
      absl::StrCat("unknown backend '", name, "'; choose one of: ", kBackendNames));
}

}  // namespace mla

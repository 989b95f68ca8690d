#include "kernels/cuda/allocation_range.h"

#include <cuda.h>
#include <cuda_runtime_api.h>

namespace mla::cuda {
namespace {

using AddressRangeFn = CUresult (*)(CUdeviceptr*, size_t*, CUdeviceptr);

// The driver's cuMemGetAddressRange; null when it lacks it.
AddressRangeFn AddressRange() {
  static const AddressRangeFn fn = [] {
    void* entry = nullptr;
    cudaDriverEntryPointQueryResult found{};
    if (cudaGetDriverEntryPointByVersion("cuMemGetAddressRange", &entry, 12000, cudaEnableDefault,
                                         &found) != cudaSuccess ||
        found != cudaDriverEntryPointSuccess) {
      cudaGetLastError();
      return AddressRangeFn{nullptr};
    }
    return reinterpret_cast<AddressRangeFn>(entry);
  }();
  return fn;
}

}  // namespace

absl::StatusOr<AllocationRange> AllocationOf(const void* device_ptr) {
  const AddressRangeFn range = AddressRange();
  if (range == nullptr) {
    return absl::InternalError(
        "the driver does not say how large a device allocation is (no cuMemGetAddressRange)");
  }
  CUdeviceptr base = 0;
  size_t size = 0;
  if (range(&base, &size, reinterpret_cast<CUdeviceptr>(device_ptr)) != CUDA_SUCCESS) {
    return absl::InvalidArgumentError("the pointer lies in no device allocation of this process");
  }
  return AllocationRange{reinterpret_cast<const void*>(base), static_cast<int64_t>(size)};
}

}  // namespace mla::cuda

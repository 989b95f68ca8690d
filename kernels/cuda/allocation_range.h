// Where the device allocation that holds a pointer starts and how large it
// is, as the driver says (cuMemGetAddressRange, reached through the CUDA
// runtime's driver entry points: nothing links the driver library). What
// bounds a CUDA IPC region on both sides: the server's importer checks a
// region's size against it, and the client's export refuses a pointer that
// is not the start of its allocation (the handle exports the whole
// allocation, so offsets would disagree). Thread-safe.
#ifndef MLA_OFFLOAD_KERNELS_CUDA_ALLOCATION_RANGE_H_
#define MLA_OFFLOAD_KERNELS_CUDA_ALLOCATION_RANGE_H_

#include <cstdint>

#include "absl/status/statusor.h"

namespace mla::cuda {

struct AllocationRange {
  const void* base = nullptr;
  int64_t bytes = 0;
};

// INVALID_ARGUMENT for a pointer into no device allocation of this process;
// INTERNAL when the driver lacks the call.
absl::StatusOr<AllocationRange> AllocationOf(const void* device_ptr);

}  // namespace mla::cuda

#endif  // MLA_OFFLOAD_KERNELS_CUDA_ALLOCATION_RANGE_H_

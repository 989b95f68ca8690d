// Kernels that only cuda_backend_test uses (test_kernels.h).
#include "kernels/cuda/test_kernels.h"

#include <cuda_runtime.h>

#include <cstdint>

namespace mla {
namespace cuda {
namespace {

__device__ __forceinline__ uint64_t GlobalTimerNs() {
  uint64_t now;
  asm volatile("mov.u64 %0, %%globaltimer;\n" : "=l"(now));
  return now;
}

__global__ void LateCopyKernel(uint4* dst, const uint4* src, int64_t pieces, int64_t delay_ns) {
  asm volatile("griddepcontrol.launch_dependents;\n" ::: "memory");
  const uint64_t start = GlobalTimerNs();
  while (GlobalTimerNs() - start < static_cast<uint64_t>(delay_ns)) {
  }
  for (int64_t i = blockIdx.x * int64_t{blockDim.x} + threadIdx.x; i < pieces;
       i += int64_t{gridDim.x} * blockDim.x) {
    dst[i] = src[i];
  }
}

}  // namespace

cudaError_t LaunchLateCopy(void* dst, const void* src, int64_t bytes, int64_t delay_ns,
                           cudaStream_t stream) {
  if (bytes % 16 != 0 || reinterpret_cast<uintptr_t>(dst) % 16 != 0 ||
      reinterpret_cast<uintptr_t>(src) % 16 != 0) {
    return cudaErrorInvalidValue;
  }
  // Eight CTAs: most SMs stay free for the decode's CTAs to start on.
  LateCopyKernel<<<8, 256, 0, stream>>>(static_cast<uint4*>(dst), static_cast<const uint4*>(src),
                                         bytes / 16, delay_ns);
  return cudaGetLastError();
}

}  // namespace cuda
}  // namespace mla

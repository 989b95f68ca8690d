// Kernels that only cuda_backend_test uses (test_kernels.h).
#include "kernels/cuda/test_kernels.h"

#include <cuda_runtime.h>

#include <cstdint>

#include "kernels/cuda/bf16_device.cuh"

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

__global__ void RoundToBf16Kernel(const float* in, uint32_t* packed, uint32_t* single,
                                  int64_t pairs) {
  for (int64_t i = blockIdx.x * int64_t{blockDim.x} + threadIdx.x; i < pairs;
       i += int64_t{gridDim.x} * blockDim.x) {
    const float lo = in[2 * i];
    const float hi = in[2 * i + 1];
    packed[i] = PackBf16(lo, hi);
    single[i] = ToBf16Bits(lo) | (ToBf16Bits(hi) << 16);
  }
}

}  // namespace

cudaError_t LaunchRoundToBf16(const float* in, uint32_t* packed, uint32_t* single, int64_t pairs,
                              cudaStream_t stream) {
  if (pairs == 0) return cudaSuccess;
  RoundToBf16Kernel<<<256, 256, 0, stream>>>(in, packed, single, pairs);
  return cudaGetLastError();
}

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

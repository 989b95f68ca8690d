// Kernels that only cuda_backend_test uses.
#ifndef MLA_OFFLOAD_KERNELS_CUDA_TEST_KERNELS_H_
#define MLA_OFFLOAD_KERNELS_CUDA_TEST_KERNELS_H_

#include <cuda_runtime.h>

#include <cstdint>

namespace mla {
namespace cuda {

// Enqueues on `stream` a kernel that allows the next kernel's programmatic
// dependent launch at once (griddepcontrol.launch_dependents), waits
// `delay_ns` on the GPU's clock, then copies `bytes` (a multiple of 16, both
// pointers 16-byte aligned) from src to dst: a stand-in for a prologue that
// writes cache rows late, to show that a decode launched after it reads them
// only once it has finished.
cudaError_t LaunchLateCopy(void* dst, const void* src, int64_t bytes, int64_t delay_ns,
                           cudaStream_t stream);

// The kernels' bf16 rounding (bf16_device.cuh) of `pairs` pairs of floats
// (device memory, in[2 i] and in[2 i + 1]): packed[i] = PackBf16 of the
// pair, single[i] = the two ToBf16Bits, lo in the low half.
cudaError_t LaunchRoundToBf16(const float* in, uint32_t* packed, uint32_t* single, int64_t pairs,
                              cudaStream_t stream);

}  // namespace cuda
}  // namespace mla

#endif  // MLA_OFFLOAD_KERNELS_CUDA_TEST_KERNELS_H_

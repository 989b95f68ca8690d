// bf16 <-> float32 on the device, as kernels/bf16.h on the host: rounding to
// nearest even, infinities and signed zeros kept, subnormals kept (no
// flush). NaN becomes the canonical NaN 0x7fff (the host helper keeps its
// payload; the spec never lets NaN through). Included by .cu files only.
#ifndef MLA_OFFLOAD_KERNELS_CUDA_BF16_DEVICE_CUH_
#define MLA_OFFLOAD_KERNELS_CUDA_BF16_DEVICE_CUH_

#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include <cstdint>

namespace mla {
namespace cuda {
namespace {

// The float of bf16 bits (in the low 16 bits of `bits16`).
__device__ __forceinline__ float Bf16Bits(uint32_t bits16) { return __uint_as_float(bits16 << 16); }

// A float's bf16 bits (one instruction).
__device__ __forceinline__ uint32_t ToBf16Bits(float value) {
  return static_cast<uint32_t>(__bfloat16_as_ushort(__float2bfloat16_rn(value)));
}

// Two floats as bf16, `lo` in the low half (one instruction for the two).
__device__ __forceinline__ uint32_t PackBf16(float lo, float hi) {
  uint32_t packed;
  asm("cvt.rn.bf16x2.f32 %0, %1, %2;\n" : "=r"(packed) : "f"(hi), "f"(lo));
  return packed;
}

}  // namespace
}  // namespace cuda
}  // namespace mla

#endif  // MLA_OFFLOAD_KERNELS_CUDA_BF16_DEVICE_CUH_

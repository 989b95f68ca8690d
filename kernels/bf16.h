// bfloat16 <-> float32 conversions, bit-exact and portable.
//
// bf16 values travel and rest as their 16-bit patterns (uint16_t, little
// endian). Conversion to bf16 rounds to nearest even, as every framework and
// the tensor cores do; NaN stays NaN (quiet), infinities stay infinite.
#ifndef MLA_OFFLOAD_KERNELS_BF16_H_
#define MLA_OFFLOAD_KERNELS_BF16_H_

#include <cstdint>
#include <cstring>

namespace mla {

inline float Bf16ToFloat(uint16_t bits) {
  const uint32_t wide = static_cast<uint32_t>(bits) << 16;
  float value;
  std::memcpy(&value, &wide, sizeof(value));
  return value;
}

inline uint16_t FloatToBf16(float value) {
  uint32_t bits;
  std::memcpy(&bits, &value, sizeof(bits));
  if ((bits & 0x7fffffffu) > 0x7f800000u) {  // NaN: keep it quiet and NaN.
    return static_cast<uint16_t>((bits >> 16) | 0x0040u);
  }
  bits += 0x7fffu + ((bits >> 16) & 1u);
  return static_cast<uint16_t>(bits >> 16);
}

// Rounds a float to the nearest bf16 value, staying in float.
inline float RoundToBf16(float value) { return Bf16ToFloat(FloatToBf16(value)); }

}  // namespace mla

#endif  // MLA_OFFLOAD_KERNELS_BF16_H_

// FP8 e4m3fn (the "fn" variant: no infinities, one NaN pattern, max 448) and
// the UE8M0 power-of-two scale exponents used by the MODEL1 cache format.
//
// Encoding rounds to nearest even and saturates to +-448, as spec section 3
// requires; a negative value that rounds to zero keeps its sign bit (0x80).
#ifndef MLA_OFFLOAD_KERNELS_FP8_E4M3_H_
#define MLA_OFFLOAD_KERNELS_FP8_E4M3_H_

#include <cmath>
#include <cstdint>
#include <cstring>

namespace mla {

inline constexpr float kE4m3Max = 448.0f;

// Encodes a finite float as e4m3fn. Values beyond +-448 saturate; NaN maps to
// the NaN pattern 0x7f (with its sign).
inline uint8_t FloatToE4m3(float value) {
  uint32_t bits;
  std::memcpy(&bits, &value, sizeof(bits));
  const uint8_t sign = static_cast<uint8_t>((bits >> 24) & 0x80u);
  const uint32_t magnitude_bits = bits & 0x7fffffffu;
  if (magnitude_bits > 0x7f800000u) return sign | 0x7f;
  float magnitude;
  std::memcpy(&magnitude, &magnitude_bits, sizeof(magnitude));
  if (magnitude >= kE4m3Max) return sign | 0x7e;
  if (magnitude < 0.015625f) {
    // Subnormal range (below 2^-6): steps of 2^-9. Scaling by 512 is exact,
    // and nearbyint rounds to nearest even in the default rounding mode. A
    // result of 8 is the smallest normal, whose code is also 8.
    return sign | static_cast<uint8_t>(std::nearbyint(magnitude * 512.0f));
  }
  // Normal range: round the 23-bit mantissa to 3 bits (nearest even); a carry
  // moves into the exponent, which is what rounding up to the next binade is.
  uint32_t rounded = magnitude_bits + 0x7ffffu + ((magnitude_bits >> 20) & 1u);
  const int exponent = static_cast<int>(rounded >> 23) - 127 + 7;
  const uint32_t mantissa = (rounded >> 20) & 7u;
  const uint32_t code = (static_cast<uint32_t>(exponent) << 3) | mantissa;
  return sign | static_cast<uint8_t>(code > 0x7eu ? 0x7eu : code);
}

inline float E4m3ToFloat(uint8_t code) {
  const int exponent = (code >> 3) & 0xf;
  const int mantissa = code & 7;
  float magnitude;
  if ((code & 0x7f) == 0x7f) {
    magnitude = NAN;
  } else if (exponent == 0) {
    magnitude = std::ldexp(static_cast<float>(mantissa), -9);
  } else {
    magnitude = std::ldexp(1.0f + mantissa / 8.0f, exponent - 7);
  }
  return (code & 0x80) ? -magnitude : magnitude;
}

// The smallest integer e with 2^e >= x, for a positive normal float x, read
// from its IEEE bits (not log2f, whose rounding differs between libraries).
inline int CeilLog2FromBits(float x) {
  uint32_t bits;
  std::memcpy(&bits, &x, sizeof(bits));
  const int exponent = static_cast<int>((bits >> 23) & 0xffu) - 127;
  return (bits & 0x7fffffu) != 0 ? exponent + 1 : exponent;
}

}  // namespace mla

#endif  // MLA_OFFLOAD_KERNELS_FP8_E4M3_H_

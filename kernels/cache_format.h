// The MODEL1 KV cache format (spec section 3): 584 bytes a token, paged in
// blocks of kBlockTokens tokens.
//
// A block of kBlockBytes holds, for its 64 tokens, first the 576-byte data rows
// (448 e4m3 NoPE bytes, then 64 bf16 RoPE values), then the 8-byte scale rows
// (7 UE8M0 exponents, one pad byte of 0), then zero padding. A global slot id
// is block * kBlockTokens + offset. These functions are the single definition
// of that layout for the host; device code mirrors the offsets below.
#ifndef MLA_OFFLOAD_KERNELS_CACHE_FORMAT_H_
#define MLA_OFFLOAD_KERNELS_CACHE_FORMAT_H_

#include <cstdint>

#include "kernels/geometry.h"

namespace mla {

// Byte offset of a slot's 576-byte data row from the start of its pool.
inline constexpr int64_t SlotDataOffset(int64_t slot) {
  return slot / kBlockTokens * kBlockBytes + slot % kBlockTokens * kTokenDataBytes;
}

// Byte offset of a slot's 8-byte scale row from the start of its pool.
inline constexpr int64_t SlotScaleOffset(int64_t slot) {
  return slot / kBlockTokens * kBlockBytes + int64_t{kBlockTokens} * kTokenDataBytes +
         slot % kBlockTokens * kTokenScaleBytes;
}

// UE8M0 scale exponent of one block of values whose largest magnitude is
// `amax` (a 64-value cache tile, a 128-value FP8 output block): the
// smallest e with 2^e >= max(amax, 1e-4) / 448, from the IEEE bits of that
// quotient.
int TileScaleExponent(float amax);

// Spec section 3's quantisation of one block of `count` values (a multiple
// of 32; NaNs are left out of the block's amax): e = TileScaleExponent(the
// largest |value|), codes[i] = e4m3fn(values[i] * 2^-e) rounded to nearest
// even and saturating (a negative value that rounds to zero is 0x80);
// returns the scale byte clamp(e + 127, 0, 255). The cache's 64-value tiles
// and the decode's 128-value FP8 output blocks (section 5) are both this.
uint8_t QuantizeBlock(const float* values, int count, uint8_t* codes);

// Quantises one row of 512 values (RoPE applied, already rounded to bf16) into
// its 576 data bytes and 8 scale bytes (the last one the zero pad byte).
void QuantizeRow(const float* row, uint8_t* data, uint8_t* scales);

// Decodes a row written by QuantizeRow back into 512 floats: e4m3 times
// 2^(byte - 127) for the NoPE dims, the exact bf16 values for the RoPE dims.
void DequantizeRow(const uint8_t* data, const uint8_t* scales, float* row);

// A view of one paged pool in the memory of the backend that owns it.
struct CachePoolView {
  uint8_t* base = nullptr;
  int64_t num_blocks = 0;

  int64_t num_slots() const { return num_blocks * kBlockTokens; }
  int64_t bytes() const { return num_blocks * kBlockBytes; }
};

}  // namespace mla

#endif  // MLA_OFFLOAD_KERNELS_CACHE_FORMAT_H_

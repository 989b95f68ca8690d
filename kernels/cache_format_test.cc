#include "kernels/cache_format.h"

#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <cstring>
#include <random>
#include <string>
#include <vector>

#include "gtest/gtest.h"
#include "kernels/bf16.h"
#include "kernels/fp8_e4m3.h"

namespace mla {
namespace {

struct EncodedRow {
  uint8_t data[kTokenDataBytes];
  uint8_t scales[kTokenScaleBytes];
};

EncodedRow Quantize(const std::vector<float>& row) {
  EncodedRow encoded;
  std::memset(&encoded, 0xA5, sizeof(encoded));  // poison: every byte must be written
  QuantizeRow(row.data(), encoded.data, encoded.scales);
  return encoded;
}

TEST(CacheFormatTest, BlockLayout) {
  EXPECT_EQ(kBlockBytes, 37440);
  EXPECT_EQ(SlotDataOffset(0), 0);
  EXPECT_EQ(SlotDataOffset(63), 63 * 576);
  EXPECT_EQ(SlotScaleOffset(0), 64 * 576);
  EXPECT_EQ(SlotScaleOffset(63), 64 * 576 + 63 * 8);
  EXPECT_EQ(SlotDataOffset(64), 37440);
  EXPECT_EQ(SlotScaleOffset(130), 2 * 37440 + 64 * 576 + 2 * 8);
  CachePoolView pool{nullptr, 3};
  EXPECT_EQ(pool.num_slots(), 192);
  EXPECT_EQ(pool.bytes(), 3 * 37440);
}

// Every byte below was worked out by hand from spec section 3.
TEST(CacheFormatTest, HandComputedRowByteByByte) {
  std::vector<float> row(kHeadDim, 0.0f);
  std::vector<uint8_t> data(kTokenDataBytes, 0);
  // Tile 0: amax 1 -> 1/448 lies in [2^-9, 2^-8) -> e = -8, byte 119; values x 256.
  const float tile0[] = {1.0f, 0.5f, -0.25f, 0.1f, -std::ldexp(1.0f, -10), -std::ldexp(1.0f, -20),
                         0.75f};
  const uint8_t code0[] = {0x78, 0x70, 0xE8, 0x5D, 0xA8, 0x80, 0x74};
  // (0.1 x 256 = 25.6 -> 1.625 x 16 = 26; -2^-20 x 256 rounds to -0 -> 0x80.)
  for (int i = 0; i < 7; ++i) {
    row[i] = tile0[i];
    data[i] = code0[i];
  }
  // Tile 1: all zero -> amax floor 1e-4: 1e-4/448 in [2^-23, 2^-22) -> e = -22, byte 105.
  // Tile 2: amax exactly 448 -> e = 0, byte 127; 3.5 = 1.75 x 2 -> 0x46.
  row[128] = 448.0f;
  row[129] = -448.0f;
  row[130] = 3.5f;
  data[128] = 0x7E;
  data[129] = 0xFE;
  data[130] = 0x46;
  // Tile 3: amax 56 = 448 x 2^-3 exactly -> e = -3, byte 124; 56 -> 448, 1 -> 8.
  row[192] = 56.0f;
  row[193] = 1.0f;
  data[192] = 0x7E;
  data[193] = 0x50;
  // Tile 4: amax 57, just above 448 x 2^-3 -> e = -2, byte 125; 57 x 4 = 228 -> 224.
  row[256] = 57.0f;
  data[256] = 0x76;
  // Tile 5: e = 0 (amax 448); ties go to the even mantissa, subnormals too.
  const float tile5[] = {448.0f, 1.0625f, 1.1875f, -1.0625f, std::ldexp(1.0f, -10),
                         3 * std::ldexp(1.0f, -10)};
  const uint8_t code5[] = {0x7E, 0x38, 0x3A, 0xB8, 0x00, 0x02};
  for (int i = 0; i < 6; ++i) {
    row[320 + i] = tile5[i];
    data[320 + i] = code5[i];
  }
  // Tile 6: amax 1000 -> 1000/448 in [2, 4) -> e = 2, byte 129; 250 rounds up
  // across the binade to 256.
  row[384] = 1000.0f;
  data[384] = 0x78;
  // RoPE dims are bf16, little endian.
  row[448] = 1.5f;   // 0x3FC0
  row[449] = -2.0f;  // 0xC000
  data[448] = 0xC0;
  data[449] = 0x3F;
  data[450] = 0x00;
  data[451] = 0xC0;
  const uint8_t scales[kTokenScaleBytes] = {119, 105, 127, 124, 125, 127, 129, 0};

  const EncodedRow encoded = Quantize(row);
  for (int i = 0; i < kTokenDataBytes; ++i) {
    EXPECT_EQ(encoded.data[i], data[i]) << "data byte " << i;
  }
  for (int i = 0; i < kTokenScaleBytes; ++i) {
    EXPECT_EQ(encoded.scales[i], scales[i]) << "scale byte " << i;
  }
}

TEST(CacheFormatTest, AmaxFloorAppliesToTinyTiles) {
  EXPECT_EQ(TileScaleExponent(0.0f), -22);
  EXPECT_EQ(TileScaleExponent(5e-5f), -22);
  EXPECT_EQ(TileScaleExponent(1e-4f), -22);
  std::vector<float> row(kHeadDim, 0.0f);
  row[64] = 3e-5f;  // tile 1, below the floor: scale 2^-22, value 3e-5 x 2^22 = 125.8 -> 128
  const EncodedRow encoded = Quantize(row);
  EXPECT_EQ(encoded.scales[1], 105);
  EXPECT_EQ(encoded.data[64], FloatToE4m3(3e-5f * std::ldexp(1.0f, 22)));
  EXPECT_EQ(E4m3ToFloat(encoded.data[64]), 128.0f);
}

TEST(CacheFormatTest, TilesWithAmaxExactlyAPowerOfTwoTimes448) {
  for (int k = -20; k <= 20; ++k) {
    const float amax = std::ldexp(448.0f, k);
    EXPECT_EQ(TileScaleExponent(amax), k) << k;
    EXPECT_EQ(TileScaleExponent(std::nextafter(amax, 1e30f)), k + 1) << k;
    std::vector<float> row(kHeadDim, 0.0f);
    row[0] = -amax;
    const EncodedRow encoded = Quantize(row);
    EXPECT_EQ(encoded.data[0], 0xFE) << k;  // -448 exactly, no saturation needed
    EXPECT_EQ(encoded.scales[0], 127 + k);
  }
}

TEST(CacheFormatTest, E4m3SaturatesAt448) {
  EXPECT_EQ(FloatToE4m3(448.0f), 0x7E);
  EXPECT_EQ(FloatToE4m3(463.9f), 0x7E);
  EXPECT_EQ(FloatToE4m3(464.0f), 0x7E);
  EXPECT_EQ(FloatToE4m3(1e9f), 0x7E);
  EXPECT_EQ(FloatToE4m3(-500.0f), 0xFE);
  EXPECT_EQ(FloatToE4m3(INFINITY), 0x7E);
  EXPECT_EQ(FloatToE4m3(NAN) & 0x7F, 0x7F);
}

TEST(CacheFormatTest, NegativeValuesRoundingToZeroKeepTheSign) {
  EXPECT_EQ(FloatToE4m3(-0.0f), 0x80);
  EXPECT_EQ(FloatToE4m3(-std::ldexp(1.0f, -11)), 0x80);  // below half the smallest subnormal
  EXPECT_EQ(FloatToE4m3(-std::ldexp(1.0f, -10)), 0x80);  // exactly half: ties to even (0)
  EXPECT_EQ(FloatToE4m3(std::ldexp(1.0f, -11)), 0x00);
  EXPECT_EQ(FloatToE4m3(0.0f), 0x00);
}

TEST(CacheFormatTest, E4m3EncodesEveryCodeBackToItself) {
  for (int code = 0; code < 256; ++code) {
    if ((code & 0x7F) == 0x7F) continue;  // NaN
    const float value = E4m3ToFloat(static_cast<uint8_t>(code));
    EXPECT_EQ(FloatToE4m3(value), code) << "code " << code << " value " << value;
  }
  EXPECT_EQ(E4m3ToFloat(0x7E), 448.0f);
  EXPECT_EQ(E4m3ToFloat(0x01), std::ldexp(1.0f, -9));
  EXPECT_EQ(E4m3ToFloat(0x08), std::ldexp(1.0f, -6));
  EXPECT_TRUE(std::isnan(E4m3ToFloat(0xFF)));
}

TEST(CacheFormatTest, E4m3RoundsMidpointsToEven) {
  // Between consecutive codes, the midpoint goes to the even code and any
  // value off the midpoint goes to the nearer one.
  for (int code = 0; code < 0x7E; ++code) {
    const float low = E4m3ToFloat(static_cast<uint8_t>(code));
    const float high = E4m3ToFloat(static_cast<uint8_t>(code + 1));
    const float mid = (low + high) / 2;
    const int even = (code % 2 == 0) ? code : code + 1;
    EXPECT_EQ(FloatToE4m3(mid), even) << "between codes " << code << " and " << code + 1;
    EXPECT_EQ(FloatToE4m3(std::nextafter(mid, 0.0f)), code);
    EXPECT_EQ(FloatToE4m3(std::nextafter(mid, 1e9f)), code + 1);
  }
}

TEST(CacheFormatTest, DequantizeDecodesEveryCodeAndScale) {
  uint8_t data[kTokenDataBytes] = {};
  uint8_t scales[kTokenScaleBytes] = {0, 1, 105, 127, 128, 200, 254, 0};
  for (int code = 0; code < 256; ++code) {
    for (int tile = 0; tile < kNopeTiles; ++tile) data[tile * kQuantTile + code % 64] = code;
    float row[kHeadDim];
    DequantizeRow(data, scales, row);
    for (int tile = 0; tile < kNopeTiles; ++tile) {
      const float expected =
          E4m3ToFloat(static_cast<uint8_t>(code)) * std::ldexp(1.0f, scales[tile] - 127);
      const float got = row[tile * kQuantTile + code % 64];
      if (std::isnan(expected)) {
        EXPECT_TRUE(std::isnan(got)) << "code " << code;
      } else {
        EXPECT_EQ(got, expected) << "code " << code << " scale byte " << int{scales[tile]};
      }
    }
  }
}

TEST(CacheFormatTest, PadByteIsZero) {
  std::vector<float> row(kHeadDim, 7.0f);
  EXPECT_EQ(Quantize(row).scales[7], 0);
}

TEST(CacheFormatTest, MixedMagnitudesRoundTripWithinE4m3Error) {
  std::mt19937 rng(11);
  std::normal_distribution<float> normal(0.0f, 1.0f);
  const float tile_magnitude[kNopeTiles] = {1e-5f, 1e-3f, 0.1f, 1.0f, 30.0f, 1e3f, 2e5f};
  for (int trial = 0; trial < 50; ++trial) {
    std::vector<float> row(kHeadDim);
    for (int d = 0; d < kNopeDim; ++d) row[d] = normal(rng) * tile_magnitude[d / kQuantTile];
    for (int d = kNopeDim; d < kHeadDim; ++d) row[d] = RoundToBf16(normal(rng) * 5);
    const EncodedRow encoded = Quantize(row);
    float decoded[kHeadDim];
    DequantizeRow(encoded.data, encoded.scales, decoded);
    for (int tile = 0; tile < kNopeTiles; ++tile) {
      float amax = 0;
      for (int i = 0; i < kQuantTile; ++i) amax = std::max(amax, std::fabs(row[tile * 64 + i]));
      const int e = TileScaleExponent(amax);
      ASSERT_EQ(encoded.scales[tile], e + 127);
      for (int i = 0; i < kQuantTile; ++i) {
        const int d = tile * kQuantTile + i;
        // Half an ulp of a 3-bit mantissa (2^-4 relative) for normals; half
        // the subnormal step 2^-9 (scaled) below 2^-6.
        const double bound = std::max(std::fabs(row[d]) * std::ldexp(1.0, -4), std::ldexp(1.0, e - 10));
        EXPECT_LE(std::fabs(decoded[d] - row[d]), bound) << "dim " << d;
      }
    }
    for (int d = kNopeDim; d < kHeadDim; ++d) EXPECT_EQ(decoded[d], row[d]) << "RoPE dim " << d;
  }
}

// ---- The vectorised QuantizeRow and DequantizeRow against the scalar
// definition they replaced (commit 4710f01), byte for byte and bit for bit.

void QuantizeRowScalar(const float* row, uint8_t* data, uint8_t* scales) {
  for (int tile = 0; tile < kNopeTiles; ++tile) {
    const float* values = row + tile * kQuantTile;
    float amax = 0.0f;
    for (int i = 0; i < kQuantTile; ++i) amax = std::max(amax, std::fabs(values[i]));
    const int exponent = TileScaleExponent(amax);
    const float inverse_scale = std::ldexp(1.0f, -exponent);
    for (int i = 0; i < kQuantTile; ++i) {
      const float scaled = std::clamp(values[i] * inverse_scale, -kE4m3Max, kE4m3Max);
      data[tile * kQuantTile + i] = FloatToE4m3(scaled);
    }
    scales[tile] = static_cast<uint8_t>(std::clamp(exponent + 127, 0, 255));
  }
  scales[kNopeTiles] = 0;
  for (int i = 0; i < kRopeDim; ++i) {
    const uint16_t bits = FloatToBf16(row[kNopeDim + i]);
    data[kNopeDim + 2 * i] = static_cast<uint8_t>(bits & 0xff);
    data[kNopeDim + 2 * i + 1] = static_cast<uint8_t>(bits >> 8);
  }
}

float DequantizeScalar(uint8_t code, uint8_t scale_byte) {
  const uint32_t magnitude = code & 0x7fu;
  const uint32_t bits = magnitude == 0x7fu ? 0x7fc00000u : (code & 0x80u) << 24 | magnitude << 20;
  const float scale = scale_byte != 0 ? __builtin_bit_cast(float, uint32_t{scale_byte} << 23)
                                      : std::ldexp(1.0f, -127);
  return __builtin_bit_cast(float, bits) * 0x1p120f * scale;
}

void ExpectQuantizedLikeScalar(const float* row, const char* what) {
  EncodedRow got, want;
  std::memset(&got, 0xA5, sizeof(got));
  std::memset(&want, 0x5A, sizeof(want));
  QuantizeRow(row, got.data, got.scales);
  QuantizeRowScalar(row, want.data, want.scales);
  ASSERT_EQ(std::memcmp(got.scales, want.scales, sizeof(got.scales)), 0) << what;
  for (int d = 0; d < kTokenDataBytes; ++d) {
    ASSERT_EQ(got.data[d], want.data[d]) << what << ", byte " << d << ", value "
                                         << row[d < kNopeDim ? d : kNopeDim + (d - kNopeDim) / 2];
  }
}

// Every 509th float bit pattern (and, with MLA_E4M3_EXHAUSTIVE=1, every
// one: a few minutes), each in a tile whose other values set the scale to
// 2^0 (amax 448), to 2^-22 (the amax floor) or from the value itself, so
// that the encoder sees every float the multiply can hand it.
TEST(CacheFormatTest, QuantizeRowMatchesTheScalarDefinition) {
  const char* exhaustive = std::getenv("MLA_E4M3_EXHAUSTIVE");
  const uint64_t stride = exhaustive != nullptr && std::string(exhaustive) == "1" ? 1 : 509;
  float row[kHeadDim];
  std::mt19937 rng(5);
  std::normal_distribution<float> normal(0.0f, 1.0f);
  for (int d = kNopeDim; d < kHeadDim; ++d) row[d] = RoundToBf16(normal(rng));
  const float anchors[] = {448.0f, 0.0f, 1e-30f};
  uint64_t bits = 0;
  while (bits < (uint64_t{1} << 32)) {
    for (int tile = 0; tile < kNopeTiles; ++tile) {
      row[tile * kQuantTile] = anchors[tile % 3];
      for (int i = 1; i < kQuantTile; ++i, bits += stride) {
        row[tile * kQuantTile + i] = __builtin_bit_cast(float, static_cast<uint32_t>(bits));
      }
    }
    ExpectQuantizedLikeScalar(row, "float sweep");
    if (HasFatalFailure()) return;
  }
  // Values at every e4m3 rounding boundary and either side of it.
  for (int code = 0; code < 0x7e; ++code) {
    const float low = E4m3ToFloat(static_cast<uint8_t>(code));
    const float high = E4m3ToFloat(static_cast<uint8_t>(code + 1));
    const float mid = (low + high) / 2;
    const float near[] = {low, mid, std::nextafter(mid, 0.0f), std::nextafter(mid, 1e9f)};
    for (int i = 0; i < kNopeDim; ++i) row[i] = (i % 2 ? -1 : 1) * near[i % 4];
    row[0] = 448.0f;
    ExpectQuantizedLikeScalar(row, "e4m3 boundaries");
  }
  // Random rows of mixed magnitudes, some with NaN and infinities.
  for (int trial = 0; trial < 2000; ++trial) {
    for (int tile = 0; tile < kNopeTiles; ++tile) {
      const float magnitude = std::ldexp(1.0f, static_cast<int>(rng() % 80) - 40);
      for (int i = 0; i < kQuantTile; ++i) row[tile * kQuantTile + i] = normal(rng) * magnitude;
    }
    if (trial % 4 == 1) row[rng() % kNopeDim] = NAN;
    if (trial % 4 == 2) row[rng() % kNopeDim] = (trial % 8 == 2 ? 1 : -1) * INFINITY;
    ExpectQuantizedLikeScalar(row, "random row");
    if (HasFatalFailure()) return;
  }
}

TEST(CacheFormatTest, DequantizeRowMatchesTheScalarDefinitionBitForBit) {
  uint8_t data[kTokenDataBytes];
  uint8_t scales[kTokenScaleBytes] = {};
  for (int d = 0; d < kTokenDataBytes; ++d) data[d] = static_cast<uint8_t>(d * 7);
  for (int scale = 0; scale < 256; ++scale) {
    for (int code = 0; code < 256; ++code) {
      for (int tile = 0; tile < kNopeTiles; ++tile) {
        data[tile * kQuantTile + (code + tile) % kQuantTile] = static_cast<uint8_t>(code);
        scales[tile] = static_cast<uint8_t>((scale + 37 * tile) % 256);
      }
      float row[kHeadDim];
      DequantizeRow(data, scales, row);
      for (int d = 0; d < kNopeDim; ++d) {
        const float want = DequantizeScalar(data[d], scales[d / kQuantTile]);
        ASSERT_EQ(__builtin_bit_cast(uint32_t, row[d]), __builtin_bit_cast(uint32_t, want))
            << "code " << int{data[d]} << " scale byte " << int{scales[d / kQuantTile]};
      }
    }
  }
}

// ---- QuantizeBlock on the decode's 128-value FP8 output blocks (spec
// section 5 applies section 3's rule to them).

// 128 codes and the scale byte of one block, every code poisoned first.
struct EncodedBlock {
  uint8_t codes[kOutputQuantBlock];
  uint8_t scale;
};

EncodedBlock QuantizeOutputBlock(const std::vector<float>& values) {
  EncodedBlock encoded;
  std::memset(encoded.codes, 0xA5, sizeof(encoded.codes));
  encoded.scale = QuantizeBlock(values.data(), kOutputQuantBlock, encoded.codes);
  return encoded;
}

TEST(QuantizeBlockTest, OneScaleForAll128Values) {
  // The largest value sits last: it sets the scale of the first as well.
  std::vector<float> values(kOutputQuantBlock, 1.0f);
  values[127] = 448.0f * 4;  // e = 2
  const EncodedBlock encoded = QuantizeOutputBlock(values);
  EXPECT_EQ(encoded.scale, 129);
  EXPECT_EQ(encoded.codes[0], FloatToE4m3(0.25f));  // 1 / 4 = 2^-2: 0x28
  EXPECT_EQ(encoded.codes[0], 0x28);
  EXPECT_EQ(encoded.codes[127], 0x7E);
}

TEST(QuantizeBlockTest, AmaxExactlyAPowerOfTwoTimes448) {
  for (int k = -20; k <= 20; ++k) {
    std::vector<float> values(kOutputQuantBlock, 0.0f);
    values[64] = -std::ldexp(448.0f, k);
    EncodedBlock encoded = QuantizeOutputBlock(values);
    EXPECT_EQ(encoded.scale, 127 + k) << k;
    EXPECT_EQ(encoded.codes[64], 0xFE) << k;  // -448 exactly, no saturation needed
    values[64] = std::nextafter(std::ldexp(448.0f, k), 1e30f);
    encoded = QuantizeOutputBlock(values);
    EXPECT_EQ(encoded.scale, 128 + k) << k;
    EXPECT_EQ(encoded.codes[64], 0x76) << k;  // just above 224 rounds to 224
  }
}

TEST(QuantizeBlockTest, InfinitySaturatesAndTakesTheLargestScale) {
  std::vector<float> values(kOutputQuantBlock, 1.0f);
  values[3] = -INFINITY;
  const EncodedBlock encoded = QuantizeOutputBlock(values);
  EXPECT_EQ(encoded.scale, 255);  // e = 128 from inf / 448
  EXPECT_EQ(encoded.codes[3], 0xFE);
  EXPECT_EQ(encoded.codes[0], 0x00);  // 1 x 2^-128 rounds to zero
}

TEST(QuantizeBlockTest, NegativeValuesRoundingToZeroKeepTheSign) {
  std::vector<float> values(kOutputQuantBlock, 0.0f);
  values[0] = 1.0f;                      // e = -8
  values[1] = -std::ldexp(1.0f, -20);    // x 256 = -2^-12: below half the subnormal step
  values[2] = -0.0f;
  values[3] = std::ldexp(1.0f, -20);
  const EncodedBlock encoded = QuantizeOutputBlock(values);
  EXPECT_EQ(encoded.scale, 119);
  EXPECT_EQ(encoded.codes[0], 0x78);
  EXPECT_EQ(encoded.codes[1], 0x80);
  EXPECT_EQ(encoded.codes[2], 0x80);
  EXPECT_EQ(encoded.codes[3], 0x00);
  EXPECT_EQ(encoded.codes[4], 0x00);
}

TEST(QuantizeBlockTest, AmaxFloorAppliesToTinyAndZeroBlocks) {
  // An empty key set's output: every value +0, scale 2^-22 (byte 105).
  const EncodedBlock zeros = QuantizeOutputBlock(std::vector<float>(kOutputQuantBlock, 0.0f));
  EXPECT_EQ(zeros.scale, 105);
  for (uint8_t code : zeros.codes) EXPECT_EQ(code, 0x00);
  std::vector<float> tiny(kOutputQuantBlock, 0.0f);
  tiny[100] = 3e-5f;  // below the floor: 3e-5 x 2^22 = 125.8 -> 128
  const EncodedBlock encoded = QuantizeOutputBlock(tiny);
  EXPECT_EQ(encoded.scale, 105);
  EXPECT_EQ(E4m3ToFloat(encoded.codes[100]), 128.0f);
}

TEST(QuantizeBlockTest, MatchesTheScalarDefinitionOnRandomBlocks) {
  std::mt19937 rng(17);
  std::normal_distribution<float> normal(0.0f, 1.0f);
  for (int trial = 0; trial < 3000; ++trial) {
    std::vector<float> values(kOutputQuantBlock);
    const float magnitude = std::ldexp(1.0f, static_cast<int>(rng() % 80) - 40);
    for (float& v : values) v = normal(rng) * magnitude * (rng() % 50 == 0 ? 1e-4f : 1.0f);
    if (trial % 5 == 1) values[rng() % kOutputQuantBlock] = NAN;
    float amax = 0.0f;
    for (float v : values) amax = std::max(amax, std::fabs(v));
    const int exponent = TileScaleExponent(amax);
    const EncodedBlock encoded = QuantizeOutputBlock(values);
    ASSERT_EQ(encoded.scale, std::clamp(exponent + 127, 0, 255)) << "trial " << trial;
    for (int i = 0; i < kOutputQuantBlock; ++i) {
      const float scaled =
          std::clamp(values[i] * std::ldexp(1.0f, -exponent), -kE4m3Max, kE4m3Max);
      ASSERT_EQ(encoded.codes[i], FloatToE4m3(scaled))
          << "trial " << trial << " value " << i << " = " << values[i];
    }
  }
}

TEST(Bf16Test, RoundsToNearestEven) {
  EXPECT_EQ(FloatToBf16(1.0f), 0x3F80);
  EXPECT_EQ(FloatToBf16(1.0f + std::ldexp(1.0f, -8)), 0x3F80);  // tie, even stays
  EXPECT_EQ(FloatToBf16(1.0f + 3 * std::ldexp(1.0f, -8)), 0x3F82);  // tie, rounds to even
  EXPECT_EQ(FloatToBf16(1.0f + std::ldexp(1.0f, -8) + std::ldexp(1.0f, -20)), 0x3F81);
  EXPECT_EQ(FloatToBf16(-2.0f), 0xC000);
  EXPECT_EQ(FloatToBf16(INFINITY), 0x7F80);
  EXPECT_TRUE(std::isnan(Bf16ToFloat(FloatToBf16(NAN))));
  EXPECT_EQ(Bf16ToFloat(0x3FC0), 1.5f);
}

}  // namespace
}  // namespace mla

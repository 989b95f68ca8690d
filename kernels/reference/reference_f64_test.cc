// Tests of the reference's own building blocks (the tolerance rules are
// tested in tolerance_test.cc). The number formats are also held against the
// backends' implementations in kernels/ (bf16.h, fp8_e4m3.h, cache_format.h):
// the two were written apart, with different algorithms, so agreement on many
// inputs is evidence for both.
#include "kernels/reference/reference_f64.h"

#include <cmath>
#include <cstring>
#include <limits>
#include <random>

#include "gtest/gtest.h"
#include "kernels/bf16.h"
#include "kernels/cache_format.h"
#include "kernels/fp8_e4m3.h"

namespace mla {
namespace reference {
namespace {

constexpr double kInf = std::numeric_limits<double>::infinity();

float FloatFromBits(uint32_t bits) {
  float value;
  std::memcpy(&value, &bits, sizeof(value));
  return value;
}

TEST(Bf16Test, RoundsToNearestEven) {
  EXPECT_EQ(RoundToBf16(1.0), 0x3f80);
  EXPECT_EQ(RoundToBf16(-2.0), 0xc000);
  EXPECT_EQ(RoundToBf16(1.0 + std::ldexp(1.0, -8)), 0x3f80);      // tie, down to even
  EXPECT_EQ(RoundToBf16(1.0 + 3 * std::ldexp(1.0, -8)), 0x3f82);  // tie, up to even
  EXPECT_EQ(RoundToBf16(1.0 + std::ldexp(1.0, -8) + 1e-12), 0x3f81);
  EXPECT_EQ(RoundToBf16(2.0 - std::ldexp(1.0, -9)), 0x4000);  // carries into the exponent
  EXPECT_EQ(RoundToBf16(std::ldexp(1.0, -133)), 0x0001);      // smallest subnormal
  EXPECT_EQ(RoundToBf16(std::ldexp(1.0, -134)), 0x0000);      // tie with zero, to even
  EXPECT_EQ(RoundToBf16(-std::ldexp(1.0, -140)), 0x8000);
  EXPECT_EQ(RoundToBf16(3.39e38), 0x7f7f);
  EXPECT_EQ(RoundToBf16(3.4e38), 0x7f80);  // beyond max + half an ulp
  EXPECT_EQ(RoundToBf16(-kInf), 0xff80);
  EXPECT_TRUE(std::isnan(Bf16Value(RoundToBf16(std::nan("")))));
}

TEST(Bf16Test, EveryFinitePatternRoundTrips) {
  for (int bits = 0; bits < 0x10000; ++bits) {
    const double value = Bf16Value(static_cast<uint16_t>(bits));
    if (std::isnan(value)) continue;
    EXPECT_EQ(RoundToBf16(value), bits) << std::hex << bits;
    EXPECT_EQ(value, static_cast<double>(Bf16ToFloat(static_cast<uint16_t>(bits))));
  }
}

TEST(Bf16Test, AgreesWithTheBackendConversionOnFloats) {
  std::mt19937 rng(7);
  for (int i = 0; i < 2000000; ++i) {
    const float value = FloatFromBits(static_cast<uint32_t>(rng()));
    if (std::isnan(value)) continue;
    ASSERT_EQ(RoundToBf16(value), FloatToBf16(value)) << value;
  }
}

TEST(E4m3Test, EncodesTheSpecialCases) {
  EXPECT_EQ(EncodeE4m3(1.0), 0x38);
  EXPECT_EQ(EncodeE4m3(1.0625), 0x38);  // tie between 0x38 and 0x39, to even
  EXPECT_EQ(EncodeE4m3(1.1875), 0x3a);  // tie between 0x39 and 0x3a, to even
  EXPECT_EQ(EncodeE4m3(448.0), 0x7e);
  EXPECT_EQ(EncodeE4m3(464.0), 0x7e);  // saturates rather than rounding to NaN
  EXPECT_EQ(EncodeE4m3(1e9), 0x7e);
  EXPECT_EQ(EncodeE4m3(-1e9), 0xfe);
  EXPECT_EQ(EncodeE4m3(std::ldexp(1.0, -10)), 0x00);  // tie with zero, to even
  EXPECT_EQ(EncodeE4m3(std::ldexp(3.0, -10)), 0x02);  // subnormal tie, to even
  EXPECT_EQ(EncodeE4m3(-1e-9), 0x80);                 // negative zero keeps its sign
  EXPECT_EQ(EncodeE4m3(std::nan("")), 0x7f);
  EXPECT_TRUE(std::isnan(E4m3Value(0x7f)));
  EXPECT_TRUE(std::isnan(E4m3Value(0xff)));
  EXPECT_EQ(E4m3Value(0x01), std::ldexp(1.0, -9));
  EXPECT_EQ(E4m3Value(0x08), std::ldexp(1.0, -6));
  EXPECT_EQ(E4m3Value(0xfe), -448.0);
}

TEST(E4m3Test, EveryFiniteCodeRoundTripsAndMatchesTheBackend) {
  for (int code = 0; code < 256; ++code) {
    if ((code & 0x7f) == 0x7f) continue;
    const double value = E4m3Value(static_cast<uint8_t>(code));
    EXPECT_EQ(EncodeE4m3(value), code);
    EXPECT_EQ(value, static_cast<double>(E4m3ToFloat(static_cast<uint8_t>(code))));
  }
}

TEST(E4m3Test, AgreesWithTheBackendEncoderOnFloats) {
  std::mt19937 rng(11);
  std::uniform_real_distribution<float> exponent(-14.0f, 9.5f);
  std::uniform_int_distribution<int> sign(0, 1);
  for (int i = 0; i < 2000000; ++i) {
    const float value = (sign(rng) ? -1.0f : 1.0f) * std::exp2(exponent(rng));
    ASSERT_EQ(EncodeE4m3(value), FloatToE4m3(value)) << value;
  }
}

TEST(ScaleTest, IsTheSmallestPowerOfTwoCoveringTheTile) {
  EXPECT_EQ(ScaleExponent(448.0), 0);
  EXPECT_EQ(ScaleExponent(std::nextafter(448.0, kInf)), 1);
  EXPECT_EQ(ScaleExponent(224.0), -1);
  EXPECT_EQ(ScaleExponent(1.0), -8);
  EXPECT_EQ(ScaleExponent(0.0), -22);  // the 1e-4 floor
  EXPECT_EQ(ScaleExponent(1e-4), -22);
  for (int bits = 1; bits < 0x7f80; ++bits) {
    const double amax = Bf16Value(static_cast<uint16_t>(bits));
    ASSERT_EQ(ScaleExponent(amax), TileScaleExponent(static_cast<float>(amax))) << amax;
  }
}

TEST(LayoutTest, OffsetsFollowTheSpec) {
  EXPECT_EQ(DataOffset(0), 0);
  EXPECT_EQ(ScaleOffset(0), 64 * 576);
  EXPECT_EQ(DataOffset(63), 63 * 576);
  EXPECT_EQ(ScaleOffset(63), 64 * 576 + 63 * 8);
  EXPECT_EQ(DataOffset(65), 37440 + 576);
  EXPECT_EQ(ScaleOffset(65), 37440 + 64 * 576 + 8);
  EXPECT_EQ(PoolSlots(2 * 37440), 128);
  EXPECT_EQ(PoolSlots(2 * 37440 - 1), 64);
  for (int64_t slot : {0, 1, 63, 64, 1000, 123457}) {
    EXPECT_EQ(DataOffset(slot), SlotDataOffset(slot));
    EXPECT_EQ(ScaleOffset(slot), SlotScaleOffset(slot));
  }
}

TEST(KvRowTest, RoundTripsThroughThePool) {
  const RopeTable table(RopeKind::kYarn, 100);
  std::mt19937 rng(3);
  std::normal_distribution<double> normal;
  std::vector<uint16_t> row(kHeadDim);
  for (int d = 0; d < kHeadDim; ++d) {
    row[d] = RoundToBf16(normal(rng) * std::ldexp(1.0, d / kQuantTile - 4));
  }
  absl::StatusOr<KvRowReference> kv = ReferenceKvRow(row, 77, table);
  ASSERT_TRUE(kv.ok()) << kv.status();
  std::vector<uint8_t> pool(2 * kBlockBytes, 0);
  ASSERT_TRUE(WriteCacheRow(*kv, 100, absl::MakeSpan(pool)).ok());
  EXPECT_FALSE(WriteCacheRow(*kv, 128, absl::MakeSpan(pool)).ok());
  absl::StatusOr<std::array<double, kHeadDim>> back = DequantizeSlot(pool, 100);
  ASSERT_TRUE(back.ok()) << back.status();
  for (int d = 0; d < kHeadDim; ++d) {
    // e4m3 keeps 4 significant bits, and its subnormals steps of 2^-9 of
    // the scale; the RoPE dims come back exactly.
    const double allowed = d < kNopeDim ? std::fabs(kv->rounded[d]) / 16 +
                                              std::ldexp(1.0, kv->scales[d / kQuantTile] - 127 - 10)
                                        : 0.0;
    EXPECT_LE(std::fabs((*back)[d] - kv->rounded[d]), allowed) << d;
  }
  EXPECT_EQ(kv->scales[kNopeTiles], 0);
  EXPECT_FALSE(DequantizeSlot(pool, 128).ok());
  EXPECT_FALSE(ReferenceKvRow(row, 100, table).ok());
}

}  // namespace
}  // namespace reference
}  // namespace mla

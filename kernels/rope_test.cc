#include "kernels/rope.h"

#include <cmath>
#include <random>

#include "gtest/gtest.h"

namespace mla {
namespace {

TEST(RopeTest, YarnCorrectionRangeForTheta160000) {
  const YarnRange range = YarnCorrectionRange(SettingsOf(RopeKind::kYarn));
  EXPECT_EQ(range.low, 15);
  EXPECT_EQ(range.high, 25);
}

TEST(RopeTest, FormulaInFloat64LandsOnEveryPinnedFrequency) {
  for (RopeKind kind : {RopeKind::kPlain, RopeKind::kYarn}) {
    for (int i = 0; i < kRopePairs; ++i) {
      const double formula = FormulaFrequency(SettingsOf(kind), i);
      const double pinned = PinnedFrequency(kind, i);
      EXPECT_LE(std::fabs(formula - pinned), 1e-6 * pinned)
          << RopeKindName(kind) << " pair " << i << ": formula " << formula << " pinned " << pinned;
    }
  }
}

TEST(RopeTest, YarnInterpolatesOnlyTheSlowPairs) {
  // Below the correction range YaRN leaves frequencies alone; above it they
  // are divided by the factor 16.
  const RopeSettings& yarn = SettingsOf(RopeKind::kYarn);
  for (int i : {0, 5, 15}) {
    EXPECT_DOUBLE_EQ(FormulaFrequency(yarn, i), std::pow(160000.0, -2.0 * i / 64));
  }
  for (int i : {25, 31}) {
    EXPECT_DOUBLE_EQ(FormulaFrequency(yarn, i), std::pow(160000.0, -2.0 * i / 64) / 16);
  }
}

TEST(RopeTest, TableRowsMatchTheClosedForm) {
  const int64_t positions[] = {0, 1, 2, 127, 1000, 65535, 65536, 300001, 1048575};
  for (RopeKind kind : {RopeKind::kPlain, RopeKind::kYarn}) {
    for (int64_t p : positions) {
      float row[kRopeDim];
      ComputeRopeRow(kind, p, row);
      for (int i = 0; i < kRopePairs; ++i) {
        const double f = PinnedFrequency(kind, i);
        const double exact_angle = static_cast<double>(p) * f;
        // The table's angle is one float32 multiply: within half an ulp of
        // the exact product, which moves cos and sin by at most that much.
        const double slack = std::ldexp(std::fabs(exact_angle), -24) + 1e-7;
        EXPECT_NEAR(row[i], std::cos(exact_angle), slack) << "cos p=" << p << " i=" << i;
        EXPECT_NEAR(row[kRopePairs + i], std::sin(exact_angle), slack) << "sin p=" << p << " i=" << i;
      }
    }
  }
}

TEST(RopeTest, AngleIsOneFloat32Multiply) {
  // At a long position the float32 angle differs from the exact one by far
  // more than float rounding of cos: the table must follow the float32 angle.
  const int64_t p = 1000003;
  float row[kRopeDim];
  ComputeRopeRow(RopeKind::kPlain, p, row);
  for (int i = 0; i < kRopePairs; ++i) {
    const float angle = static_cast<float>(p) * PinnedFrequency(RopeKind::kPlain, i);
    EXPECT_EQ(row[i], static_cast<float>(std::cos(static_cast<double>(angle))));
    EXPECT_EQ(row[kRopePairs + i], static_cast<float>(std::sin(static_cast<double>(angle))));
  }
}

TEST(RopeTest, TableHoldsRowsByPosition) {
  const RopeTable table(RopeKind::kYarn, 300);
  EXPECT_EQ(table.num_positions(), 300);
  EXPECT_EQ(table.bytes(), 300 * 64 * 4);
  float row[kRopeDim];
  ComputeRopeRow(RopeKind::kYarn, 299, row);
  for (int d = 0; d < kRopeDim; ++d) EXPECT_EQ(table.row(299)[d], row[d]);
  EXPECT_EQ(table.row(0)[0], 1.0f);
  EXPECT_EQ(table.row(0)[kRopePairs], 0.0f);
}

TEST(RopeTest, ApplyRopeRotatesInterleavedPairsAndInverseUndoesIt) {
  std::mt19937 rng(7);
  std::normal_distribution<float> normal(0.0f, 3.0f);
  float row[kRopeDim];
  ComputeRopeRow(RopeKind::kYarn, 4321, row);
  float x[kRopeDim], y[kRopeDim];
  for (float& v : x) v = normal(rng);
  std::copy(x, x + kRopeDim, y);
  ApplyRope(row, /*inverse=*/false, y);
  for (int i = 0; i < kRopePairs; ++i) {
    const double c = row[i], s = row[kRopePairs + i];
    EXPECT_NEAR(y[2 * i], x[2 * i] * c - x[2 * i + 1] * s, 1e-5);
    EXPECT_NEAR(y[2 * i + 1], x[2 * i] * s + x[2 * i + 1] * c, 1e-5);
  }
  ApplyRope(row, /*inverse=*/true, y);
  for (int d = 0; d < kRopeDim; ++d) EXPECT_NEAR(y[d], x[d], 1e-5);
}

}  // namespace
}  // namespace mla

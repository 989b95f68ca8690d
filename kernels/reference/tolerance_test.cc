// Tests of the section 7 rules and comparators (tolerance.h), the composition
// clause among them: a correct backend whose q_out rounded a tie the other
// way passes once the check widens by the clause, while real errors (a wrong
// key, a missing sink) still fail; an lse in the thousands passes by the
// relative term. The FP8 output's comparator passes the reference quantised
// exactly and fails on a flipped sign or exponent bit, a scale one off, NaN
// codes, poison and an empty key set's bytes other than the spec's.
#include "kernels/reference/tolerance.h"

#include <algorithm>
#include <cmath>
#include <limits>
#include <random>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "gtest/gtest.h"
#include "kernels/geometry.h"
#include "kernels/reference/reference_f64.h"
#include "kernels/rope.h"

namespace mla {
namespace reference {
namespace {

constexpr double kInf = std::numeric_limits<double>::infinity();
constexpr double kSoftmaxScale = 0.04419417382415922;  // 512^-0.5

// A pool whose slots 0..K-1 hold `rows` ([K, 512] bf16) inserted at position
// 0 (RoPE is the identity there).
std::vector<uint8_t> PoolOf(const std::vector<uint16_t>& rows) {
  static const RopeTable* table = new RopeTable(RopeKind::kPlain, 1);
  const int64_t count = static_cast<int64_t>(rows.size()) / kHeadDim;
  std::vector<uint8_t> pool((count + kBlockTokens - 1) / kBlockTokens * kBlockBytes, 0);
  for (int64_t k = 0; k < count; ++k) {
    absl::StatusOr<KvRowReference> kv =
        ReferenceKvRow(absl::MakeConstSpan(rows).subspan(k * kHeadDim, kHeadDim), 0, *table);
    EXPECT_TRUE(kv.ok()) << kv.status();
    if (kv.ok()) EXPECT_TRUE(WriteCacheRow(*kv, k, absl::MakeSpan(pool)).ok());
  }
  return pool;
}

// A decode of one token over the keys `indices` of `pool`, no sink.
DecodeInputs OneToken(int heads, int padded_heads, absl::Span<const uint16_t> q,
                      absl::Span<const int32_t> indices, absl::Span<const uint8_t> pool) {
  DecodeInputs inputs;
  inputs.num_tokens = 1;
  inputs.num_heads = heads;
  inputs.padded_heads = padded_heads;
  inputs.q = q;
  inputs.softmax_scale = kSoftmaxScale;
  inputs.main = {static_cast<int>(indices.size()), indices, {}, pool};
  return inputs;
}

TEST(ToleranceTest, QueryRuleAllowsOneUlpOrTheRopeClause) {
  EXPECT_EQ(QueryOutExcess(0x3f80, 1.0, 0.0), 0.0);
  EXPECT_EQ(QueryOutExcess(0x3f81, 1.0, 0.0), 1.0);
  EXPECT_GT(QueryOutExcess(0x3f82, 1.0, 0.0), 1.0);
  EXPECT_EQ(QueryOutExcess(0x0000, -std::ldexp(1.0, -133), 0.0), 1.0);  // across zero
  // 2^-20 vs 2^-24: many ulps apart, but within 2^-16 * (|a| + |b|) = 2^-16.
  EXPECT_LE(QueryOutExcess(RoundToBf16(std::ldexp(1.0, -20)), std::ldexp(1.0, -24), 1.0), 1.0);
  EXPECT_GT(QueryOutExcess(RoundToBf16(std::ldexp(1.0, -14)), std::ldexp(1.0, -24), 1.0), 1.0);
  EXPECT_EQ(QueryOutExcess(0x7fc0, 1.0, 1.0), kInf);
  EXPECT_EQ(QueryOutExcess(0x3f80, std::nan(""), 1.0), kInf);
  EXPECT_EQ(QueryOutExcess(0x7f80, 3.39e38, 1.0), kInf);
}

TEST(ToleranceTest, DecodeAndLseRules) {
  EXPECT_LE(DecodeOutExcess(1.0 + 0.0119, 1.0, 1.0), 1.0);  // 2e-3 + 1e-2 * 1
  EXPECT_GT(DecodeOutExcess(1.0 + 0.0121, 1.0, 1.0), 1.0);
  EXPECT_LE(DecodeOutExcess(0.019, 0.0, 10.0), 1.0);  // 2e-3 * A_t
  EXPECT_GT(DecodeOutExcess(0.021, 0.0, 10.0), 1.0);
  EXPECT_EQ(DecodeOutExcess(std::nan(""), 0.0, 1.0), kInf);
  EXPECT_LE(LseExcess(2.0009, 2.0), 1.0);
  EXPECT_GT(LseExcess(2.0011, 2.0), 1.0);
  // At |lse| in the thousands the relative term dominates: 1e-3 + 2e-6 * 3000.
  EXPECT_LE(LseExcess(3000.0069, 3000.0), 1.0);
  EXPECT_GT(LseExcess(3000.0071, 3000.0), 1.0);
  EXPECT_LE(LseExcess(-3000.0069, -3000.0), 1.0);
  EXPECT_GT(LseExcess(-2999.9929, -3000.0), 1.0);
  EXPECT_EQ(LseExcess(kInf, kInf), 0.0);
  EXPECT_EQ(LseExcess(1e30, kInf), kInf);
  EXPECT_EQ(LseExcess(kInf, 3.0), kInf);
  EXPECT_EQ(LseExcess(std::nan(""), 3.0), kInf);
}

TEST(ToleranceTest, ReportKeepsTheFirstAndTheWorstFailure) {
  ComparisonReport report("thing");
  report.Check(0.5, [] { return std::string("a"); });
  EXPECT_TRUE(report.ok());
  EXPECT_TRUE(report.ToStatus().ok());
  EXPECT_EQ(report.max_excess(), 0.5);
  report.Check(2.0, [] { return std::string("b"); });
  report.Check(std::nan(""), [] { return std::string("c"); });
  report.Check(3.0, [] { return std::string("d"); });
  EXPECT_FALSE(report.ok());
  EXPECT_EQ(report.checked(), 4);
  EXPECT_EQ(report.failed(), 3);
  EXPECT_EQ(report.first_failure(), "b (excess 2)");
  EXPECT_EQ(report.worst_failure(), "c (excess inf)");
  EXPECT_EQ(report.ToStatus().code(), absl::StatusCode::kInternal);
  EXPECT_NE(report.ToString().find("3 of 4"), std::string::npos) << report.ToString();
}

TEST(ToleranceTest, QueryComparatorNamesTheElementAndChecksPadding) {
  const RopeTable table(RopeKind::kPlain, 10);
  std::vector<uint16_t> q(2 * kHeadDim);
  for (int i = 0; i < 2 * kHeadDim; ++i) q[i] = RoundToBf16(std::sin(i + 1.0));
  absl::StatusOr<QueryReference> expected = ReferenceQuery(q, {3}, 2, 8, 1e-6, table);
  ASSERT_TRUE(expected.ok()) << expected.status();
  std::vector<uint16_t> q_out(8 * kHeadDim, 0);
  for (int i = 0; i < 2 * kHeadDim; ++i) q_out[i] = RoundToBf16(expected->values[i]);
  EXPECT_TRUE(CompareQueryOut(q_out, *expected).ok());

  q_out[kHeadDim + 5] ^= 0x0002;     // two ulps off
  q_out[7 * kHeadDim + 9] = 0x8000;  // -0 in a padding head
  const ComparisonReport report = CompareQueryOut(q_out, *expected);
  EXPECT_EQ(report.failed(), 2);
  EXPECT_EQ(report.first_failure().rfind("token 0 head 1 dim 5:", 0), 0) << report.ToString();
  EXPECT_EQ(report.worst_failure().rfind("token 0 head 7 (padding) dim 9:", 0), 0)
      << report.ToString();
  q_out.pop_back();
  EXPECT_FALSE(CompareQueryOut(q_out, *expected).ok());
}

TEST(Bf16UlpTest, IsTheStepToTheNextLargerMagnitude) {
  EXPECT_EQ(Bf16Ulp(0x3f80), std::ldexp(1.0, -7));  // 1
  EXPECT_EQ(Bf16Ulp(0xbf80), std::ldexp(1.0, -7));  // -1
  EXPECT_EQ(Bf16Ulp(0x3f7f), std::ldexp(1.0, -8));  // just below 1
  EXPECT_EQ(Bf16Ulp(0x0000), std::ldexp(1.0, -133));
  EXPECT_EQ(Bf16Ulp(0x7f7f), std::ldexp(1.0, 120));  // the largest finite
  EXPECT_EQ(Bf16Ulp(0x7f80), 0.0);
  EXPECT_EQ(Bf16Ulp(0x7fc0), 0.0);
}

TEST(TieQuerySlackTest, CountsValuesWithinTwoToTheMinus20OfAMidpoint) {
  const double midpoint = 12.03125;  // between bf16 12 and 12.0625
  const double window = std::ldexp(1.0, -20);
  QueryReference q;
  q.values = {midpoint,
              midpoint * (1 + window / 2),
              -midpoint * (1 - window / 2),
              midpoint * (1 + 2 * window),
              12.0,
              2.0 - std::ldexp(1.0, -8),  // between 2 - 2^-7 and 2
              0.0,
              std::nan("")};
  const std::vector<double> slack = TieQuerySlack(q);
  ASSERT_EQ(slack.size(), q.values.size());
  EXPECT_EQ(slack[0], 0.0625);
  EXPECT_EQ(slack[1], 0.0625);
  EXPECT_EQ(slack[2], 0.0625);
  EXPECT_EQ(slack[3], 0.0);                  // 2^-19 relative off the midpoint
  EXPECT_EQ(slack[4], 0.0);                  // a bf16 value itself
  EXPECT_EQ(slack[5], std::ldexp(1.0, -6));  // the ulp of 2, the larger side
  EXPECT_EQ(slack[6], 0.0);
  EXPECT_EQ(slack[7], 0.0);
}

TEST(DifferingQuerySlackTest, CountsElementsWhoseValuesDiffer) {
  const std::vector<uint16_t> a = {0x4140, 0x3f80, 0x0000, 0xbf80};
  const std::vector<uint16_t> b = {0x4141, 0x3f80, 0x8000, 0xbf7f};
  absl::StatusOr<std::vector<double>> slack = DifferingQuerySlack(a, b);
  ASSERT_TRUE(slack.ok()) << slack.status();
  EXPECT_EQ(*slack, (std::vector<double>{0.0625, 0.0, 0.0, std::ldexp(1.0, -7)}));
  EXPECT_FALSE(DifferingQuerySlack(a, absl::MakeConstSpan(b).first(3)).ok());
}

TEST(CompositionRuleTest, WidensLseByDeltaAndOutByTwiceDeltaTimesAt) {
  EXPECT_GT(LseExcess(2.004, 2.0), 1.0);
  EXPECT_LE(LseExcess(2.004, 2.0, 0.003), 1.0);  // 1e-3 + 4e-6 + 3e-3
  EXPECT_GT(LseExcess(2.0045, 2.0, 0.003), 1.0);
  EXPECT_EQ(LseExcess(kInf, 2.0, 0.5), kInf);
  EXPECT_GT(DecodeOutExcess(0.05, 0.0, 10.0), 1.0);
  EXPECT_LE(DecodeOutExcess(0.05, 0.0, 10.0, 0.0016),
            1.0);  // 2e-3 * 10 + 2 * 1.6e-3 * 10
  EXPECT_GT(DecodeOutExcess(0.055, 0.0, 10.0, 0.0016), 1.0);
  EXPECT_EQ(DecodeOutExcess(std::nan(""), 0.0, 10.0, 1.0), kInf);
}

// One token, two heads (padded to 8) over kKeys random cache rows. Head 0
// looks for key kDominant (its softmax is nearly one-hot, lse about 70) and
// its element kTieDim lies exactly on the bf16 midpoint between 12 and
// 12.0625, where that key holds about 2: one ulp of q there moves lse by
// about 5e-3, five times the plain allowance. Head 1 attends broadly and its
// sink matters (lse about 4, sink 3.5).
class CompositionTest : public ::testing::Test {
 protected:
  static constexpr int kKeys = 40;
  static constexpr int kHeads = 2;
  static constexpr int kPadded = 8;
  static constexpr int kDominant = 7;
  static constexpr int kTieDim = 100;
  static constexpr double kTie = 12.03125;

  // A server's answer, rounded as it would send it.
  struct Answer {
    std::vector<uint16_t> out;
    std::vector<float> lse;
  };

  CompositionTest() {
    std::mt19937_64 rng(2026);
    std::normal_distribution<double> normal;
    auto nonzero = [&] {
      uint16_t bits;
      do {
        bits = RoundToBf16(normal(rng));
      } while ((bits & 0x7fff) == 0);
      return bits;
    };
    std::vector<uint16_t> rows(kKeys * kHeadDim);
    for (uint16_t& value : rows) value = nonzero();
    rows[kDominant * kHeadDim + kTieDim] = RoundToBf16(2.0);
    pool_ = PoolOf(rows);
    for (int k = 0; k < kKeys; ++k) indices_.push_back(k);
    absl::StatusOr<std::array<double, kHeadDim>> dominant = DequantizeSlot(pool_, kDominant);
    EXPECT_TRUE(dominant.ok()) << dominant.status();

    query_.num_tokens = 1;
    query_.num_heads = kHeads;
    query_.padded_heads = kPadded;
    query_.values.assign(kPadded * kHeadDim, 0.0);
    query_.pair_magnitudes.assign(kPadded * kRopePairs, 0.0);
    for (int d = 0; d < kHeadDim; ++d) {
      query_.values[d] = 3.0 * (*dominant)[d] + 0.3 * normal(rng);
      query_.values[kHeadDim + d] = Bf16Value(nonzero());
    }
    query_.values[kTieDim] = kTie;
    for (int i = 0; i < kHeads * kHeadDim; ++i) mine_.push_back(RoundToBf16(query_.values[i]));
    mine_.resize(kPadded * kHeadDim, 0);
    theirs_ = mine_;
    EXPECT_EQ(mine_[kTieDim], 0x4140);  // 12: the tie went to even
    theirs_[kTieDim] = 0x4141;          // 12.0625: the other backend's float32 landed above it
  }

  DecodeReference Decode(absl::Span<const uint16_t> q, absl::Span<const int32_t> indices,
                         absl::Span<const float> sinks, absl::Span<const double> q_slack) {
    DecodeInputs inputs = OneToken(kHeads, kPadded, q, indices, pool_);
    inputs.sinks = sinks;
    inputs.q_slack = q_slack;
    absl::StatusOr<DecodeReference> reference = ReferenceDecode(inputs);
    EXPECT_TRUE(reference.ok()) << reference.status();
    return reference.ok() ? *std::move(reference) : DecodeReference();
  }

  // What a correct server answers from the other backend's q_out, `theirs_`.
  Answer Server(absl::Span<const int32_t> indices, absl::Span<const float> sinks) {
    const DecodeReference exact = Decode(theirs_, indices, sinks, {});
    Answer answer;
    for (double value : exact.out) answer.out.push_back(RoundToBf16(value));
    for (double value : exact.lse) answer.lse.push_back(static_cast<float>(value));
    return answer;
  }

  // The checker's reference: its own q_out, widened by the tie it sees.
  DecodeReference Composed() { return Decode(mine_, indices_, sinks_, TieQuerySlack(query_)); }

  std::vector<uint8_t> pool_;
  std::vector<int32_t> indices_;
  const std::vector<float> sinks_ = {2.0f, 3.5f};
  QueryReference query_;        // the float64 q_out, before rounding
  std::vector<uint16_t> mine_;  // [Hp, 512]: the checker's q_out
  std::vector<uint16_t> theirs_;
};

TEST_F(CompositionTest, ATieRoundedTheOtherWayFailsThePlainClause) {
  const DecodeReference plain = Decode(mine_, indices_, sinks_, {});
  const Answer server = Server(indices_, sinks_);
  EXPECT_GT(plain.lse[0], 60.0);
  EXPECT_GT(std::fabs(server.lse[0] - plain.lse[0]), 3 * (1e-3 + 2e-6 * plain.lse[0]));
  EXPECT_FALSE(CompareLse(server.lse, plain).ok());
}

TEST_F(CompositionTest, ATieRoundedTheOtherWayPassesTheCompositionClause) {
  const Answer server = Server(indices_, sinks_);
  const std::vector<double> slack = TieQuerySlack(query_);
  EXPECT_EQ(slack[kTieDim], 0.0625);
  for (int i = kHeads * kHeadDim; i < kPadded * kHeadDim; ++i) ASSERT_EQ(slack[i], 0.0) << i;

  const DecodeReference composed = Composed();
  EXPECT_GT(composed.composition_deltas[0], 3e-3);
  const ComparisonReport lse = CompareLse(server.lse, composed);
  EXPECT_TRUE(lse.ok()) << lse.ToString();
  const ComparisonReport out = CompareDecodeOut(server.out, composed);
  EXPECT_TRUE(out.ok()) << out.ToString();

  // Both sides known: only the tie differs, so delta is scale * ulp * the
  // largest |K_j,e| at that element.
  absl::StatusOr<std::vector<double>> differing = DifferingQuerySlack(mine_, theirs_);
  ASSERT_TRUE(differing.ok()) << differing.status();
  const DecodeReference both = Decode(mine_, indices_, sinks_, *differing);
  double widest = 0.0;
  for (int k = 0; k < kKeys; ++k)
    widest = std::max(widest, std::fabs((*DequantizeSlot(pool_, k))[kTieDim]));
  EXPECT_DOUBLE_EQ(both.composition_deltas[0], kSoftmaxScale * 0.0625 * widest);
  EXPECT_EQ(both.composition_deltas[1], 0.0);
  EXPECT_TRUE(CompareLse(server.lse, both).ok());
  EXPECT_TRUE(CompareDecodeOut(server.out, both).ok());
}

TEST_F(CompositionTest, AWrongKeyStillFails) {
  const DecodeReference composed = Composed();
  // Head 0's own key: far outside.
  std::vector<int32_t> swapped = indices_;
  swapped[kDominant] = kDominant + 1;  // key 8 listed twice, key 7 never
  Answer server = Server(swapped, sinks_);
  EXPECT_FALSE(CompareLse(server.lse, composed).ok());
  EXPECT_FALSE(CompareDecodeOut(server.out, composed).ok());
  // One of the 40 keys of head 1's broad softmax: still outside, and only
  // there (head 0 hardly sees it).
  swapped = indices_;
  swapped[20] = 21;
  server = Server(swapped, sinks_);
  const ComparisonReport lse = CompareLse(server.lse, composed);
  EXPECT_EQ(lse.failed(), 1) << lse.ToString();
  EXPECT_EQ(lse.first_failure().rfind("token 0 head 1:", 0), 0) << lse.ToString();
  const ComparisonReport out = CompareDecodeOut(server.out, composed);
  EXPECT_FALSE(out.ok());
  EXPECT_EQ(out.first_failure().rfind("token 0 head 1 ", 0), 0) << out.ToString();
}

TEST_F(CompositionTest, AMissingSinkStillFails) {
  const Answer server = Server(indices_, {});
  const DecodeReference composed = Composed();
  const ComparisonReport out = CompareDecodeOut(server.out, composed);
  EXPECT_FALSE(out.ok());
  EXPECT_EQ(out.first_failure().rfind("token 0 head 1 ", 0), 0) << out.ToString();
  EXPECT_TRUE(CompareLse(server.lse, composed).ok());  // lse excludes the sink
}

TEST_F(CompositionTest, ASlackOfTheWrongSizeIsAnError) {
  DecodeInputs inputs = OneToken(kHeads, kPadded, mine_, indices_, pool_);
  const std::vector<double> slack(kHeadDim, 0.0);
  inputs.q_slack = slack;
  EXPECT_FALSE(ReferenceDecode(inputs).ok());
}

// Keys of size about 8 and a query of twice one of them: lse about 2900,
// where float32 keeps 2.4e-4 and the relative term allows 6.8e-3 in all.
TEST(LargeLseTest, PassesWithinTheRelativeTerm) {
  std::mt19937_64 rng(7);
  std::normal_distribution<double> normal;
  std::vector<uint16_t> rows(4 * kHeadDim);
  for (uint16_t& value : rows) value = RoundToBf16(8.0 * normal(rng) + 0.01);
  const std::vector<uint8_t> pool = PoolOf(rows);
  absl::StatusOr<std::array<double, kHeadDim>> key = DequantizeSlot(pool, 2);
  ASSERT_TRUE(key.ok()) << key.status();
  std::vector<uint16_t> q(8 * kHeadDim, 0);
  for (int d = 0; d < kHeadDim; ++d) q[d] = RoundToBf16(2.0 * (*key)[d]);
  const std::vector<int32_t> indices = {0, 1, 2, 3};
  absl::StatusOr<DecodeReference> expected = ReferenceDecode(OneToken(1, 8, q, indices, pool));
  ASSERT_TRUE(expected.ok()) << expected.status();
  ASSERT_GT(expected->lse[0], 2000.0);

  const std::vector<float> off = {static_cast<float>(expected->lse[0] + 4e-3)};
  const ComparisonReport report = CompareLse(off, *expected);
  EXPECT_TRUE(report.ok()) << report.ToString();
  const std::vector<float> too_far = {static_cast<float>(expected->lse[0] - 8e-3)};
  EXPECT_FALSE(CompareLse(too_far, *expected).ok());
}

// ---- The FP8 output (spec sections 5 and 7).

TEST(Fp8RuleTest, WidensTheDecodeClauseByE4m3Rounding) {
  // ref 1, A_t 1, s 2^-8: 1.0625 * (2e-3 + 1e-2) + 2^-4 + 2^-18 = 0.0752538.
  const double s = std::ldexp(1.0, -8);
  EXPECT_LE(Fp8OutExcess(1.0752, 1.0, 1.0, s), 1.0);
  EXPECT_GT(Fp8OutExcess(1.0753, 1.0, 1.0, s), 1.0);
  EXPECT_LE(Fp8OutExcess(0.9248, 1.0, 1.0, s), 1.0);
  EXPECT_GT(Fp8OutExcess(0.9247, 1.0, 1.0, s), 1.0);
  // The next e4m3 value above 1 (1.125) is past it: a wrong code fails.
  EXPECT_GT(Fp8OutExcess(1.125, 1.0, 1.0, s), 1.0);
  // ref 0, A_t 1, s 1: 1.0625 * 2e-3 + 2^-10 = 0.003102, the subnormal term.
  EXPECT_LE(Fp8OutExcess(0.0031, 0.0, 1.0, 1.0), 1.0);
  EXPECT_GT(Fp8OutExcess(0.0032, 0.0, 1.0, 1.0), 1.0);
  // The composition clause widens B: + 1.0625 * 2 * delta * A_t.
  EXPECT_GT(Fp8OutExcess(0.0041, 0.0, 1.0, 1.0), 1.0);
  EXPECT_LE(Fp8OutExcess(0.0041, 0.0, 1.0, 1.0, 5e-4), 1.0);
  EXPECT_EQ(Fp8OutExcess(std::nan(""), 0.0, 1.0, 1.0), kInf);
  EXPECT_EQ(Fp8OutExcess(kInf, 0.0, 1.0, 1.0), kInf);
  EXPECT_EQ(Fp8OutExcess(0.0, std::nan(""), 1.0, 1.0), kInf);
}

TEST(Fp8RuleTest, ScaleByteFollowsTheBlockAmaxWithinTheAllowance) {
  // amax 300: 2^0 alone (300 / 448 lies in (1/2, 1]).
  EXPECT_EQ(Fp8ScaleExcess(127, 300.0, 1.0), 0.0);
  EXPECT_EQ(Fp8ScaleExcess(128, 300.0, 1.0), kInf);
  EXPECT_EQ(Fp8ScaleExcess(126, 300.0, 1.0), kInf);
  // amax exactly 448: 2^0, or 2^1 for a kernel's amax a little above it.
  EXPECT_EQ(Fp8ScaleExcess(127, 448.0, 0.0), 0.0);
  EXPECT_EQ(Fp8ScaleExcess(128, 448.0, 0.0), kInf);
  EXPECT_EQ(Fp8ScaleExcess(128, 448.0, 1e-3), 0.0);
  EXPECT_EQ(Fp8ScaleExcess(126, 448.0, 1e-3), kInf);
  // The amax floor: 1e-4 / 448 -> 2^-22 (byte 105); within 1e-3 of it up
  // to 1.1e-3 / 448 -> 2^-18.
  EXPECT_EQ(Fp8ScaleExcess(105, 0.0, 0.0), 0.0);
  EXPECT_EQ(Fp8ScaleExcess(104, 0.0, 1e-3), kInf);
  EXPECT_EQ(Fp8ScaleExcess(109, 1e-4, 1e-3), 0.0);
  EXPECT_EQ(Fp8ScaleExcess(110, 1e-4, 1e-3), kInf);
  EXPECT_EQ(Fp8ScaleExcess(127, std::nan(""), 1.0), kInf);
}

// The FP8 answer a perfect kernel would give: the reference's out
// quantised by spec section 3's rule in 128-dim blocks, with the
// reference's own encoder.
struct Fp8Answer {
  std::vector<uint8_t> e4m3;
  std::vector<uint8_t> scales;
};

Fp8Answer QuantizedReference(const DecodeReference& expected) {
  Fp8Answer answer;
  answer.e4m3.resize(expected.out.size());
  for (size_t first = 0; first < expected.out.size(); first += kOutputQuantBlock) {
    double amax = 0.0;
    for (int i = 0; i < kOutputQuantBlock; ++i) {
      amax = std::max(amax, std::fabs(expected.out[first + i]));
    }
    const int exponent = ScaleExponent(amax);
    answer.scales.push_back(static_cast<uint8_t>(exponent + 127));
    for (int i = 0; i < kOutputQuantBlock; ++i) {
      answer.e4m3[first + i] = EncodeE4m3(std::ldexp(expected.out[first + i], -exponent));
    }
  }
  return answer;
}

// Two tokens of two heads: token 0 attends four keys with a sink, token 1
// none.
class Fp8ComparatorTest : public ::testing::Test {
 protected:
  static constexpr int kHeads = 2;

  void SetUp() override {
    std::mt19937_64 rng(21);
    std::normal_distribution<double> normal;
    std::vector<uint16_t> rows(4 * kHeadDim);
    for (size_t i = 0; i < rows.size(); ++i) {
      rows[i] = RoundToBf16(normal(rng) * (i % kHeadDim < kOutputQuantBlock ? 4.0 : 1.0));
    }
    pool_ = PoolOf(rows);
    q_.resize(2 * 8 * kHeadDim, 0);
    for (int h = 0; h < kHeads; ++h) {
      for (int d = 0; d < kHeadDim; ++d) q_[h * kHeadDim + d] = RoundToBf16(normal(rng));
    }
    indices_ = {0, 1, 2, 3, -1, -1, -1, -1};
    sinks_ = {0.5f, -1.0f};
    DecodeInputs inputs;
    inputs.num_tokens = 2;
    inputs.num_heads = kHeads;
    inputs.padded_heads = 8;
    inputs.q = q_;
    inputs.softmax_scale = kSoftmaxScale;
    inputs.sinks = sinks_;
    inputs.main = {4, indices_, {}, pool_};
    absl::StatusOr<DecodeReference> expected = ReferenceDecode(inputs);
    ASSERT_TRUE(expected.ok()) << expected.status();
    expected_ = *std::move(expected);
    ASSERT_EQ(expected_.num_keys[1], 0);
    answer_ = QuantizedReference(expected_);
  }

  ComparisonReport Compare(const Fp8Answer& answer) const {
    return CompareDecodeOutFp8(answer.e4m3, answer.scales, expected_);
  }

  std::vector<uint8_t> pool_;
  std::vector<uint16_t> q_;
  std::vector<int32_t> indices_;
  std::vector<float> sinks_;
  DecodeReference expected_;
  Fp8Answer answer_;
};

TEST_F(Fp8ComparatorTest, TheQuantizedReferencePasses) {
  const ComparisonReport report = Compare(answer_);
  EXPECT_TRUE(report.ok()) << report.ToString();
  // Every element and every block's scale was checked.
  EXPECT_EQ(report.checked(), 2 * kHeads * (kHeadDim + kOutputQuantBlocks));
  // The empty token: +0 codes and the amax floor's scale.
  for (int i = 0; i < kHeads * kHeadDim; ++i) EXPECT_EQ(answer_.e4m3[kHeads * kHeadDim + i], 0);
  for (int k = 0; k < kHeads * kOutputQuantBlocks; ++k) {
    EXPECT_EQ(answer_.scales[kHeads * kOutputQuantBlocks + k], 105);
  }
}

TEST_F(Fp8ComparatorTest, AFlippedSignFails) {
  // The largest element of head 0's block 0: its sign flipped.
  int largest = 0;
  for (int i = 0; i < kOutputQuantBlock; ++i) {
    if (std::fabs(expected_.out[i]) > std::fabs(expected_.out[largest])) largest = i;
  }
  Fp8Answer wrong = answer_;
  wrong.e4m3[largest] ^= 0x80;
  const ComparisonReport report = Compare(wrong);
  EXPECT_EQ(report.failed(), 1) << report.ToString();
  EXPECT_EQ(report.first_failure().rfind(absl::StrCat("token 0 head 0 dim ", largest, ":"), 0), 0)
      << report.ToString();
}

TEST_F(Fp8ComparatorTest, AnExponentBitFlippedFails) {
  Fp8Answer wrong = answer_;
  int largest = kHeadDim;  // head 1, block 0
  for (int i = kHeadDim; i < kHeadDim + kOutputQuantBlock; ++i) {
    if (std::fabs(expected_.out[i]) > std::fabs(expected_.out[largest])) largest = i;
  }
  wrong.e4m3[largest] ^= 0x08;  // a factor of 2 (or 1/2)
  EXPECT_FALSE(Compare(wrong).ok());
}

TEST_F(Fp8ComparatorTest, AScaleOneOffFails) {
  // Head 0's block 0 has an amax far from a power-of-two boundary, so its
  // scale byte is one value only.
  double amax = 0.0, allowance = 0.0;
  for (int i = 0; i < kOutputQuantBlock; ++i) {
    amax = std::max(amax, std::fabs(expected_.out[i]));
    allowance = std::max(allowance, DecodeOutAllowance(expected_.out[i],
                                                       expected_.max_abs_values[0]));
  }
  ASSERT_EQ(ScaleExponent(amax - allowance), ScaleExponent(amax + allowance)) << amax;
  for (int off : {1, -1}) {
    Fp8Answer wrong = answer_;
    wrong.scales[0] = static_cast<uint8_t>(wrong.scales[0] + off);
    const ComparisonReport report = Compare(wrong);
    EXPECT_FALSE(report.ok()) << off;
    EXPECT_EQ(report.first_failure().rfind("token 0 head 0 block 0 (dims 0..127): scale byte", 0),
              0)
        << report.ToString();
  }
}

TEST_F(Fp8ComparatorTest, NaNCodesAndUnwrittenOutputsFail) {
  Fp8Answer wrong = answer_;
  wrong.e4m3[300] = 0x7f;
  EXPECT_EQ(Compare(wrong).failed(), 1);
  wrong.e4m3[301] = 0xff;
  EXPECT_EQ(Compare(wrong).failed(), 2);
  // A backend that wrote nothing leaves the poison (NaN codes, scale 0xff).
  Fp8Answer poison{std::vector<uint8_t>(answer_.e4m3.size(), 0x7f),
                   std::vector<uint8_t>(answer_.scales.size(), 0xff)};
  EXPECT_EQ(Compare(poison).failed(), Compare(poison).checked());
}

TEST_F(Fp8ComparatorTest, TheEmptyKeySetIsExact) {
  const int64_t empty = kHeads * kHeadDim;  // token 1's first element
  for (uint8_t code : {uint8_t{0x80}, uint8_t{0x01}}) {
    Fp8Answer wrong = answer_;
    wrong.e4m3[empty + 7] = code;
    const ComparisonReport report = Compare(wrong);
    EXPECT_EQ(report.failed(), 1) << int{code};
    EXPECT_EQ(report.first_failure().rfind("token 1 head 0 dim 7:", 0), 0) << report.ToString();
  }
  Fp8Answer wrong = answer_;
  wrong.scales[kHeads * kOutputQuantBlocks + 3] = 106;
  const ComparisonReport report = Compare(wrong);
  EXPECT_EQ(report.failed(), 1);
  EXPECT_NE(report.first_failure().find("no keys"), std::string::npos) << report.ToString();
}

TEST_F(Fp8ComparatorTest, WrongSizesFail) {
  Fp8Answer short_codes = answer_;
  short_codes.e4m3.pop_back();
  EXPECT_FALSE(Compare(short_codes).ok());
  Fp8Answer short_scales = answer_;
  short_scales.scales.pop_back();
  EXPECT_FALSE(Compare(short_scales).ok());
}

}  // namespace
}  // namespace reference
}  // namespace mla

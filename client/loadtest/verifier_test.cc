#include "client/loadtest/verifier.h"

#include <cmath>
#include <vector>

#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "kernels/bf16.h"
#include "kernels/geometry.h"
#include "kernels/model_profile.h"
#include "kernels/reference/reference_f64.h"
#include "kernels/reference/tolerance.h"
#include "kernels/rope.h"

namespace mla::loadtest {
namespace {

using ::testing::HasSubstr;
using ::testing::Not;

const ModelProfile& Flash() { return **FindModelProfile("deepseek-v4-flash"); }

class VerifierTest : public ::testing::Test {
 protected:
  VerifierTest() : workload_(Flash(), 4096, 5), verifier_(workload_, 2) {}

  // A token of layer `layer` at `position`, H = 16 heads from head 16.
  SentToken Token(int layer, int32_t position) const {
    SentToken token;
    token.layer = layer;
    token.heads = 16;
    token.head_offset = 16;
    token.salt = 42;
    token.position = position;
    token.q = workload_.Query(Workload::MessageKey(1, 0, position, layer, 0), 1, 16);
    if (Flash().compress_ratio(layer) == 4)
      workload_.AppendTopK(token.salt, layer, position, &token.topk);
    return token;
  }

  Workload workload_;
  Verifier verifier_;
};

// Flash layers: 0 SWA-only, 2 C4A, 3 C128A.
TEST_F(VerifierTest, TheCpuBackendsOwnAnswerPassesBitForBit) {
  for (int layer : {0, 2, 3}) {
    for (int32_t position : {0, 5, 300}) {
      const SentToken token = Token(layer, position);
      absl::StatusOr<LocalAnswer> local = verifier_.Recompute(token);
      ASSERT_TRUE(local.ok()) << local.status();
      absl::StatusOr<TokenVerdict> verdict = verifier_.Check(token, local->out, local->lse);
      ASSERT_TRUE(verdict.ok()) << verdict.status();
      EXPECT_TRUE(verdict->ok) << verdict->failure;
      EXPECT_TRUE(verdict->bit_identical);
      EXPECT_LT(verdict->max_excess, 1.0);
      EXPECT_GT(local->reference.num_keys[0], std::min(position, 127));
    }
  }
}

TEST_F(VerifierTest, AWrongAnswerFails) {
  const SentToken token = Token(2, 300);
  absl::StatusOr<LocalAnswer> local = verifier_.Recompute(token);
  ASSERT_TRUE(local.ok()) << local.status();

  std::vector<uint16_t> out = local->out;
  out[5 * 512 + 77] = FloatToBf16(Bf16ToFloat(out[5 * 512 + 77]) + 0.5f);
  absl::StatusOr<TokenVerdict> verdict = verifier_.Check(token, out, local->lse);
  ASSERT_TRUE(verdict.ok());
  EXPECT_FALSE(verdict->ok);
  EXPECT_FALSE(verdict->bit_identical);
  EXPECT_THAT(verdict->failure, HasSubstr("1 of"));

  out = local->out;
  out[0] = 0x7fc0;  // NaN
  EXPECT_FALSE(verifier_.Check(token, out, {})->ok);

  std::vector<float> lse = local->lse;
  lse[3] += 0.01f;
  verdict = verifier_.Check(token, local->out, lse);
  EXPECT_FALSE(verdict->ok);
  EXPECT_THAT(verdict->failure, HasSubstr("lse"));
}

TEST_F(VerifierTest, TheAnswerOfAnotherTokenFails) {
  // What a server attending the wrong rows, heads or position would send.
  const SentToken token = Token(3, 300);
  for (SentToken other : {Token(3, 299), Token(2, 300)}) {
    absl::StatusOr<LocalAnswer> wrong = verifier_.Recompute(other);
    ASSERT_TRUE(wrong.ok()) << wrong.status();
    EXPECT_FALSE(verifier_.Check(token, wrong->out, {})->ok);
  }
  SentToken shifted = token;
  shifted.head_offset = 0;  // other sinks
  absl::StatusOr<LocalAnswer> wrong = verifier_.Recompute(shifted);
  ASSERT_TRUE(wrong.ok());
  EXPECT_FALSE(verifier_.Check(token, wrong->out, wrong->lse)->ok);
}

// A token of the C4A layer 2 at position 300 whose head 0 looks for its
// first top-k row (one key dominates) and whose element `tie_dim` of head 0,
// where that row is largest, has a float64 q_out of about 12 within 2^-20 of
// a bf16 midpoint: one ulp there (0.0625) moves lse by several times its
// plain allowance. `q_` holds the query the token views; its other heads are
// the workload's own query rows.
class TieTest : public VerifierTest {
 protected:
  static constexpr int kLayer = 2;
  static constexpr int32_t kPosition = 300;

  void SetUp() override {
    token_ = Token(kLayer, kPosition);
    const absl::Span<const uint16_t> sent = token_.q;
    q_.assign(sent.begin(), sent.end());
    const uint16_t* row = workload_.CompressedRow(token_.salt, kLayer, token_.topk[0]);
    for (int d = 0; d < kNopeDim; ++d) {
      if (std::fabs(Bf16ToFloat(row[d])) > std::fabs(Bf16ToFloat(row[tie_dim_]))) tie_dim_ = d;
    }
    // The smallest NoPE value of the row balances the norm: it moves the
    // logit of the row least.
    int ballast = tie_dim_ == 0 ? 1 : 0;
    double rest = 0.0;
    for (int d = 0; d < kNopeDim; ++d) {
      if (d == tie_dim_) continue;
      if (std::fabs(Bf16ToFloat(row[d])) < std::fabs(Bf16ToFloat(row[ballast]))) ballast = d;
    }
    for (int d = 0; d < kHeadDim; ++d) {
      if (d != tie_dim_) rest += std::pow(Bf16ToFloat(row[d]), 2);
    }
    // The rest holds 512 - 144 of the squared norm, so q_e near 12 stays
    // near 12 through the RMSNorm.
    const float scale = static_cast<float>(std::sqrt(368.0 / rest));
    for (int d = 0; d < kHeadDim; ++d) q_[d] = FloatToBf16(Bf16ToFloat(row[d]) * scale);
    // q_e over the 32 bf16 values from 11 up, the ballast over 512 from 0.5
    // up (to 8): the norm changes by up to 1/8, so q_out_e sweeps several
    // ulps, and one candidate in about 2700 lands within 2^-20 of a midpoint.
    const uint16_t sign = row[tie_dim_] & 0x8000;
    const std::vector<int32_t> position = {kPosition};
    const RopeTable table(Flash().rope_kind(kLayer), kPosition + 1);
    for (int step = 0; step < 32 * 512 && !tied_; ++step) {
      q_[tie_dim_] = static_cast<uint16_t>(sign | (FloatToBf16(11.0f) + step % 32));
      q_[ballast] = static_cast<uint16_t>(FloatToBf16(0.5f) + step / 32);
      absl::StatusOr<reference::QueryReference> head = reference::ReferenceQuery(
          absl::MakeConstSpan(q_).first(kHeadDim), position, 1, 1, Flash().rms_norm_eps, table);
      ASSERT_TRUE(head.ok()) << head.status();
      tie_value_ = head->values[tie_dim_];
      tied_ = reference::TieQuerySlack(*head)[tie_dim_] > 0.0;
    }
    token_.q = q_;
  }

  // The answer of a correct server whose prologue rounded the tie to the
  // other side of its midpoint than the verifier's CPU prologue did.
  absl::StatusOr<LocalAnswer> OtherServer() {
    absl::StatusOr<LocalAnswer> local = verifier_.Recompute(token_);
    if (!local.ok()) return local.status();
    std::vector<uint16_t> q_out = local->q_out;
    const bool below = std::fabs(Bf16ToFloat(q_out[tie_dim_])) < std::fabs(tie_value_);
    q_out[tie_dim_] = below ? q_out[tie_dim_] + 1 : q_out[tie_dim_] - 1;
    return verifier_.RecomputeWith(token_, q_out);
  }

  std::vector<uint16_t> q_;
  SentToken token_;
  int tie_dim_ = 0;
  double tie_value_ = 0.0;
  bool tied_ = false;
};

TEST_F(TieTest, AServerThatRoundedTheTieTheOtherWayPasses) {
  ASSERT_TRUE(tied_) << "no tie found";
  absl::StatusOr<LocalAnswer> local = verifier_.Recompute(token_);
  ASSERT_TRUE(local.ok()) << local.status();
  absl::StatusOr<LocalAnswer> server = OtherServer();
  ASSERT_TRUE(server.ok()) << server.status();

  // The tie alone moves lse beyond the plain clause, 1e-3 + 2e-6 |lse|.
  const double lse = local->reference.lse[0];
  EXPECT_GT(std::fabs(server->lse[0] - lse), 2 * (1e-3 + 2e-6 * std::fabs(lse)));
  EXPECT_GT(local->reference.composition_deltas[0], 2e-3);

  absl::StatusOr<TokenVerdict> verdict = verifier_.Check(token_, server->out, server->lse);
  ASSERT_TRUE(verdict.ok()) << verdict.status();
  EXPECT_TRUE(verdict->ok) << verdict->failure;
  EXPECT_FALSE(verdict->bit_identical);
}

TEST_F(TieTest, AWrongKeyStillFails) {
  ASSERT_TRUE(tied_) << "no tie found";
  SentToken swapped = token_;
  // The dominant row's index replaced by the next entry's: that row counts
  // twice, the dominant one never.
  swapped.topk[0] = token_.topk[1];
  absl::StatusOr<LocalAnswer> wrong = verifier_.Recompute(swapped);
  ASSERT_TRUE(wrong.ok()) << wrong.status();
  absl::StatusOr<TokenVerdict> verdict = verifier_.Check(token_, wrong->out, wrong->lse);
  ASSERT_TRUE(verdict.ok()) << verdict.status();
  EXPECT_FALSE(verdict->ok);
  EXPECT_THAT(verdict->failure, HasSubstr("decode out"));
  EXPECT_THAT(verdict->failure, HasSubstr("decode lse"));
}

TEST_F(TieTest, AMissingSinkStillFails) {
  ASSERT_TRUE(tied_) << "no tie found";
  absl::StatusOr<LocalAnswer> server = OtherServer();
  ASSERT_TRUE(server.ok()) << server.status();
  // A server that left the sink out of the denominator: out larger by
  // 1 + exp(sink - lse); lse (which excludes the sink) unchanged.
  std::vector<uint16_t> out = server->out;
  for (int h = 0; h < token_.heads; ++h) {
    const float sink = workload_.Sink(token_.salt, kLayer, token_.head_offset + h);
    const float factor = 1.0f + std::exp(sink - server->lse[h]);
    for (int d = 0; d < kHeadDim; ++d) {
      out[h * kHeadDim + d] = FloatToBf16(Bf16ToFloat(out[h * kHeadDim + d]) * factor);
    }
  }
  absl::StatusOr<TokenVerdict> verdict = verifier_.Check(token_, out, server->lse);
  ASSERT_TRUE(verdict.ok()) << verdict.status();
  EXPECT_FALSE(verdict->ok);
  EXPECT_THAT(verdict->failure, HasSubstr("decode out"));
  EXPECT_THAT(verdict->failure, Not(HasSubstr("decode lse")));
}

TEST_F(VerifierTest, DerotatedOutputIsCheckedToo) {
  SentToken token = Token(0, 40);
  token.derotate = true;
  absl::StatusOr<LocalAnswer> derotated = verifier_.Recompute(token);
  ASSERT_TRUE(derotated.ok());
  EXPECT_TRUE(verifier_.Check(token, derotated->out, derotated->lse)->ok);
  token.derotate = false;
  EXPECT_FALSE(verifier_.Check(token, derotated->out, {})->ok);
}

// --fp8_output: the CPU backend's own FP8 answer passes bit for bit (with
// and without de-rotation); a scale one off, a flipped sign, the bf16
// token's lse and a CheckFp8 of a bf16 token do not.
TEST_F(VerifierTest, Fp8AnswersAreHeldToTheFp8Rule) {
  for (int layer : {0, 2, 3}) {
    for (bool derotate : {false, true}) {
      SentToken token = Token(layer, 300);
      token.derotate = derotate;
      token.fp8_output = true;
      absl::StatusOr<LocalAnswer> local = verifier_.Recompute(token);
      ASSERT_TRUE(local.ok()) << local.status();
      ASSERT_EQ(local->e4m3.size(), 16u * kHeadDim);
      ASSERT_EQ(local->scales.size(), 16u * kOutputQuantBlocks);
      EXPECT_TRUE(local->out.empty());
      absl::StatusOr<TokenVerdict> verdict =
          verifier_.CheckFp8(token, local->e4m3, local->scales, local->lse);
      ASSERT_TRUE(verdict.ok()) << verdict.status();
      EXPECT_TRUE(verdict->ok) << verdict->failure;
      EXPECT_TRUE(verdict->bit_identical);
      EXPECT_LT(verdict->max_excess, 1.0);

      std::vector<uint8_t> scales = local->scales;
      scales[7] += 1;
      verdict = verifier_.CheckFp8(token, local->e4m3, scales, local->lse);
      ASSERT_TRUE(verdict.ok());
      EXPECT_FALSE(verdict->ok) << "a scale one off, layer " << layer;
      EXPECT_FALSE(verdict->bit_identical);
      EXPECT_THAT(verdict->failure, HasSubstr("decode out (fp8)"));
    }
  }
  SentToken token = Token(2, 300);
  token.fp8_output = true;
  absl::StatusOr<LocalAnswer> local = verifier_.Recompute(token);
  ASSERT_TRUE(local.ok()) << local.status();
  // The largest code of head 3's first block, its sign flipped.
  int largest = 3 * kHeadDim;
  for (int d = 3 * kHeadDim; d < 3 * kHeadDim + kOutputQuantBlock; ++d) {
    if ((local->e4m3[d] & 0x7f) > (local->e4m3[largest] & 0x7f)) largest = d;
  }
  std::vector<uint8_t> e4m3 = local->e4m3;
  e4m3[largest] ^= 0x80;
  EXPECT_FALSE(verifier_.CheckFp8(token, e4m3, local->scales, {})->ok);
  std::vector<float> lse = local->lse;
  lse[0] += 0.01f;
  EXPECT_FALSE(verifier_.CheckFp8(token, local->e4m3, local->scales, lse)->ok);
  token.fp8_output = false;
  EXPECT_EQ(verifier_.CheckFp8(token, local->e4m3, local->scales, local->lse).status().code(),
            absl::StatusCode::kInvalidArgument);
}

TEST_F(VerifierTest, BadTokensAreErrors) {
  SentToken token = Token(0, 3);
  token.layer = 99;
  EXPECT_FALSE(verifier_.Recompute(token).ok());
  token = Token(0, 3);
  token.heads = 8;  // q holds 16 heads
  EXPECT_FALSE(verifier_.Recompute(token).ok());
}

}  // namespace
}  // namespace mla::loadtest

#include "client/loadtest/verifier.h"

#include <cmath>
#include <vector>

#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "kernels/bf16.h"
#include "kernels/model_profile.h"

namespace mla::loadtest {
namespace {

using ::testing::HasSubstr;

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

TEST_F(VerifierTest, DerotatedOutputIsCheckedToo) {
  SentToken token = Token(0, 40);
  token.derotate = true;
  absl::StatusOr<LocalAnswer> derotated = verifier_.Recompute(token);
  ASSERT_TRUE(derotated.ok());
  EXPECT_TRUE(verifier_.Check(token, derotated->out, derotated->lse)->ok);
  token.derotate = false;
  EXPECT_FALSE(verifier_.Check(token, derotated->out, {})->ok);
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

#include "kernels/head_padding.h"

#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "kernels/model_profile.h"

namespace mla {
namespace {

using ::testing::HasSubstr;

int Padded(int heads) { return PaddedHeadCount(heads).value(); }

TEST(HeadPaddingTest, V4ProTensorParallelRanksRunUnpadded) {
  const ModelProfile& pro = *FindModelProfile("deepseek-v4-pro").value();
  const int expected[] = {128, 64, 32, 16, 8};
  int tp = 1;
  for (int hp : expected) {
    EXPECT_EQ(Padded(pro.num_query_heads / tp), hp) << "TP" << tp;
    tp *= 2;
  }
}

TEST(HeadPaddingTest, V4FlashTensorParallelRanks) {
  const ModelProfile& flash = *FindModelProfile("deepseek-v4-flash").value();
  const int expected[] = {64, 32, 16, 8, 8};  // TP1, 2, 4, 8, 16 (4 heads pad to 8)
  int tp = 1;
  for (int hp : expected) {
    EXPECT_EQ(Padded(flash.num_query_heads / tp), hp) << "TP" << tp;
    tp *= 2;
  }
}

TEST(HeadPaddingTest, CountsRoundUpToAMultipleOfEightOnly) {
  EXPECT_EQ(Padded(1), 8);
  EXPECT_EQ(Padded(4), 8);
  EXPECT_EQ(Padded(9), 16);
  EXPECT_EQ(Padded(24), 24);
  EXPECT_EQ(Padded(41), 48);
  EXPECT_EQ(Padded(48), 48);
  EXPECT_EQ(Padded(96), 96);
  EXPECT_EQ(Padded(121), 128);
  EXPECT_EQ(Padded(128), 128);
  for (int heads = 1; heads <= kMaxHeads; ++heads) {
    const int padded = Padded(heads);
    EXPECT_TRUE(IsSupportedHeadCount(padded)) << heads;
    EXPECT_GE(padded, heads);
    EXPECT_LT(padded - heads, kHeadCountStep) << heads;
  }
}

TEST(HeadPaddingTest, SupportedCountsAreTheMultiplesOfEight) {
  EXPECT_EQ(kSupportedHeadCounts.front(), 8);
  EXPECT_EQ(kSupportedHeadCounts.back(), 128);
  EXPECT_EQ(kSupportedHeadCounts.size(), 16u);
  for (int hp = -8; hp <= 136; ++hp) {
    bool listed = false;
    for (int count : kSupportedHeadCounts) listed |= count == hp;
    EXPECT_EQ(IsSupportedHeadCount(hp), listed) << hp;
  }
}

TEST(HeadPaddingTest, OutOfRangeCountsAreErrorsNamingTheSupportedSet) {
  for (int heads : {0, -3, 129, 256}) {
    absl::StatusOr<int> padded = PaddedHeadCount(heads);
    ASSERT_FALSE(padded.ok()) << heads;
    EXPECT_EQ(padded.status().code(), absl::StatusCode::kInvalidArgument);
    EXPECT_THAT(padded.status().message(), HasSubstr("every multiple of 8 from 8 to 128"));
  }
}

}  // namespace
}  // namespace mla

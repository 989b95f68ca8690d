#include "kernels/model_profile.h"

#include <vector>

#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace mla {
namespace {

using ::testing::HasSubstr;

std::vector<int> Repeat(std::vector<int> head, std::vector<int> pair, int times,
                        std::vector<int> tail) {
  for (int i = 0; i < times; ++i) head.insert(head.end(), pair.begin(), pair.end());
  head.insert(head.end(), tail.begin(), tail.end());
  return head;
}

TEST(ModelProfileTest, Flash) {
  const ModelProfile& flash = *FindModelProfile("deepseek-v4-flash").value();
  EXPECT_EQ(flash.num_layers, 43);
  EXPECT_EQ(flash.num_attention_layers(), 44);
  EXPECT_EQ(flash.num_query_heads, 64);
  EXPECT_EQ(flash.indexer_topk, 512);
  EXPECT_FLOAT_EQ(flash.rms_norm_eps, 1e-6f);
  EXPECT_FLOAT_EQ(flash.softmax_scale, 0.04419417382415922f);
  EXPECT_EQ(flash.compress_ratios, Repeat({0, 0}, {4, 128}, 20, {4, 0}));
}

TEST(ModelProfileTest, Pro) {
  const ModelProfile& pro = *FindModelProfile("deepseek-v4-pro").value();
  EXPECT_EQ(pro.num_layers, 61);
  EXPECT_EQ(pro.num_attention_layers(), 62);
  EXPECT_EQ(pro.num_query_heads, 128);
  EXPECT_EQ(pro.indexer_topk, 1024);
  EXPECT_FLOAT_EQ(pro.rms_norm_eps, 1e-6f);
  EXPECT_FLOAT_EQ(pro.softmax_scale, 0.04419417382415922f);
  EXPECT_EQ(pro.compress_ratios, Repeat({128, 128}, {4, 128}, 29, {4, 0}));
}

TEST(ModelProfileTest, LayerKindAndRopeFollowTheCompressRatio) {
  const ModelProfile& flash = *FindModelProfile("deepseek-v4-flash").value();
  EXPECT_EQ(flash.layer_kind(0), LayerKind::kSwaOnly);
  EXPECT_EQ(flash.rope_kind(0), RopeKind::kPlain);
  EXPECT_EQ(flash.layer_kind(2), LayerKind::kC4A);
  EXPECT_EQ(flash.rope_kind(2), RopeKind::kYarn);
  EXPECT_EQ(flash.layer_kind(3), LayerKind::kC128A);
  EXPECT_EQ(flash.rope_kind(3), RopeKind::kYarn);
  EXPECT_EQ(flash.layer_kind(42), LayerKind::kC4A);
  EXPECT_EQ(flash.layer_kind(43), LayerKind::kSwaOnly);  // MTP layer
  const ModelProfile& pro = *FindModelProfile("deepseek-v4-pro").value();
  EXPECT_EQ(pro.layer_kind(0), LayerKind::kC128A);
  EXPECT_EQ(pro.layer_kind(61), LayerKind::kSwaOnly);
  EXPECT_EQ(LayerKindName(LayerKind::kC4A), "c4a");
}

TEST(ModelProfileTest, UnknownNameListsTheKnownOnes) {
  absl::StatusOr<const ModelProfile*> profile = FindModelProfile("deepseek-v3");
  ASSERT_FALSE(profile.ok());
  EXPECT_EQ(profile.status().code(), absl::StatusCode::kNotFound);
  EXPECT_THAT(profile.status().message(), HasSubstr("deepseek-v4-flash, deepseek-v4-pro"));
}

}  // namespace
}  // namespace mla

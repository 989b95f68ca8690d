#include "server/engine/testing/spec_models.h"

#include "absl/status/statusor.h"
#include "gtest/gtest.h"
#include "kernels/model_profile.h"

namespace mla::engine_testing {
namespace {

TEST(SpecTest, BuiltInProfilesAreTheSpecModels) {
  for (const char* name : {kFlash, kPro}) {
    absl::StatusOr<const ModelProfile*> profile = FindModelProfile(name);
    ASSERT_TRUE(profile.ok()) << profile.status();
    const SpecModel& spec = Spec(name);
    EXPECT_EQ((*profile)->compress_ratios, spec.ratios) << name;
    EXPECT_EQ((*profile)->num_query_heads, spec.h_total) << name;
    EXPECT_EQ((*profile)->indexer_topk, spec.topk) << name;
    EXPECT_NEAR((*profile)->softmax_scale, 0.04419417382415922, 1e-8) << name;
    EXPECT_NEAR((*profile)->rms_norm_eps, 1e-6, 1e-12) << name;
  }
  EXPECT_EQ(Spec(kFlash).layers(), 44);
  EXPECT_EQ(Spec(kPro).layers(), 62);
  EXPECT_EQ(Spec(kFlash).ratios[kFlashSwa], 0);
  EXPECT_EQ(Spec(kFlash).ratios[kFlashC4a], 4);
  EXPECT_EQ(Spec(kFlash).ratios[kFlashC128a], 128);
  EXPECT_EQ(Spec(kFlash).ratios[kFlashMtpC4a], 4);
  EXPECT_EQ(Spec(kFlash).ratios[kFlashMtpSwa], 0);
  EXPECT_EQ(Spec(kPro).ratios[kProC128a], 128);
  EXPECT_EQ(Spec(kPro).ratios[kProC4a], 4);
  EXPECT_EQ(Spec(kPro).ratios[kProMidC128a], 128);
  EXPECT_EQ(Spec(kPro).ratios[kProMtpSwa], 0);
}

}  // namespace
}  // namespace mla::engine_testing

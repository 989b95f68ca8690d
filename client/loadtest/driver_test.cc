#include "client/loadtest/driver.h"

#include <string>

#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace mla::loadtest {
namespace {

using ::testing::HasSubstr;

LoadOptions Good() {
  LoadOptions options;
  options.targets = {"127.0.0.1:50051", "[::1]:50052"};
  return options;
}

// The flag named in the error of options changed by `change`.
std::string ErrorOf(void (*change)(LoadOptions&)) {
  LoadOptions options = Good();
  change(options);
  const absl::Status status = ValidateOptions(options);
  EXPECT_EQ(status.code(), absl::StatusCode::kInvalidArgument);
  return std::string(status.message());
}

TEST(DriverTest, DefaultsWithTargetsAreValid) { EXPECT_TRUE(ValidateOptions(Good()).ok()); }

TEST(DriverTest, EachBadSettingNamesItsFlag) {
  EXPECT_THAT(ErrorOf([](LoadOptions& o) { o.targets.clear(); }), HasSubstr("--target"));
  EXPECT_THAT(ErrorOf([](LoadOptions& o) { o.targets = {"localhost"}; }), HasSubstr("HOST:PORT"));
  EXPECT_THAT(ErrorOf([](LoadOptions& o) { o.targets = {"a:1", "a:1"}; }), HasSubstr("twice"));
  EXPECT_THAT(ErrorOf([](LoadOptions& o) { o.model = "gpt"; }), HasSubstr("--model"));
  EXPECT_THAT(ErrorOf([](LoadOptions& o) { o.tp = 3; }), HasSubstr("--tp=3: must divide the 64"));
  EXPECT_THAT(ErrorOf([](LoadOptions& o) { o.layers = 45; }), HasSubstr("--layers"));
  EXPECT_THAT(ErrorOf([](LoadOptions& o) { o.streams = 0; }), HasSubstr("--streams"));
  EXPECT_THAT(ErrorOf([](LoadOptions& o) { o.sessions = 0; }), HasSubstr("--sessions"));
  EXPECT_THAT(ErrorOf([](LoadOptions& o) { o.tokens_per_step = 130; }),
              HasSubstr("--tokens_per_step"));
  EXPECT_THAT(ErrorOf([](LoadOptions& o) { o.concurrency = 0; }), HasSubstr("--concurrency"));
  EXPECT_THAT(ErrorOf([](LoadOptions& o) { o.rate = -1; }), HasSubstr("--rate"));
  EXPECT_THAT(ErrorOf([](LoadOptions& o) { o.duration_s = 0; }), HasSubstr("--duration_s"));
  EXPECT_THAT(ErrorOf([](LoadOptions& o) {
                o.verify = true;
                o.verify_every = 0;
              }),
              HasSubstr("--verify_every"));
}

TEST(DriverTest, StepsReplaceDuration) {
  LoadOptions options = Good();
  options.duration_s = 0;
  options.steps = 3;
  EXPECT_TRUE(ValidateOptions(options).ok());
  options.model = "deepseek-v4-pro";
  options.tp = 16;  // 8 heads
  options.layers = 62;
  EXPECT_TRUE(ValidateOptions(options).ok());
}

TEST(DriverTest, RunLoadTestRefusesBadOptionsBeforeConnecting) {
  LoadOptions options = Good();
  options.tp = 5;
  EXPECT_EQ(RunLoadTest(options).status().code(), absl::StatusCode::kInvalidArgument);
}

}  // namespace
}  // namespace mla::loadtest

#include "client/loadtest/driver.h"

#include <cmath>
#include <limits>
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
  EXPECT_THAT(ErrorOf([](LoadOptions& o) { o.connections_per_stream = 0; }),
              HasSubstr("--connections_per_stream=0: give 1 to 16"));
  EXPECT_THAT(ErrorOf([](LoadOptions& o) { o.connections_per_stream = 17; }),
              HasSubstr("--connections_per_stream=17"));
  EXPECT_THAT(ErrorOf([](LoadOptions& o) { o.data_plane = "rdma"; }),
              HasSubstr("--data_plane=rdma: give inline, shm or cuda_ipc"));
  EXPECT_THAT(ErrorOf([](LoadOptions& o) {
                o.data_plane = "shm";
                o.rate = 100;
              }),
              HasSubstr("--data_plane=shm runs the closed loop only"));
  EXPECT_THAT(ErrorOf([](LoadOptions& o) {
                o.data_plane = "cuda_ipc";
                o.rate = 100;
              }),
              HasSubstr("--data_plane=cuda_ipc runs the closed loop only"));
  EXPECT_THAT(ErrorOf([](LoadOptions& o) {
                o.data_plane = "cuda_ipc";
                o.cuda_device = -1;
              }),
              HasSubstr("--cuda_device must not be negative"));
  EXPECT_THAT(ErrorOf([](LoadOptions& o) { o.rate = -1; }), HasSubstr("--rate"));
  EXPECT_THAT(ErrorOf([](LoadOptions& o) { o.duration_s = 0; }), HasSubstr("--duration_s"));
  EXPECT_THAT(ErrorOf([](LoadOptions& o) {
                o.verify = true;
                o.verify_every = 0;
              }),
              HasSubstr("--verify_every"));
}

TEST(DriverTest, TimesAndRatesMustBeFiniteAndSane) {
  const double kInf = std::numeric_limits<double>::infinity();
  const double kNan = std::numeric_limits<double>::quiet_NaN();
  for (const double bad : {kNan, kInf, -kInf, 1e10}) {
    LoadOptions options = Good();
    options.duration_s = bad;
    EXPECT_THAT(std::string(ValidateOptions(options).message()), HasSubstr("--duration_s=")) << bad;
    options = Good();
    options.warmup_s = bad;
    EXPECT_THAT(std::string(ValidateOptions(options).message()), HasSubstr("--warmup_s=")) << bad;
    options = Good();
    options.step_timeout_s = bad;
    EXPECT_THAT(std::string(ValidateOptions(options).message()), HasSubstr("--step_timeout_s="))
        << bad;
    options = Good();
    options.rate = bad;
    EXPECT_THAT(std::string(ValidateOptions(options).message()), HasSubstr("--rate=")) << bad;
  }
  EXPECT_THAT(ErrorOf([](LoadOptions& o) { o.duration_s = 1e10; }),
              HasSubstr("at most 604800 seconds (a week)"));
  EXPECT_THAT(ErrorOf([](LoadOptions& o) { o.rate = std::nan(""); }), HasSubstr("--rate=nan"));
  // The limits themselves still run.
  LoadOptions options = Good();
  options.duration_s = 604800;
  options.warmup_s = 3600;
  options.step_timeout_s = 3600;
  options.rate = 1e7;
  EXPECT_TRUE(ValidateOptions(options).ok());
  options.rate = 1e-3;
  EXPECT_TRUE(ValidateOptions(options).ok());
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

#include "client/loadtest/plot.h"

#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <random>
#include <sstream>
#include <string>

#include "absl/strings/str_cat.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace mla::loadtest {
namespace {

using ::testing::HasSubstr;
using ::testing::Not;

std::string TestDir() {
  const char* dir = std::getenv("TEST_TMPDIR");
  return dir != nullptr ? dir : "/tmp";
}

std::string ReadFile(const std::string& path) {
  std::ifstream file(path, std::ios::binary);
  std::stringstream text;
  text << file.rdbuf();
  return text.str();
}

LatencyHistogram Sample(double median_ns, uint64_t seed) {
  std::mt19937_64 rng(seed);
  std::lognormal_distribution<double> lognormal(std::log(median_ns), 0.5);
  LatencyHistogram latency;
  for (int i = 0; i < 5000; ++i) latency.Record(static_cast<int64_t>(lognormal(rng)));
  return latency;
}

TEST(PlotTest, DrawsAPng) {
  const LatencyHistogram attend = Sample(2e6, 1), echo = Sample(3e5, 2);
  const std::string path = absl::StrCat(TestDir(), "/latency's.png");  // a quote in the name
  ASSERT_TRUE(
      WriteLatencyPlot({{"attend", &attend}, {"echo", &echo}}, "test run", path, "gnuplot").ok());
  const std::string png = ReadFile(path);
  ASSERT_GT(png.size(), 1000u);
  EXPECT_EQ(png.substr(1, 3), "PNG");
}

TEST(PlotTest, DrawsAnSvgWithTheSeriesTitles) {
  const LatencyHistogram attend = Sample(2e6, 3);
  const LatencyHistogram empty;
  const std::string path = absl::StrCat(TestDir(), "/latency.svg");
  const absl::Status status = WriteLatencyPlot({{"attend", &attend}, {"echo", &empty}}, "svg run",
                                               path, "/usr/bin/gnuplot");
  ASSERT_TRUE(status.ok()) << status;
  const std::string svg = ReadFile(path);
  EXPECT_THAT(svg, HasSubstr("<svg"));
  EXPECT_THAT(svg, HasSubstr("attend (n=5000)"));
  EXPECT_THAT(svg, HasSubstr("p99"));
  EXPECT_THAT(svg, Not(HasSubstr("echo (n=")));
}

TEST(PlotTest, ChecksForGnuplotBeforeARun) {
  EXPECT_TRUE(FindGnuplot("gnuplot").ok());
  EXPECT_TRUE(FindGnuplot("/usr/bin/gnuplot").ok());
  for (const std::string missing : {"/nonexistent/gnuplot", "no_such_gnuplot_program"}) {
    const absl::Status status = FindGnuplot(missing).status();
    EXPECT_EQ(status.code(), absl::StatusCode::kFailedPrecondition) << missing;
    EXPECT_THAT(std::string(status.message()), HasSubstr("gnuplot-nox")) << missing;
    EXPECT_THAT(std::string(status.message()), HasSubstr("--gnuplot=PATH")) << missing;
  }
}

TEST(PlotTest, ClearErrors) {
  const LatencyHistogram attend = Sample(2e6, 4);
  const std::string dir = TestDir();
  absl::Status status =
      WriteLatencyPlot({{"attend", &attend}}, "t", dir + "/x.png", "/nonexistent/gnuplot");
  EXPECT_EQ(status.code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_THAT(std::string(status.message()), HasSubstr("gnuplot-nox"));
  status = WriteLatencyPlot({{"attend", &attend}}, "t", dir + "/x.jpg", "gnuplot");
  EXPECT_EQ(status.code(), absl::StatusCode::kInvalidArgument);
  const LatencyHistogram empty;
  status = WriteLatencyPlot({{"attend", &empty}}, "t", dir + "/y.png", "gnuplot");
  EXPECT_EQ(status.code(), absl::StatusCode::kFailedPrecondition);
  status = WriteLatencyPlot({{"attend", &attend}}, "t", dir + "/no/such/folder/z.png", "gnuplot");
  EXPECT_EQ(status.code(), absl::StatusCode::kInternal);
}

}  // namespace
}  // namespace mla::loadtest

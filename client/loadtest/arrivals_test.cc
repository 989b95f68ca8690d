#include "client/loadtest/arrivals.h"

#include <cmath>
#include <vector>

#include "gtest/gtest.h"

namespace mla::loadtest {
namespace {

TEST(PoissonArrivalsTest, GapsAreExponentialAtTheRate) {
  PoissonArrivals arrivals(2000.0, 11);
  const int n = 200000;
  double sum = 0, sum_sq = 0;
  for (int i = 0; i < n; ++i) {
    const double gap = arrivals.NextGapSeconds();
    ASSERT_GE(gap, 0.0);
    sum += gap;
    sum_sq += gap * gap;
  }
  const double mean = sum / n;
  const double stddev = std::sqrt(sum_sq / n - mean * mean);
  EXPECT_NEAR(mean, 1.0 / 2000.0, 0.01 / 2000.0);
  // An exponential's standard deviation equals its mean (a fixed-rate
  // schedule would have none).
  EXPECT_NEAR(stddev / mean, 1.0, 0.02);
}

TEST(PoissonArrivalsTest, CountsPerWindowHavePoissonVariance) {
  PoissonArrivals arrivals(100.0, 5);
  // Arrivals in 1 s windows: mean 100, variance 100.
  std::vector<int> counts(2000, 0);
  double t = 0;
  while (true) {
    t += arrivals.NextGapSeconds();
    if (t >= counts.size()) break;
    ++counts[static_cast<size_t>(t)];
  }
  double sum = 0, sum_sq = 0;
  for (int c : counts) {
    sum += c;
    sum_sq += static_cast<double>(c) * c;
  }
  const double mean = sum / counts.size();
  const double variance = sum_sq / counts.size() - mean * mean;
  EXPECT_NEAR(mean, 100.0, 1.5);
  EXPECT_NEAR(variance, 100.0, 12.0);
}

TEST(PoissonArrivalsTest, SameSeedSameSchedule) {
  PoissonArrivals a(50.0, 9), b(50.0, 9), c(50.0, 10);
  bool differs = false;
  for (int i = 0; i < 100; ++i) {
    const double gap = a.NextGapSeconds();
    EXPECT_EQ(gap, b.NextGapSeconds());
    differs |= gap != c.NextGapSeconds();
  }
  EXPECT_TRUE(differs);
}

}  // namespace
}  // namespace mla::loadtest

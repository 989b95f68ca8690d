#include "client/loadtest/latency_histogram.h"

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <random>
#include <vector>

#include "gtest/gtest.h"

namespace mla::loadtest {
namespace {

// The ceil(q * n)-th smallest of `values` (the smallest for q = 0).
int64_t ExactPercentile(std::vector<int64_t> values, double q) {
  std::sort(values.begin(), values.end());
  const int64_t rank = std::max<int64_t>(1, static_cast<int64_t>(std::ceil(q * values.size())));
  return values[rank - 1];
}

TEST(LatencyHistogramTest, EmptyAnswersZero) {
  LatencyHistogram histogram;
  EXPECT_EQ(histogram.count(), 0);
  EXPECT_EQ(histogram.Percentile(0.5), 0);
  EXPECT_EQ(histogram.min_ns(), 0);
  EXPECT_EQ(histogram.max_ns(), 0);
  EXPECT_TRUE(histogram.NonEmptyBuckets().empty());
}

TEST(LatencyHistogramTest, SmallValuesAreExact) {
  LatencyHistogram histogram;
  for (int64_t v = 1; v <= 100; ++v) histogram.Record(v);
  EXPECT_EQ(histogram.Percentile(0.5), 50);
  EXPECT_EQ(histogram.Percentile(0.99), 99);
  EXPECT_EQ(histogram.Percentile(0.0), 1);
  EXPECT_EQ(histogram.Percentile(1.0), 100);
  EXPECT_DOUBLE_EQ(histogram.mean_ns(), 50.5);
}

TEST(LatencyHistogramTest, PercentilesWithinTheStatedErrorOfTheExactOnes) {
  std::mt19937_64 rng(7);
  // Latency-like: log-normal around 300 us with a heavy tail.
  std::lognormal_distribution<double> lognormal(std::log(300e3), 0.8);
  std::vector<int64_t> values;
  LatencyHistogram histogram;
  for (int i = 0; i < 200000; ++i) {
    const int64_t v = static_cast<int64_t>(lognormal(rng));
    values.push_back(v);
    histogram.Record(v);
  }
  const double bound = std::ldexp(1.0, -(LatencyHistogram::kSubBucketBits + 1));
  for (double q : {0.0, 0.1, 0.5, 0.9, 0.99, 0.999, 0.9999}) {
    const double exact = static_cast<double>(ExactPercentile(values, q));
    const double got = static_cast<double>(histogram.Percentile(q));
    EXPECT_LE(std::fabs(got - exact), bound * exact + 1) << "q=" << q;
  }
  EXPECT_EQ(histogram.Percentile(1.0), *std::max_element(values.begin(), values.end()));
  EXPECT_EQ(histogram.min_ns(), *std::min_element(values.begin(), values.end()));
  EXPECT_EQ(histogram.count(), 200000);
}

TEST(LatencyHistogramTest, BucketsAbutAndCountEverySample) {
  LatencyHistogram histogram;
  std::mt19937_64 rng(3);
  for (int i = 0; i < 5000; ++i) histogram.Record(static_cast<int64_t>(rng() >> (rng() % 60)));
  histogram.Record(-5);  // counts as 0
  int64_t total = 0;
  int64_t previous_upper = -1;
  for (const LatencyHistogram::Bucket& bucket : histogram.NonEmptyBuckets()) {
    EXPECT_GT(bucket.lower_ns, previous_upper);
    EXPECT_LE(bucket.lower_ns, bucket.upper_ns);
    // A bucket is at most 2^-S of its lower bound wide.
    if (bucket.lower_ns >= (2 << LatencyHistogram::kSubBucketBits)) {
      EXPECT_LE(
          static_cast<double>(bucket.upper_ns - bucket.lower_ns + 1),
          std::ldexp(static_cast<double>(bucket.lower_ns), -LatencyHistogram::kSubBucketBits));
    }
    previous_upper = bucket.upper_ns;
    total += bucket.count;
  }
  EXPECT_EQ(total, 5001);
  EXPECT_EQ(histogram.min_ns(), 0);
}

TEST(LatencyHistogramTest, MergeEqualsRecordingEverythingInOne) {
  LatencyHistogram a, b, all;
  for (int64_t v = 0; v < 3000; ++v) {
    const int64_t value = v * v * 37;
    (v % 3 == 0 ? a : b).Record(value);
    all.Record(value);
  }
  LatencyHistogram empty;
  a.Merge(empty);
  a.Merge(b);
  EXPECT_EQ(a.count(), all.count());
  EXPECT_EQ(a.min_ns(), all.min_ns());
  EXPECT_EQ(a.max_ns(), all.max_ns());
  EXPECT_DOUBLE_EQ(a.mean_ns(), all.mean_ns());
  for (double q : {0.25, 0.5, 0.75, 0.99}) EXPECT_EQ(a.Percentile(q), all.Percentile(q));
  a.Clear();
  EXPECT_EQ(a.count(), 0);
  EXPECT_EQ(a.Percentile(0.5), 0);
}

}  // namespace
}  // namespace mla::loadtest

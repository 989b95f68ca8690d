// LatencyHistogram: a log-linear histogram of durations in nanoseconds with a
// bounded relative error, for percentiles of millions of samples in fixed
// memory.
//
// Values below 2^(kSubBucketBits + 1) ns each have their own bucket (exact);
// above, every power of two is split into 2^kSubBucketBits equal buckets, so a
// bucket is at most 2^-kSubBucketBits of its lower bound wide. Percentile()
// answers the midpoint of the bucket holding the requested rank, clamped to
// the exact minimum and maximum: within 2^-(kSubBucketBits + 1) (0.2 %) of
// the exact order statistic. Count, sum, minimum and maximum are exact.
//
// Not thread-safe: give each recording thread its own and Merge() them.
#ifndef MLA_OFFLOAD_CLIENT_LOADTEST_LATENCY_HISTOGRAM_H_
#define MLA_OFFLOAD_CLIENT_LOADTEST_LATENCY_HISTOGRAM_H_

#include <cstdint>
#include <vector>

namespace mla::loadtest {

class LatencyHistogram {
 public:
  static constexpr int kSubBucketBits = 8;

  struct Bucket {
    int64_t lower_ns = 0;  // inclusive
    int64_t upper_ns = 0;  // inclusive
    int64_t count = 0;
  };

  LatencyHistogram();

  // Negative values count as 0.
  void Record(int64_t nanos);
  void Merge(const LatencyHistogram& other);
  void Clear();

  int64_t count() const { return count_; }
  // 0 when empty.
  int64_t min_ns() const { return count_ == 0 ? 0 : min_; }
  int64_t max_ns() const { return max_; }
  double mean_ns() const { return count_ == 0 ? 0.0 : static_cast<double>(sum_) / count_; }

  // The value at quantile q (clamped to [0, 1]): the ceil(q * count)-th
  // smallest sample (the smallest for q = 0), to within the bucket error; 0
  // when empty. Percentile(1) is the exact maximum.
  int64_t Percentile(double q) const;

  // The buckets that hold samples, ascending.
  std::vector<Bucket> NonEmptyBuckets() const;

 private:
  static int BucketIndex(int64_t value);
  static int64_t BucketLower(int index);
  static int64_t BucketUpper(int index);

  std::vector<int64_t> counts_;
  int64_t count_ = 0;
  int64_t sum_ = 0;
  int64_t min_ = 0;
  int64_t max_ = 0;
};

}  // namespace mla::loadtest

#endif  // MLA_OFFLOAD_CLIENT_LOADTEST_LATENCY_HISTOGRAM_H_

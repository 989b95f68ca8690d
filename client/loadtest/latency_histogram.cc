#include "client/loadtest/latency_histogram.h"

#include <algorithm>
#include <cmath>
#include <limits>

namespace mla::loadtest {
namespace {

constexpr int kSub = LatencyHistogram::kSubBucketBits;
constexpr int64_t kSubCount = int64_t{1} << kSub;
// Shifts 0..(62 - kSub) cover every non-negative int64.
constexpr int kNumBuckets = static_cast<int>((62 - kSub + 2) * kSubCount);

}  // namespace

LatencyHistogram::LatencyHistogram() : counts_(kNumBuckets, 0) {}

// Index = shift * 2^S + (value >> shift), where shift is how far the value
// must move right to fit in S + 1 bits: buckets of consecutive shifts abut.
int LatencyHistogram::BucketIndex(int64_t value) {
  if (value < 2 * kSubCount) return static_cast<int>(value);
  const int top_bit = 63 - __builtin_clzll(static_cast<uint64_t>(value));
  const int shift = top_bit - kSub;
  return static_cast<int>(shift * kSubCount + (value >> shift));
}

int64_t LatencyHistogram::BucketLower(int index) {
  if (index < 2 * kSubCount) return index;
  const int shift = static_cast<int>(index / kSubCount) - 1;
  const int64_t mantissa = index - shift * kSubCount;
  return mantissa << shift;
}

int64_t LatencyHistogram::BucketUpper(int index) {
  if (index + 1 >= kNumBuckets) return std::numeric_limits<int64_t>::max();
  return BucketLower(index + 1) - 1;
}

void LatencyHistogram::Record(int64_t nanos) {
  nanos = std::max<int64_t>(nanos, 0);
  ++counts_[BucketIndex(nanos)];
  if (count_ == 0 || nanos < min_) min_ = nanos;
  if (nanos > max_) max_ = nanos;
  ++count_;
  sum_ += nanos;
}

void LatencyHistogram::Merge(const LatencyHistogram& other) {
  if (other.count_ == 0) return;
  for (int i = 0; i < kNumBuckets; ++i) counts_[i] += other.counts_[i];
  min_ = count_ == 0 ? other.min_ : std::min(min_, other.min_);
  max_ = std::max(max_, other.max_);
  count_ += other.count_;
  sum_ += other.sum_;
}

void LatencyHistogram::Clear() {
  std::fill(counts_.begin(), counts_.end(), 0);
  count_ = sum_ = min_ = max_ = 0;
}

int64_t LatencyHistogram::Percentile(double q) const {
  if (count_ == 0) return 0;
  q = std::clamp(q, 0.0, 1.0);
  if (q >= 1.0) return max_;
  const int64_t rank = std::max<int64_t>(1, static_cast<int64_t>(std::ceil(q * count_)));
  int64_t seen = 0;
  for (int i = 0; i < kNumBuckets; ++i) {
    seen += counts_[i];
    if (seen >= rank) {
      const int64_t lower = BucketLower(i);
      const int64_t mid = lower + (BucketUpper(i) - lower) / 2;
      return std::clamp(mid, min_, max_);
    }
  }
  return max_;
}

std::vector<LatencyHistogram::Bucket> LatencyHistogram::NonEmptyBuckets() const {
  std::vector<Bucket> buckets;
  for (int i = 0; i < kNumBuckets; ++i) {
    if (counts_[i] > 0) buckets.push_back({BucketLower(i), BucketUpper(i), counts_[i]});
  }
  return buckets;
}

}  // namespace mla::loadtest

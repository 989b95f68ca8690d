// Open-loop arrivals: a Poisson process of layer steps at a target rate.
//
// Gaps between arrivals are exponential with mean 1/rate, drawn from a
// seeded generator, so a run can be repeated. The load-test client sends each
// layer step at its scheduled time whether or not earlier ones have been
// answered, and measures latency from that scheduled time (not from when the
// message could be written), so a server that falls behind shows it in the
// tail instead of hiding it (no coordinated omission).
//
// Not thread-safe: one per sending thread.
#ifndef MLA_OFFLOAD_CLIENT_LOADTEST_ARRIVALS_H_
#define MLA_OFFLOAD_CLIENT_LOADTEST_ARRIVALS_H_

#include <cstdint>
#include <random>

namespace mla::loadtest {

class PoissonArrivals {
 public:
  // rate_per_second > 0.
  PoissonArrivals(double rate_per_second, uint64_t seed);

  // Seconds from the previous arrival to the next one.
  double NextGapSeconds();

  double rate_per_second() const { return rate_; }

 private:
  double rate_;
  std::mt19937_64 rng_;
  std::exponential_distribution<double> gap_;
};

}  // namespace mla::loadtest

#endif  // MLA_OFFLOAD_CLIENT_LOADTEST_ARRIVALS_H_

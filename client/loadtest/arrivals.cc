#include "client/loadtest/arrivals.h"

namespace mla::loadtest {

PoissonArrivals::PoissonArrivals(double rate_per_second, uint64_t seed)
    : rate_(rate_per_second), rng_(seed), gap_(rate_per_second) {}

double PoissonArrivals::NextGapSeconds() { return gap_(rng_); }

}  // namespace mla::loadtest

// Cost of the updates the server makes on its request path. Threads share one
// child, the worst case: all of them write the same cache lines.
#include <vector>

#include "benchmark/benchmark.h"
#include "server/metrics/registry.h"

namespace mla::metrics {
namespace {

void BM_CounterIncrement(benchmark::State& state) {
  static Counter counter;
  for (auto _ : state) counter.Increment();
}
BENCHMARK(BM_CounterIncrement)->Threads(1)->Threads(8);

void BM_CounterAddDouble(benchmark::State& state) {
  static Counter counter;
  for (auto _ : state) counter.Add(0.001);
}
BENCHMARK(BM_CounterAddDouble)->Threads(1)->Threads(8);

void BM_HistogramObserve(benchmark::State& state) {
  // 10 us .. 10 s, the server's latency buckets.
  static const std::vector<double> bounds = OneTwoFiveBuckets(-5, 1);
  static Histogram histogram(bounds);
  // Values spread over the buckets so the branch predictor cannot learn one.
  double v = 1e-5;
  for (auto _ : state) {
    histogram.Observe(v);
    v = v < 10 ? v * 1.7 : 1e-5;
  }
}
BENCHMARK(BM_HistogramObserve)->Threads(1)->Threads(8);

}  // namespace
}  // namespace mla::metrics

BENCHMARK_MAIN();

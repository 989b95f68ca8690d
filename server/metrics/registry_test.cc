#include "server/metrics/registry.h"

#include <cmath>
#include <cstdint>
#include <limits>
#include <string>
#include <thread>
#include <vector>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace mla::metrics {
namespace {

using ::testing::ElementsAre;
using ::testing::HasSubstr;

TEST(RegistryTest, RendersEveryKindExactly) {
  Registry registry;
  CounterFamily* requests = *registry.AddCounter(
      "mla_requests_total", "Requests served.", {"method", "code"});
  (*requests->WithLabels({"Attend", "OK"}))->Increment(3);
  (*requests->WithLabels({"AppendKV", "OK"}))->Increment();
  Counter* busy = *(*registry.AddCounter("mla_busy_seconds_total",
                                         "Seconds spent in kernels."))
                       ->WithLabels({});
  busy->Increment();
  busy->Add(0.5);
  (*(*registry.AddGauge("mla_sessions", "Open sessions."))->WithLabels({}))
      ->Set(2);
  (*(*registry.AddGauge("mla_skew", "Clock skew.", {"peer"}))
        ->WithLabels({"a"}))
      ->Set(-3.25);
  CallbackGaugeFamily* free_blocks = *registry.AddCallbackGauge(
      "mla_kv_blocks_free", "KV blocks free.", {"device"});
  GaugeCallbackRegistration registration =
      *free_blocks->AddCallback({"0"}, [] { return 7.0; });
  Histogram* step = *(*registry.AddHistogram("mla_step_seconds",
                                             "Step latency.", {}, {0.25, 1, 4}))
                         ->WithLabels({});
  for (double v : {0.125, 0.25, 0.5, 8.0}) step->Observe(v);
  (*(*registry.AddHistogram("mla_batch_size", "Requests per launch.",
                            {"device"}, {1, 8}))
        ->WithLabels({"0"}))
      ->Observe(3);

  EXPECT_EQ(registry.RenderText(),
            R"(# HELP mla_batch_size Requests per launch.
# TYPE mla_batch_size histogram
mla_batch_size_bucket{device="0",le="1"} 0
mla_batch_size_bucket{device="0",le="8"} 1
mla_batch_size_bucket{device="0",le="+Inf"} 1
mla_batch_size_sum{device="0"} 3
mla_batch_size_count{device="0"} 1
# HELP mla_busy_seconds_total Seconds spent in kernels.
# TYPE mla_busy_seconds_total counter
mla_busy_seconds_total 1.5
# HELP mla_kv_blocks_free KV blocks free.
# TYPE mla_kv_blocks_free gauge
mla_kv_blocks_free{device="0"} 7
# HELP mla_requests_total Requests served.
# TYPE mla_requests_total counter
mla_requests_total{method="AppendKV",code="OK"} 1
mla_requests_total{method="Attend",code="OK"} 3
# HELP mla_sessions Open sessions.
# TYPE mla_sessions gauge
mla_sessions 2
# HELP mla_skew Clock skew.
# TYPE mla_skew gauge
mla_skew{peer="a"} -3.25
# HELP mla_step_seconds Step latency.
# TYPE mla_step_seconds histogram
mla_step_seconds_bucket{le="0.25"} 2
mla_step_seconds_bucket{le="1"} 3
mla_step_seconds_bucket{le="4"} 3
mla_step_seconds_bucket{le="+Inf"} 4
mla_step_seconds_sum 8.875
mla_step_seconds_count 4
)");
}

TEST(RegistryTest, EmptyFamilyRendersOnlyItsHeader) {
  Registry registry;
  ASSERT_TRUE(
      registry.AddCounter("unused_total", "Never touched.", {"x"}).ok());
  EXPECT_EQ(registry.RenderText(),
            "# HELP unused_total Never touched.\n"
            "# TYPE unused_total counter\n");
}

TEST(RegistryTest, EscapesLabelValuesAndHelp) {
  Registry registry;
  GaugeFamily* family =
      *registry.AddGauge("g", "Line one\nback\\slash \"quoted\"", {"path"});
  (*family->WithLabels({"a\\b\"c\nd"}))->Set(1);
  EXPECT_EQ(registry.RenderText(),
            "# HELP g Line one\\nback\\\\slash \"quoted\"\n"
            "# TYPE g gauge\n"
            "g{path=\"a\\\\b\\\"c\\nd\"} 1\n");
}

std::string RenderGauge(double v) {
  Registry registry;
  (*(*registry.AddGauge("g", "h"))->WithLabels({}))->Set(v);
  const std::string text = registry.RenderText();
  const std::string prefix = "# HELP g h\n# TYPE g gauge\ng ";
  EXPECT_TRUE(absl::StartsWith(text, prefix)) << text;
  return text.substr(prefix.size(), text.size() - prefix.size() - 1);
}

TEST(RegistryTest, FormatsNumbersAsPrometheusParsesThem) {
  EXPECT_EQ(RenderGauge(0), "0");
  EXPECT_EQ(RenderGauge(-0.0), "0");
  EXPECT_EQ(RenderGauge(123456789), "123456789");
  EXPECT_EQ(RenderGauge(-42), "-42");
  EXPECT_EQ(RenderGauge(0.1), "0.1");
  EXPECT_EQ(RenderGauge(0.0001), "0.0001");
  EXPECT_EQ(RenderGauge(1e-5), "1e-05");
  EXPECT_EQ(RenderGauge(1234567.5), "1.2345675e+06");
  EXPECT_EQ(RenderGauge(1e20), "1e+20");
  EXPECT_EQ(RenderGauge(std::numeric_limits<double>::infinity()), "+Inf");
  EXPECT_EQ(RenderGauge(-std::numeric_limits<double>::infinity()), "-Inf");
  EXPECT_EQ(RenderGauge(std::nan("")), "NaN");
}

TEST(RegistryTest, CounterKeepsIntegersExactAndIgnoresDecreases) {
  Counter counter;
  counter.Increment(std::numeric_limits<uint64_t>::max() - 1);
  counter.Add(-1);
  counter.Add(std::nan(""));
  EXPECT_EQ(counter.Value(), 18446744073709551614.0);

  Registry registry;
  Counter* big = *(*registry.AddCounter("big_total", "h"))->WithLabels({});
  big->Increment(std::numeric_limits<uint64_t>::max() - 1);
  EXPECT_THAT(registry.RenderText(),
              HasSubstr("big_total 18446744073709551614\n"));
}

TEST(RegistryTest, GaugeSetsAndAdds) {
  Gauge gauge;
  gauge.Set(5);
  gauge.Add(-1.5);
  EXPECT_EQ(gauge.Value(), 3.5);
}

TEST(HistogramTest, BucketsAreCumulativeWithUpperBoundsInclusive) {
  const std::vector<double> bounds = {1, 2, 4};
  Histogram histogram(bounds);
  for (double v : {-1.0, 1.0, 1.5, 2.0, 3.0, 4.0, 4.5, 100.0}) {
    histogram.Observe(v);
  }
  const Histogram::Snapshot snapshot = histogram.Read();
  EXPECT_THAT(snapshot.cumulative_counts, ElementsAre(2, 4, 6, 8));
  EXPECT_EQ(snapshot.sum, 115);
}

TEST(HistogramTest, NanCountsOnlyInInfBucket) {
  const std::vector<double> bounds = {1};
  Histogram histogram(bounds);
  histogram.Observe(0.5);
  histogram.Observe(std::nan(""));
  const Histogram::Snapshot snapshot = histogram.Read();
  EXPECT_THAT(snapshot.cumulative_counts, ElementsAre(1, 2));
  EXPECT_TRUE(std::isnan(snapshot.sum));
}

TEST(HistogramTest, WithoutBoundsCountsAndSums) {
  Histogram histogram({});
  histogram.Observe(2);
  histogram.Observe(3);
  const Histogram::Snapshot snapshot = histogram.Read();
  EXPECT_THAT(snapshot.cumulative_counts, ElementsAre(2));
  EXPECT_EQ(snapshot.sum, 5);
}

TEST(HistogramTest, OneTwoFiveBucketsRenderAsWritten) {
  const std::vector<double> bounds = OneTwoFiveBuckets(-5, 1);
  ASSERT_EQ(bounds.size(), 19u);
  EXPECT_EQ(bounds.front(), 1e-5);
  EXPECT_EQ(bounds.back(), 10);
  Registry registry;
  ASSERT_TRUE((*registry.AddHistogram("latency_seconds", "h", {}, bounds))
                  ->WithLabels({})
                  .ok());
  const std::string text = registry.RenderText();
  for (const char* le : {"1e-05", "2e-05", "5e-05", "0.0001", "0.0002", "0.001",
                         "0.5", "1", "2", "5", "10", "+Inf"}) {
    EXPECT_THAT(text, HasSubstr(absl::StrCat("{le=\"", le, "\"} 0\n")));
  }
}

TEST(RegistryTest, ConcurrentUpdatesAreExact) {
  Registry registry;
  CounterFamily* counters = *registry.AddCounter("c_total", "h", {"k"});
  HistogramFamily* histograms =
      *registry.AddHistogram("h_seconds", "h", {"k"}, {0.5, 1});
  constexpr int kThreads = 8;
  constexpr int kIterations = 50000;
  std::vector<std::thread> threads;
  for (int t = 0; t < kThreads; ++t) {
    threads.emplace_back([&] {
      // Every thread looks the same children up, racing to create them.
      Counter* counter = *counters->WithLabels({"shared"});
      Histogram* histogram = *histograms->WithLabels({"shared"});
      for (int i = 0; i < kIterations; ++i) {
        counter->Increment();
        counter->Add(0.5);
        histogram->Observe(i % 2 == 0 ? 0.25 : 0.75);
      }
    });
  }
  // Scrapes while the writers run must not disturb them.
  std::thread scraper([&] {
    for (int i = 0; i < 20; ++i) registry.RenderText();
  });
  for (std::thread& thread : threads) thread.join();
  scraper.join();

  constexpr uint64_t kTotal = uint64_t{kThreads} * kIterations;
  EXPECT_EQ((*counters->WithLabels({"shared"}))->Value(), 1.5 * kTotal);
  const Histogram::Snapshot snapshot =
      (*histograms->WithLabels({"shared"}))->Read();
  EXPECT_THAT(snapshot.cumulative_counts,
              ElementsAre(kTotal / 2, kTotal, kTotal));
  EXPECT_EQ(snapshot.sum, 0.5 * kTotal);
}

TEST(RegistryTest, SameDefinitionReturnsTheExistingFamily) {
  Registry registry;
  CounterFamily* first = *registry.AddCounter("x_total", "h", {"a"});
  EXPECT_EQ(*registry.AddCounter("x_total", "h", {"a"}), first);
  HistogramFamily* histogram = *registry.AddHistogram("y", "h", {}, {1, 2});
  EXPECT_EQ(*registry.AddHistogram("y", "h", {}, {1, 2}), histogram);
}

TEST(RegistryTest, ConflictingDefinitionIsAlreadyExists) {
  Registry registry;
  ASSERT_TRUE(registry.AddCounter("x", "h", {"a"}).ok());
  ASSERT_TRUE(registry.AddHistogram("y", "h", {}, {1, 2}).ok());
  ASSERT_TRUE(registry.AddGauge("z", "h").ok());
  const absl::Status kinds = registry.AddGauge("x", "h", {"a"}).status();
  EXPECT_EQ(kinds.code(), absl::StatusCode::kAlreadyExists);
  EXPECT_THAT(kinds.message(), HasSubstr("already registered as a counter"));
  EXPECT_EQ(registry.AddCounter("x", "h", {"b"}).status().code(),
            absl::StatusCode::kAlreadyExists);
  EXPECT_EQ(registry.AddCounter("x", "other help", {"a"}).status().code(),
            absl::StatusCode::kAlreadyExists);
  EXPECT_EQ(registry.AddHistogram("y", "h", {}, {1, 3}).status().code(),
            absl::StatusCode::kAlreadyExists);
  EXPECT_EQ(registry.AddCallbackGauge("z", "h").status().code(),
            absl::StatusCode::kAlreadyExists);
}

TEST(RegistryTest, InvalidDefinitionsAreInvalidArgument) {
  Registry registry;
  for (const char* name : {"", "1abc", "a-b", "a b", "é"}) {
    EXPECT_EQ(registry.AddCounter(name, "h").status().code(),
              absl::StatusCode::kInvalidArgument)
        << name;
  }
  EXPECT_TRUE(registry.AddCounter("ns:sub_name_total2", "h").ok());
  for (const char* label : {"", "__reserved", "a:b", "9a", "a-b"}) {
    EXPECT_EQ(registry.AddCounter("c", "h", {label}).status().code(),
              absl::StatusCode::kInvalidArgument)
        << label;
  }
  EXPECT_EQ(registry.AddCounter("c", "h", {"a", "a"}).status().code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(registry.AddHistogram("h", "h", {"le"}, {1}).status().code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_TRUE(registry.AddCounter("le_ok_total", "h", {"le"}).ok());
  const double inf = std::numeric_limits<double>::infinity();
  for (const std::vector<double>& bounds : std::vector<std::vector<double>>{
           {1, 1}, {2, 1}, {1, inf}, {std::nan("")}}) {
    EXPECT_EQ(registry.AddHistogram("h", "h", {}, bounds).status().code(),
              absl::StatusCode::kInvalidArgument);
  }
  // Nothing invalid was registered.
  EXPECT_FALSE(absl::StrContains(registry.RenderText(), "# TYPE h "));
}

TEST(RegistryTest, WrongNumberOfLabelValuesIsInvalidArgument) {
  Registry registry;
  CounterFamily* family = *registry.AddCounter("c_total", "h", {"a", "b"});
  const absl::Status status = family->WithLabels({"only one"}).status();
  EXPECT_EQ(status.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(status.message(), HasSubstr("2 labels [a,b]; got 1 values"));
  EXPECT_EQ((*registry.AddCallbackGauge("g", "h"))
                ->AddCallback({"x"}, [] { return 0.0; })
                .status()
                .code(),
            absl::StatusCode::kInvalidArgument);
}

TEST(CallbackGaugeTest, ReadsAtScrapeTimeUntilRegistrationIsDestroyed) {
  Registry registry;
  CallbackGaugeFamily* family =
      *registry.AddCallbackGauge("blocks_used", "h", {"device"});
  double used = 1;
  {
    GaugeCallbackRegistration registration =
        *family->AddCallback({"0"}, [&used] { return used; });
    used = 5;
    EXPECT_THAT(registry.RenderText(),
                HasSubstr("blocks_used{device=\"0\"} 5\n"));
    EXPECT_EQ(family->AddCallback({"0"}, [] { return 0.0; }).status().code(),
              absl::StatusCode::kAlreadyExists);

    // Moving hands the callback over without unregistering it.
    GaugeCallbackRegistration moved = std::move(registration);
    EXPECT_THAT(registry.RenderText(),
                HasSubstr("blocks_used{device=\"0\"} 5\n"));
  }
  EXPECT_FALSE(absl::StrContains(registry.RenderText(), "blocks_used{"));
  // The label values are free again.
  GaugeCallbackRegistration again =
      *family->AddCallback({"0"}, [] { return 2.0; });
  again = GaugeCallbackRegistration();
  EXPECT_FALSE(absl::StrContains(registry.RenderText(), "blocks_used{"));
}

}  // namespace
}  // namespace mla::metrics

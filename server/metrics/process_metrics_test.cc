// The process metrics read this test's own process: values a process has
// (memory, descriptors, threads, a start time in the last day), gone when
// the registration goes, and refused when registered twice.
#include "server/metrics/process_metrics.h"

#include <future>
#include <map>
#include <memory>
#include <string>
#include <thread>

#include "absl/strings/numbers.h"
#include "absl/strings/str_split.h"
#include "absl/time/clock.h"
#include "gtest/gtest.h"

namespace mla::metrics {
namespace {

// name -> value of the unlabelled samples of `text`.
std::map<std::string, double> Samples(const std::string& text) {
  std::map<std::string, double> samples;
  for (absl::string_view line : absl::StrSplit(text, '\n')) {
    if (line.empty() || line[0] == '#') continue;
    const std::pair<absl::string_view, absl::string_view> sample = absl::StrSplit(line, ' ');
    double value = 0;
    if (absl::SimpleAtod(sample.second, &value)) samples[std::string(sample.first)] = value;
  }
  return samples;
}

TEST(ProcessMetricsTest, ReadThisProcess) {
  Registry registry;
  {
    absl::StatusOr<std::unique_ptr<ProcessMetrics>> process = ProcessMetrics::Add(registry);
    ASSERT_TRUE(process.ok()) << process.status();
    std::promise<void> done;
    std::thread other([&done] { done.get_future().wait(); });
    std::map<std::string, double> samples = Samples(registry.RenderText());
    done.set_value();
    other.join();
    EXPECT_GT(samples["process_resident_memory_bytes"], 1 << 20);
    EXPECT_GE(samples["process_virtual_memory_bytes"], samples["process_resident_memory_bytes"]);
    EXPECT_GE(samples["process_open_fds"], 3) << "stdin, stdout, stderr at least";
    EXPECT_GE(samples["process_max_fds"], samples["process_open_fds"]);
    EXPECT_GE(samples["process_threads"], 2) << "this thread and `other`";
    EXPECT_GE(samples["process_cpu_seconds_total"], 0);
    const double now = absl::ToDoubleSeconds(absl::Now() - absl::UnixEpoch());
    EXPECT_LE(samples["process_start_time_seconds"], now + 1);
    EXPECT_GT(samples["process_start_time_seconds"], now - 86400);
    // Busy for a while: the CPU time grows.
    const double cpu = samples["process_cpu_seconds_total"];
    const absl::Time until = absl::Now() + absl::Milliseconds(300);
    volatile double sink = 0;
    while (absl::Now() < until) sink = sink + 1;
    EXPECT_GT(Samples(registry.RenderText())["process_cpu_seconds_total"], cpu);
    EXPECT_FALSE(ProcessMetrics::Add(registry).ok()) << "the same callbacks twice";
  }
  EXPECT_EQ(Samples(registry.RenderText()).count("process_resident_memory_bytes"), 0u)
      << "the callbacks outlived their registration";
}

}  // namespace
}  // namespace mla::metrics

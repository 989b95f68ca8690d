// host_copy_bench: the host-device copy floor of a layer step, for the
// service-path target (server total minus queue <= GPU kernels + this + 30
// us): the time of one pinned copy to the device and one back of the given
// sizes, as the launcher makes them (AllocateHost staging and answer
// buffers, the backend's Async copies, one Synchronize), on the backend of
// --backend. Prints the median and p10/p90 over --iters round trips: the
// backend's own time of each copy (its marks) and the wall time of the
// round trip with the Synchronize.
//   host_copy_bench --backend=cuda --sizes=1135616:1052672,2269184:2101248
#include <algorithm>
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <string>
#include <utility>
#include <vector>

#include "absl/flags/flag.h"
#include "absl/flags/parse.h"
#include "absl/flags/usage.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_split.h"
#include "kernels/backend_factory.h"

ABSL_FLAG(std::string, backend, "cuda", "Compute backend: cpu or cuda.");
ABSL_FLAG(std::string, sizes, "1135616:1052672",
          "Comma-separated IN:OUT byte counts of a step (to the device : back), each timed.");
ABSL_FLAG(int, iters, 200, "Round trips per size (after 20 untimed).");

namespace mla {
namespace {

double Percentile(std::vector<double> values, double q) {
  std::sort(values.begin(), values.end());
  return values[static_cast<size_t>(q * (values.size() - 1))];
}

int Run() {
  absl::StatusOr<std::unique_ptr<ComputeBackend>> backend =
      CreateBackend(absl::GetFlag(FLAGS_backend), BackendOptions{});
  if (!backend.ok()) {
    std::fprintf(stderr, "host_copy_bench: %s\n", std::string(backend.status().message()).c_str());
    return 1;
  }
  const int iters = absl::GetFlag(FLAGS_iters);
  if (iters < 1) {
    std::fprintf(stderr, "host_copy_bench: --iters must be at least 1\n");
    return 2;
  }
  std::printf("host_copy_bench: %s, %d round trips a size (pinned host memory, async copies)\n",
              (*backend)->Describe().c_str(), iters);
  for (absl::string_view pair : absl::StrSplit(absl::GetFlag(FLAGS_sizes), ',')) {
    std::vector<absl::string_view> parts = absl::StrSplit(pair, ':');
    int64_t in = 0, out = 0;
    if (parts.size() != 2 || !absl::SimpleAtoi(parts[0], &in) ||
        !absl::SimpleAtoi(parts[1], &out) || in < 0 || out < 0) {
      std::fprintf(stderr, "host_copy_bench: --sizes takes IN:OUT byte counts, got '%s'\n",
                   std::string(pair).c_str());
      return 2;
    }
    ComputeBackend& b = **backend;
    absl::StatusOr<DeviceBuffer> staging = b.AllocateHost(in);
    absl::StatusOr<DeviceBuffer> answer = b.AllocateHost(out);
    absl::StatusOr<DeviceBuffer> device_in = b.Allocate(in);
    absl::StatusOr<DeviceBuffer> device_out = b.Allocate(out);
    if (!staging.ok() || !answer.ok() || !device_in.ok() || !device_out.ok()) {
      std::fprintf(stderr, "host_copy_bench: allocation of %lld + %lld bytes failed\n",
                   static_cast<long long>(in), static_cast<long long>(out));
      return 1;
    }
    std::memset(staging->data(), 1, in);
    std::vector<double> up, down, wall;
    for (int i = 0; i < iters + 20; ++i) {
      const auto start = std::chrono::steady_clock::now();
      absl::Status status = b.Mark(0);
      if (status.ok()) status = b.CopyToDeviceAsync(device_in->data(), staging->data(), in);
      if (status.ok()) status = b.Mark(1);
      if (status.ok()) status = b.CopyToHostAsync(answer->data(), device_out->data(), out);
      if (status.ok()) status = b.Mark(2);
      if (status.ok()) status = b.Synchronize();
      if (!status.ok()) {
        std::fprintf(stderr, "host_copy_bench: %s\n", std::string(status.message()).c_str());
        return 1;
      }
      if (i < 20) continue;
      wall.push_back(std::chrono::duration<double, std::micro>(std::chrono::steady_clock::now() -
                                                               start)
                         .count());
      up.push_back(b.MarkedMicros(0, 1));
      down.push_back(b.MarkedMicros(1, 2));
    }
    std::printf("in %9lld B: %7.1f us (p10 %.1f, p90 %.1f, %.1f GB/s) | out %9lld B: %7.1f us "
                "(p10 %.1f, p90 %.1f, %.1f GB/s) | round trip with synchronize %7.1f us (p90 %.1f)\n",
                static_cast<long long>(in), Percentile(up, 0.5), Percentile(up, 0.1),
                Percentile(up, 0.9), in / Percentile(up, 0.5) / 1e3, static_cast<long long>(out),
                Percentile(down, 0.5), Percentile(down, 0.1), Percentile(down, 0.9),
                out / Percentile(down, 0.5) / 1e3, Percentile(wall, 0.5), Percentile(wall, 0.9));
  }
  return 0;
}

}  // namespace
}  // namespace mla

int main(int argc, char** argv) {
  absl::SetProgramUsageMessage(
      "Times a layer step's pinned host-device copies (the copy floor of the service path).\n"
      "  host_copy_bench --backend=cuda --sizes=IN:OUT[,IN:OUT...] [--iters=N]");
  absl::ParseCommandLine(argc, argv);
  return mla::Run();
}

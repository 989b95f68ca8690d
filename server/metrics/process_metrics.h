// The process's own metrics, in the names Prometheus client libraries use,
// read from /proc/self at every scrape:
//   process_cpu_seconds_total       user and system CPU time
//   process_resident_memory_bytes   resident set size
//   process_virtual_memory_bytes    virtual memory size
//   process_open_fds, process_max_fds
//   process_threads
//   process_start_time_seconds      since the Unix epoch
// (Rendered as gauges: the registry's scrape-time values are gauges; the
// CPU time only ever grows.) On a system without /proc the values are 0.
//
// AddProcessMetrics registers them on `registry`; the callbacks stay
// registered as long as the returned object lives, which must not outlive
// the registry.
#ifndef MLA_OFFLOAD_SERVER_METRICS_PROCESS_METRICS_H_
#define MLA_OFFLOAD_SERVER_METRICS_PROCESS_METRICS_H_

#include <memory>
#include <vector>

#include "absl/status/statusor.h"
#include "server/metrics/registry.h"

namespace mla::metrics {

class ProcessMetrics {
 public:
  static absl::StatusOr<std::unique_ptr<ProcessMetrics>> Add(Registry& registry);

 private:
  ProcessMetrics() = default;
  std::vector<GaugeCallbackRegistration> callbacks_;
};

}  // namespace mla::metrics

#endif  // MLA_OFFLOAD_SERVER_METRICS_PROCESS_METRICS_H_

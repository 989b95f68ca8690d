// The server's metrics: every family it exports on /metrics, registered once,
// with the children of the hot path looked up once.
//
// Families (all prefixed mla_):
//   requests_total{method,code}          requests answered, by gRPC method and status code
//   request_seconds{method}              unary request latency, arrival to answer
//   attend_stage_seconds{stage}          Attend time in the stages: queue, prologue, decode
//                                        (parts of a message's time: summing them over
//                                        stages counts nothing twice)
//   attend_seconds                       Attend message latency in the server, arrival to
//                                        answer
//   attend_tokens_total                  query tokens attended
//   attend_streams                       Attend streams open
//   stream_unanswered_bytes              bytes of Attend and Echo messages read and not yet
//                                        answered, plus answers not yet written, over all
//                                        streams (each stream bounds its own share)
//   stream_read_pauses_total             times a stream stopped reading because its
//                                        unanswered bytes reached the bound
//   batch_tokens, batch_messages         tokens and messages per engine batch (histograms)
//   kv_blocks{state}                     KV cache blocks used and free
//   kv_bytes{state}                      the same in bytes (584 a token, 64 tokens a block)
//   device_memory_bytes{state}           the GPU's memory used and free, as the device
//                                        reports it (none on the CPU backend)
//   sessions                             sessions held
//   queue_messages                       Attend messages waiting for the engine
//   draining                             1 once a drain has begun
// and the process_* families of process_metrics.h. Thread-safe; updates are lock-free after the first use of a label value.
#ifndef MLA_OFFLOAD_SERVER_SERVER_METRICS_H_
#define MLA_OFFLOAD_SERVER_SERVER_METRICS_H_

#include <memory>
#include <string>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "server/engine/requests.h"
#include "server/metrics/registry.h"
#include "server/scheduler.h"

namespace mla {

class ServerMetrics {
 public:
  static absl::StatusOr<std::unique_ptr<ServerMetrics>> Create(metrics::Registry& registry);

  void RecordRequest(absl::string_view method, absl::StatusCode code);
  // A unary request answered `seconds` after it arrived.
  void RecordUnary(absl::string_view method, absl::StatusCode code, double seconds);
  void RecordAttend(const AttendResult& result);
  void RecordBatch(const BatchStats& stats);
  // Engine state, published by the engine thread after each change.
  void SetEngineState(int64_t blocks_used, int64_t blocks_free, int64_t sessions);
  void SetDeviceMemory(int64_t used, int64_t free);
  void SetQueued(int messages);
  void StreamOpened();
  void StreamClosed();
  // A stream's unanswered bytes changed by `delta`.
  void AddUnansweredBytes(int64_t delta);
  // A stream stopped reading at its bound of unanswered bytes.
  void RecordReadPause();
  void SetDraining();

 private:
  ServerMetrics() = default;

  metrics::CounterFamily* requests_ = nullptr;
  metrics::HistogramFamily* request_seconds_ = nullptr;
  metrics::Histogram* queue_seconds_ = nullptr;
  metrics::Histogram* prologue_seconds_ = nullptr;
  metrics::Histogram* decode_seconds_ = nullptr;
  metrics::Histogram* total_seconds_ = nullptr;
  metrics::Counter* tokens_ = nullptr;
  metrics::Gauge* streams_ = nullptr;
  metrics::Gauge* unanswered_bytes_ = nullptr;
  metrics::Counter* read_pauses_ = nullptr;
  metrics::Histogram* batch_tokens_ = nullptr;
  metrics::Histogram* batch_messages_ = nullptr;
  metrics::Gauge* blocks_used_ = nullptr;
  metrics::Gauge* blocks_free_ = nullptr;
  metrics::Gauge* kv_bytes_used_ = nullptr;
  metrics::Gauge* kv_bytes_free_ = nullptr;
  metrics::GaugeFamily* device_memory_ = nullptr;  // children made on first use
  metrics::Gauge* sessions_ = nullptr;
  metrics::Gauge* queued_ = nullptr;
  metrics::Gauge* draining_ = nullptr;
};

}  // namespace mla

#endif  // MLA_OFFLOAD_SERVER_SERVER_METRICS_H_

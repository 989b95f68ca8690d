#include "server/server_metrics.h"

#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "kernels/geometry.h"

namespace mla {
namespace {

template <typename T>
absl::Status Assign(absl::StatusOr<T> value, T* target) {
  if (!value.ok()) return value.status();
  *target = *value;
  return absl::OkStatus();
}

}  // namespace

absl::StatusOr<std::unique_ptr<ServerMetrics>> ServerMetrics::Create(metrics::Registry& registry) {
  std::unique_ptr<ServerMetrics> m(new ServerMetrics());
  metrics::HistogramFamily* stages = nullptr;
  metrics::HistogramFamily* attend = nullptr;
  metrics::GaugeFamily* kv_bytes = nullptr;
  metrics::HistogramFamily* batch_tokens = nullptr;
  metrics::HistogramFamily* batch_messages = nullptr;
  metrics::CounterFamily* tokens = nullptr;
  metrics::GaugeFamily* streams = nullptr;
  metrics::GaugeFamily* unanswered = nullptr;
  metrics::CounterFamily* pauses = nullptr;
  metrics::GaugeFamily* blocks = nullptr;
  metrics::GaugeFamily* sessions = nullptr;
  metrics::GaugeFamily* queued = nullptr;
  metrics::GaugeFamily* draining = nullptr;
  std::vector<double> counts;
  for (double c = 1; c <= 65536; c *= 2) counts.push_back(c);
  for (absl::Status status : {
           Assign(registry.AddCounter("mla_requests_total", "Requests answered, by method and code.",
                                      {"method", "code"}),
                  &m->requests_),
           Assign(registry.AddHistogram("mla_request_seconds",
                                        "Unary request latency in the server, from arrival to "
                                        "the answer, by method.",
                                        {"method"}, metrics::OneTwoFiveBuckets(-6, 1)),
                  &m->request_seconds_),
           Assign(registry.AddHistogram("mla_attend_stage_seconds",
                                        "Attend message time in each server stage (queue, "
                                        "prologue, decode): parts of attend_seconds.",
                                        {"stage"}, metrics::OneTwoFiveBuckets(-6, 1)),
                  &stages),
           Assign(registry.AddHistogram("mla_attend_seconds",
                                        "Attend message latency in the server, from arrival to "
                                        "the answer.",
                                        {}, metrics::OneTwoFiveBuckets(-6, 1)),
                  &attend),
           Assign(registry.AddCounter("mla_attend_tokens_total", "Query tokens attended."),
                  &tokens),
           Assign(registry.AddGauge("mla_attend_streams", "Attend streams open."), &streams),
           Assign(registry.AddGauge("mla_stream_unanswered_bytes",
                                    "Bytes of Attend and Echo messages read and not yet "
                                    "answered, plus answers not yet written, over all streams "
                                    "(--max_unanswered_mb bounds each stream's)."),
                  &unanswered),
           Assign(registry.AddCounter("mla_stream_read_pauses_total",
                                      "Times a stream stopped reading its next message because "
                                      "its unanswered bytes reached --max_unanswered_mb (a "
                                      "client that reads its answers slowly, or not at all)."),
                  &pauses),
           Assign(registry.AddHistogram("mla_batch_tokens", "Tokens per engine batch.", {},
                                        counts),
                  &batch_tokens),
           Assign(registry.AddHistogram("mla_batch_messages", "Attend messages per engine batch.",
                                        {}, counts),
                  &batch_messages),
           Assign(registry.AddGauge("mla_kv_blocks", "KV cache blocks (64 tokens each).",
                                    {"state"}),
                  &blocks),
           Assign(registry.AddGauge("mla_kv_bytes", "KV cache bytes (whole blocks).", {"state"}),
                  &kv_bytes),
           Assign(registry.AddGauge("mla_device_memory_bytes",
                                    "The GPU's memory, as the device reports it (every "
                                    "process's use).",
                                    {"state"}),
                  &m->device_memory_),
           Assign(registry.AddGauge("mla_sessions", "Sessions held."), &sessions),
           Assign(registry.AddGauge("mla_queue_messages",
                                    "Attend messages waiting for the engine."),
                  &queued),
           Assign(registry.AddGauge("mla_draining", "1 once the server has begun to drain."),
                  &draining),
       }) {
    if (!status.ok()) return status;
  }
  auto child = [](auto* family, std::vector<std::string> labels, auto** target) {
    auto found = family->WithLabels(labels);
    if (found.ok()) *target = *found;
    return found.status();
  };
  for (absl::Status status : {
           child(stages, {"queue"}, &m->queue_seconds_),
           child(stages, {"prologue"}, &m->prologue_seconds_),
           child(stages, {"decode"}, &m->decode_seconds_),
           child(attend, {}, &m->total_seconds_),
           child(tokens, {}, &m->tokens_),
           child(streams, {}, &m->streams_),
           child(unanswered, {}, &m->unanswered_bytes_),
           child(pauses, {}, &m->read_pauses_),
           child(batch_tokens, {}, &m->batch_tokens_),
           child(batch_messages, {}, &m->batch_messages_),
           child(blocks, {"used"}, &m->blocks_used_),
           child(blocks, {"free"}, &m->blocks_free_),
           child(kv_bytes, {"used"}, &m->kv_bytes_used_),
           child(kv_bytes, {"free"}, &m->kv_bytes_free_),
           child(sessions, {}, &m->sessions_),
           child(queued, {}, &m->queued_),
           child(draining, {}, &m->draining_),
       }) {
    if (!status.ok()) return status;
  }
  return m;
}

void ServerMetrics::RecordRequest(absl::string_view method, absl::StatusCode code) {
  absl::StatusOr<metrics::Counter*> counter =
      requests_->WithLabels({std::string(method), absl::StatusCodeToString(code)});
  if (counter.ok()) (*counter)->Increment();
}

void ServerMetrics::RecordUnary(absl::string_view method, absl::StatusCode code,
                                double seconds) {
  RecordRequest(method, code);
  absl::StatusOr<metrics::Histogram*> histogram =
      request_seconds_->WithLabels({std::string(method)});
  if (histogram.ok()) (*histogram)->Observe(seconds);
}

void ServerMetrics::RecordAttend(const AttendResult& result) {
  RecordRequest("Attend", result.status.code());
  queue_seconds_->Observe(result.timing.queue_us * 1e-6);
  total_seconds_->Observe(result.timing.total_us * 1e-6);
  if (!result.status.ok()) return;
  prologue_seconds_->Observe(result.timing.prologue_us * 1e-6);
  decode_seconds_->Observe(result.timing.decode_us * 1e-6);
  tokens_->Increment(static_cast<uint64_t>(result.num_tokens));
}

void ServerMetrics::RecordBatch(const BatchStats& stats) {
  batch_tokens_->Observe(static_cast<double>(stats.tokens));
  batch_messages_->Observe(stats.messages);
}

void ServerMetrics::SetEngineState(int64_t blocks_used, int64_t blocks_free, int64_t sessions) {
  blocks_used_->Set(static_cast<double>(blocks_used));
  blocks_free_->Set(static_cast<double>(blocks_free));
  kv_bytes_used_->Set(static_cast<double>(blocks_used) * kBlockBytes);
  kv_bytes_free_->Set(static_cast<double>(blocks_free) * kBlockBytes);
  sessions_->Set(static_cast<double>(sessions));
}

void ServerMetrics::SetDeviceMemory(int64_t used, int64_t free) {
  for (auto [state, value] : {std::pair<const char*, int64_t>{"used", used}, {"free", free}}) {
    absl::StatusOr<metrics::Gauge*> gauge = device_memory_->WithLabels({state});
    if (gauge.ok()) (*gauge)->Set(static_cast<double>(value));
  }
}

void ServerMetrics::SetQueued(int messages) { queued_->Set(messages); }
void ServerMetrics::StreamOpened() { streams_->Add(1); }
void ServerMetrics::StreamClosed() { streams_->Add(-1); }
void ServerMetrics::AddUnansweredBytes(int64_t delta) {
  unanswered_bytes_->Add(static_cast<double>(delta));
}
void ServerMetrics::RecordReadPause() { read_pauses_->Increment(); }
void ServerMetrics::SetDraining() { draining_->Set(1); }

}  // namespace mla

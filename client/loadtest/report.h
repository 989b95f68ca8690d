// What a load-test run measured, and its three written forms: the report a
// person reads at the end of a run (FormatReport), the JSON document of
// --json_out (ReportJson) and the per-layer-step CSV of --csv_out
// (WriteStepCsv).
//
// Words used throughout:
// - layer step: one Attend message, one layer of one decode step for the S
//   sessions of one simulated serving node (T = S x tokens_per_step tokens).
// - decode step: all L layers of one step of one node; decode steps/s =
//   layer steps/s / L, tokens/s = decode steps/s x S x tokens_per_step.
// - payload in/out: tensor bytes as the server sees them; "in" is what the
//   client sends (q, kv, compressed_kv, topk), "out" what comes back (out,
//   lse). Protobuf framing is not counted.
// - latency: client side, per layer step, from the moment the message was
//   due (closed loop: written; open loop: its scheduled arrival) to its
//   answer; failed layer steps are counted by code, not timed.
//
// Everything here is pure formatting of values the run measured.
#ifndef MLA_OFFLOAD_CLIENT_LOADTEST_REPORT_H_
#define MLA_OFFLOAD_CLIENT_LOADTEST_REPORT_H_

#include <cstdint>
#include <map>
#include <optional>
#include <ostream>
#include <string>
#include <vector>

#include "client/loadtest/latency_histogram.h"
#include "nlohmann/json.hpp"

namespace mla::loadtest {

// How the run was set up (flags, and what the servers said).
struct RunConfig {
  std::vector<std::string> targets;
  std::vector<int> sessions_per_target;  // where the sessions were placed
  std::string server_version;
  std::string backend;
  std::string model;
  int tp = 1;
  int heads = 0;         // H per rank = h_total / tp
  int padded_heads = 0;  // what the server runs H at
  int layers = 0;        // L: layers each decode step runs
  int model_layers = 0;  // attention layers of the model
  int streams = 0;       // N simulated serving nodes
  int sessions = 0;      // S per node
  int tokens_per_step = 1;
  int prompt = 0;       // P tokens appended before decoding
  std::string mode;     // "closed" or "open"
  int concurrency = 1;  // closed loop: layer steps in flight per node
  int connections_per_stream = 1;  // TCP connections each node's streams spread over
  std::string data_plane = "inline";  // or "shm", "cuda_ipc" (LoadOptions::data_plane)
  bool fp8_output = false;            // LoadOptions::fp8_output
  double rate = 0;      // open loop: target layer steps/s, all nodes
  double warmup_s = 0;
  double duration_s = 0;  // 0 when --steps bounds the run
  int64_t steps = 0;      // decode steps per node when bounded by --steps
};

// The server's own breakdown of a layer step (AttendResponse.timing, its
// stages in the order they run), summed over the OK answers of the measured
// window while it is gathered, then averaged (Mean).
struct ServerTiming {
  int64_t count = 0;
  double queue_us = 0;
  double plan_us = 0;
  double upload_us = 0;
  double prologue_us = 0;
  double decode_us = 0;
  double readback_us = 0;
  double total_us = 0;
  double batch_tokens = 0;
  double serialize_us = 0;  // after total, not part of it

  // Adds `other`'s sums and count.
  void Add(const ServerTiming& other);
  // Every figure divided by the count (the count kept).
  ServerTiming Mean() const;
  // What total holds besides the named stages: sorting a batch into
  // launches, the device's gaps between them, handing out the answer.
  double other_us() const;
};

// One measured phase: the Attend load, or the Echo baseline of the same bytes.
struct PhaseStats {
  std::string name;  // "attend" or "echo"
  // The measured window (warm-up excluded): from the end of the warm-up
  // until the schedule ended and every layer step due in it was answered.
  double seconds = 0;
  double planned_seconds = 0;  // the schedule's part: --duration_s (0 with --steps)
  // Every node stopped before the schedule's end (max_position, a failed
  // layer step): the window ends at the last answer.
  bool stopped_early = false;
  std::string stop_reason;  // why the window ended
  int64_t ok = 0;              // layer steps answered OK in the window
  int64_t tokens = 0;          // query tokens of those layer steps
  int64_t bytes_in = 0;        // payload sent to the server (OK layer steps)
  int64_t bytes_out = 0;       // payload received (OK layer steps)
  LatencyHistogram latency;
  // The same latencies by the kind of layer ("swa", "c4a", "c128a"), whose
  // costs differ: a C4A layer attends up to top-k more rows.
  std::map<std::string, LatencyHistogram> latency_by_kind;
  std::map<std::string, int64_t> errors;  // status code name -> layer steps
  ServerTiming server;                    // attend only

  int64_t failed() const;
  double LayerStepsPerSecond() const { return seconds > 0 ? ok / seconds : 0; }
  double GBpsIn() const { return seconds > 0 ? bytes_in / seconds / 1e9 : 0; }
  double GBpsOut() const { return seconds > 0 ? bytes_out / seconds / 1e9 : 0; }
};

// KV cache blocks summed over the targets (GetServerInfo). The two read at
// the end are -1 when a server did not answer (see cleanup_errors).
struct KvUse {
  int64_t blocks_total = 0;
  int64_t used_at_start = 0;      // before this run's sessions
  int64_t used_after_prompt = 0;  // after every prompt was appended
  int64_t used_at_end = 0;        // after the last layer step, before closing
  int64_t used_after_close = 0;   // after closing this run's sessions
  int block_tokens = 64;
  int bytes_per_token = 584;
  int64_t block_bytes = 37440;  // kernels/geometry.h kBlockBytes
};

// --verify: sampled layer steps recomputed locally.
struct VerifyStats {
  bool enabled = false;
  int64_t layer_steps = 0;    // layer steps checked
  int64_t tokens = 0;         // tokens checked
  int64_t failed_tokens = 0;  // tokens with any element out of tolerance
  int64_t bit_identical = 0;  // tokens whose out equals the local CPU backend's bit for bit
  double max_excess = 0;      // largest error as a fraction of the allowed one
  std::string first_failure;  // empty when none failed
  bool passed() const { return enabled && layer_steps > 0 && failed_tokens == 0; }
};

struct RunReport {
  RunConfig config;
  PhaseStats attend;
  std::optional<PhaseStats> echo;  // the baseline, when run
  KvUse kv;
  VerifyStats verify;
  double prompt_seconds = 0;  // creating sessions and appending prompts
  // What failed after the window (closing the sessions, reading KV use):
  // the figures stand, but the server may still hold this run's KV cache.
  std::vector<std::string> cleanup_errors;

  double DecodeStepsPerSecond() const;
  double TokensPerSecond() const;
  // Attend p50 over the echo's p50, and echo layer steps/s over attend's:
  // how much the service costs beyond moving the same bytes. 0 without echo.
  double LatencyOverhead() const;
  double ThroughputOverhead() const;
};

// The report of the end of a run, a few aligned lines a person reads at a
// glance; ends with a newline.
std::string FormatReport(const RunReport& report);

// "1.23 ms", "845 us", "2.10 s": a duration in nanoseconds, three digits.
std::string FormatDuration(int64_t nanos);

// The whole report as JSON, with latencies in microseconds and the
// histogram's buckets, for scripts and dashboards.
nlohmann::json ReportJson(const RunReport& report);

// One row of --csv_out: one layer step of the measured window.
struct StepRecord {
  char phase = 'a';  // 'a' attend, 'e' echo
  int32_t stream = 0;
  int64_t step = 0;  // decode step of the node
  int32_t layer = 0;
  double due_s = 0;       // when it was due, seconds since the window began
  double latency_us = 0;  // 0 when it failed
  int32_t code = 0;       // grpc::StatusCode, 0 = OK
  int32_t tokens = 0;
  int64_t bytes_in = 0;
  int64_t bytes_out = 0;
  float queue_us = 0, prologue_us = 0, decode_us = 0, server_total_us = 0;
  int32_t batch_tokens = 0;
  float plan_us = 0, upload_us = 0, readback_us = 0, serialize_us = 0;
};

// The CSV header and one line per record.
void WriteStepCsv(const std::vector<StepRecord>& records, std::ostream& out);

// The name of a grpc::StatusCode value, e.g. "RESOURCE_EXHAUSTED"; "CODE_n"
// for values that name none.
std::string StatusCodeName(int code);

}  // namespace mla::loadtest

#endif  // MLA_OFFLOAD_CLIENT_LOADTEST_REPORT_H_

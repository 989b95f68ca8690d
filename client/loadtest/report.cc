#include "client/loadtest/report.h"

#include <algorithm>
#include <cmath>
#include <cstdio>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"

namespace mla::loadtest {
namespace {

constexpr double kPercentiles[] = {0.5, 0.9, 0.99, 0.999};
constexpr const char* kPercentileNames[] = {"p50", "p90", "p99", "p99.9"};

std::string Line(absl::string_view label, absl::string_view text) {
  return absl::StrFormat("  %-24s %s\n", label, text);
}

// What a layer step spent outside the server's stages: the mean latency
// less the server's total and its serialisation of the answer.
double TransportUs(const PhaseStats& phase) {
  return phase.latency.mean_ns() / 1e3 - phase.server.total_us - phase.server.serialize_us;
}

std::string LatencyText(const LatencyHistogram& latency) {
  if (latency.count() == 0) return "no answers";
  std::vector<std::string> parts;
  for (int i = 0; i < 4; ++i) {
    parts.push_back(absl::StrCat(kPercentileNames[i], " ",
                                 FormatDuration(latency.Percentile(kPercentiles[i]))));
  }
  parts.push_back(absl::StrCat("max ", FormatDuration(latency.max_ns())));
  return absl::StrCat(absl::StrJoin(parts, "  "), "  (mean ",
                      FormatDuration(static_cast<int64_t>(latency.mean_ns())),
                      ", n=", latency.count(), ")");
}

std::string ErrorsText(const PhaseStats& phase) {
  if (phase.errors.empty()) return absl::StrCat("none (", phase.ok, " OK)");
  std::vector<std::string> parts;
  for (const auto& [code, count] : phase.errors) parts.push_back(absl::StrCat(code, " ", count));
  return absl::StrCat(phase.failed(), " of ", phase.ok + phase.failed(), ": ",
                      absl::StrJoin(parts, ", "));
}

std::string Percent(int64_t part, int64_t whole) {
  return whole > 0 ? absl::StrFormat("%.1f%%", 100.0 * part / whole) : std::string("-");
}

nlohmann::json LatencyJson(const LatencyHistogram& latency) {
  nlohmann::json json;
  json["count"] = latency.count();
  json["mean_us"] = latency.mean_ns() / 1e3;
  json["min_us"] = latency.min_ns() / 1e3;
  json["p50_us"] = latency.Percentile(0.5) / 1e3;
  json["p90_us"] = latency.Percentile(0.9) / 1e3;
  json["p99_us"] = latency.Percentile(0.99) / 1e3;
  json["p99_9_us"] = latency.Percentile(0.999) / 1e3;
  json["max_us"] = latency.max_ns() / 1e3;
  nlohmann::json buckets = nlohmann::json::array();
  for (const LatencyHistogram::Bucket& bucket : latency.NonEmptyBuckets()) {
    buckets.push_back({bucket.lower_ns / 1e3, bucket.upper_ns / 1e3, bucket.count});
  }
  json["buckets_us"] = std::move(buckets);  // [lower, upper, count]
  return json;
}

nlohmann::json PhaseJson(const PhaseStats& phase) {
  nlohmann::json json;
  json["seconds"] = phase.seconds;
  json["planned_seconds"] = phase.planned_seconds;
  json["stopped_early"] = phase.stopped_early;
  json["stop_reason"] = phase.stop_reason;
  json["layer_steps_ok"] = phase.ok;
  json["layer_steps_failed"] = phase.failed();
  json["tokens"] = phase.tokens;
  json["layer_steps_per_s"] = phase.LayerStepsPerSecond();
  json["payload_in_bytes"] = phase.bytes_in;
  json["payload_out_bytes"] = phase.bytes_out;
  json["payload_in_gbps"] = phase.GBpsIn();
  json["payload_out_gbps"] = phase.GBpsOut();
  json["latency"] = LatencyJson(phase.latency);
  nlohmann::json by_kind = nlohmann::json::object();
  for (const auto& [kind, latency] : phase.latency_by_kind) {
    by_kind[kind] = {{"count", latency.count()},
                     {"p50_us", latency.Percentile(0.5) / 1e3},
                     {"p99_us", latency.Percentile(0.99) / 1e3},
                     {"max_us", latency.max_ns() / 1e3}};
  }
  json["latency_by_layer_kind"] = std::move(by_kind);
  json["errors"] = phase.errors;
  return json;
}

}  // namespace

int64_t PhaseStats::failed() const {
  int64_t failed = 0;
  for (const auto& [code, count] : errors) failed += count;
  return failed;
}

double RunReport::DecodeStepsPerSecond() const {
  return config.layers > 0 ? attend.LayerStepsPerSecond() / config.layers : 0;
}

double RunReport::TokensPerSecond() const {
  return DecodeStepsPerSecond() * config.sessions * config.tokens_per_step;
}

double RunReport::LatencyOverhead() const {
  if (!echo.has_value() || echo->latency.count() == 0 || attend.latency.count() == 0) return 0;
  return static_cast<double>(attend.latency.Percentile(0.5)) /
         std::max<int64_t>(1, echo->latency.Percentile(0.5));
}

double RunReport::ThroughputOverhead() const {
  if (!echo.has_value() || attend.LayerStepsPerSecond() <= 0) return 0;
  return echo->LayerStepsPerSecond() / attend.LayerStepsPerSecond();
}

std::string FormatDuration(int64_t nanos) {
  const double ns = static_cast<double>(nanos);
  auto three = [](double value, const char* unit) {
    const char* format = value >= 100 ? "%.0f %s" : value >= 10 ? "%.1f %s" : "%.2f %s";
    return absl::StrFormat(format, value, unit);
  };
  if (ns < 1e3) return absl::StrCat(nanos, " ns");
  if (ns < 1e6) return three(ns / 1e3, "us");
  if (ns < 1e9) return three(ns / 1e6, "ms");
  return three(ns / 1e9, "s");
}

std::string StatusCodeName(int code) {
  static const char* const kNames[] = {"OK",
                                       "CANCELLED",
                                       "UNKNOWN",
                                       "INVALID_ARGUMENT",
                                       "DEADLINE_EXCEEDED",
                                       "NOT_FOUND",
                                       "ALREADY_EXISTS",
                                       "PERMISSION_DENIED",
                                       "RESOURCE_EXHAUSTED",
                                       "FAILED_PRECONDITION",
                                       "ABORTED",
                                       "OUT_OF_RANGE",
                                       "UNIMPLEMENTED",
                                       "INTERNAL",
                                       "UNAVAILABLE",
                                       "DATA_LOSS",
                                       "UNAUTHENTICATED"};
  if (code >= 0 && code < static_cast<int>(std::size(kNames))) return kNames[code];
  return absl::StrCat("CODE_", code);
}

std::string FormatReport(const RunReport& report) {
  const RunConfig& c = report.config;
  std::string text = absl::StrFormat(
      "mla_offload_loadtest: %s TP%d (H=%d per rank, runs at %d), %d node%s x %d session%s x %d "
      "token%s per step, %d of %d layers, prompt %d tokens\n",
      c.model, c.tp, c.heads, c.padded_heads, c.streams, c.streams == 1 ? "" : "s", c.sessions,
      c.sessions == 1 ? "" : "s", c.tokens_per_step, c.tokens_per_step == 1 ? "" : "s", c.layers,
      c.model_layers, c.prompt);
  std::vector<std::string> targets;
  for (size_t i = 0; i < c.targets.size(); ++i) {
    targets.push_back(i < c.sessions_per_target.size() && c.targets.size() > 1
                          ? absl::StrCat(c.targets[i], " (", c.sessions_per_target[i], " sessions)")
                          : c.targets[i]);
  }
  absl::StrAppend(&text, Line(c.targets.size() > 1 ? "servers" : "server",
                              absl::StrCat(absl::StrJoin(targets, ", "), ": ", c.server_version,
                                           ", backend ", c.backend)));
  const std::string load =
      c.mode == "open"
          ? absl::StrFormat("open loop, Poisson arrivals at %.1f layer steps/s (all nodes)", c.rate)
          : absl::StrFormat("closed loop, %d layer step%s in flight per node", c.concurrency,
                            c.concurrency == 1 ? "" : "s");
  const std::string plane =
      c.data_plane == "shm"        ? "; tensors in shared memory (--data_plane=shm), top-k inline"
      : c.data_plane == "cuda_ipc" ? "; tensors in device memory (--data_plane=cuda_ipc), top-k "
                                     "inline"
                                   : "";
  const std::string format =
      c.fp8_output ? "; FP8 output (--fp8_output: e4m3 with a scale a 128 dims, 516 bytes a head)"
                   : "";
  const PhaseStats& a = report.attend;
  const std::string spread =
      c.connections_per_stream > 1
          ? absl::StrFormat("; each node's stream over %d connections", c.connections_per_stream)
          : "";
  absl::StrAppend(
      &text, Line("load", absl::StrFormat("%s%s%s%s; warm-up %.1f s excluded; measured %.2f s (%s)",
                                          load, spread, plane, format, c.warmup_s, a.seconds,
                                          a.stop_reason)));
  if (a.planned_seconds > 0 && a.seconds > 1.05 * a.planned_seconds) {
    absl::StrAppend(&text, Line("", absl::StrFormat("(the window's last answer came %.2f s after "
                                                    "its end: the server fell behind)",
                                                    a.seconds - a.planned_seconds)));
  }
  absl::StrAppend(&text, Line("latency per layer step", LatencyText(a.latency)));
  if (a.latency_by_kind.size() > 1) {
    std::vector<std::string> parts;
    for (const auto& [kind, latency] : a.latency_by_kind) {
      parts.push_back(absl::StrCat(kind, " p50 ", FormatDuration(latency.Percentile(0.5)), " p99 ",
                                   FormatDuration(latency.Percentile(0.99)),
                                   " (n=", latency.count(), ")"));
    }
    absl::StrAppend(&text, Line("  by layer kind", absl::StrJoin(parts, ", ")));
  }
  absl::StrAppend(
      &text,
      Line("throughput", absl::StrFormat("%.1f layer steps/s = %.2f decode steps/s = %.1f tokens/s",
                                         a.LayerStepsPerSecond(), report.DecodeStepsPerSecond(),
                                         report.TokensPerSecond())));
  if (c.mode == "open" && c.rate > 0) {
    absl::StrAppend(&text, Line("", absl::StrFormat("(%.0f%% of the target rate answered)",
                                                    100.0 * a.LayerStepsPerSecond() / c.rate)));
  }
  absl::StrAppend(
      &text, Line("payload", absl::StrFormat("in %.4f GB/s (to server), out %.4f GB/s (to client)",
                                             a.GBpsIn(), a.GBpsOut())));
  if (a.server.count > 0) {
    const ServerTiming& t = a.server;
    absl::StrAppend(
        &text, Line("server time (mean)",
                    absl::StrFormat("queue %.0f us, plan %.0f us, upload %.0f us, prologue %.0f us, "
                                    "decode %.0f us, readback %.0f us, other %.0f us",
                                    t.queue_us, t.plan_us, t.upload_us, t.prologue_us, t.decode_us,
                                    t.readback_us, t.other_us())));
    absl::StrAppend(
        &text, Line("", absl::StrFormat("total %.0f us; %.1f tokens per batch; then serialise "
                                        "%.0f us; transport and client %.0f us (mean latency "
                                        "%.0f us - server total - serialise)",
                                        t.total_us, t.batch_tokens, t.serialize_us,
                                        TransportUs(a), a.latency.mean_ns() / 1e3)));
  }
  absl::StrAppend(&text, Line("errors", ErrorsText(a)));
  absl::StrAppend(&text, Line("prompts", absl::StrFormat("%d sessions x %d tokens created and "
                                                         "appended in %.2f s (not measured)",
                                                         c.streams * c.sessions, c.prompt,
                                                         report.prompt_seconds)));
  const KvUse& kv = report.kv;
  if (kv.used_at_end < 0) {
    absl::StrAppend(&text, Line("KV cache", "not read at the end (see the warning below)"));
  } else {
    absl::StrAppend(
        &text,
        Line("KV cache",
             absl::StrFormat(
                 "%d of %d blocks used at the end (%s; %.2f GB); this run's "
                 "prompts took %d, decoding %d more",
                 kv.used_at_end, kv.blocks_total, Percent(kv.used_at_end, kv.blocks_total),
                 static_cast<double>(kv.used_at_end) * kv.block_bytes / 1e9,
                 kv.used_after_prompt - kv.used_at_start, kv.used_at_end - kv.used_after_prompt)));
  }
  if (report.echo.has_value()) {
    const PhaseStats& e = *report.echo;
    absl::StrAppend(&text, Line("echo baseline", LatencyText(e.latency)));
    absl::StrAppend(&text, Line("", absl::StrFormat("%.1f messages/s of the same bytes; errors: %s",
                                                    e.LayerStepsPerSecond(), ErrorsText(e))));
    if (e.stopped_early) {
      absl::StrAppend(&text, Line("", absl::StrFormat("(measured %.2f s: %s)", e.seconds,
                                                      e.stop_reason)));
    }
    absl::StrAppend(&text,
                    Line("service overhead",
                         absl::StrFormat("p50 latency x%.2f of pure transport; "
                                         "throughput: echo moves x%.2f the layer steps/s",
                                         report.LatencyOverhead(), report.ThroughputOverhead())));
  }
  if (report.verify.enabled) {
    const VerifyStats& v = report.verify;
    std::string result;
    if (v.layer_steps == 0) {
      result = "no layer step was sampled (run longer or lower --verify_every)";
    } else if (v.failed_tokens == 0) {
      result = absl::StrFormat(
          "PASSED: %d layer steps (%d tokens) within spec section 7 tolerances (worst %.2f of the "
          "allowed error); %d of %d tokens bit-identical to the local CPU backend",
          v.layer_steps, v.tokens, v.max_excess, v.bit_identical, v.tokens);
    } else {
      result =
          absl::StrFormat("FAILED: %d of %d tokens out of tolerance (in %d layer steps); first: %s",
                          v.failed_tokens, v.tokens, v.layer_steps, v.first_failure);
    }
    absl::StrAppend(&text, Line("verify", result));
  }
  for (const std::string& error : report.cleanup_errors) {
    absl::StrAppend(&text, Line("WARNING", error));
  }
  return text;
}

nlohmann::json ReportJson(const RunReport& report) {
  const RunConfig& c = report.config;
  nlohmann::json json;
  json["config"] = {{"targets", c.targets},
                    {"sessions_per_target", c.sessions_per_target},
                    {"server_version", c.server_version},
                    {"backend", c.backend},
                    {"model", c.model},
                    {"tp", c.tp},
                    {"heads", c.heads},
                    {"padded_heads", c.padded_heads},
                    {"layers", c.layers},
                    {"model_layers", c.model_layers},
                    {"streams", c.streams},
                    {"sessions", c.sessions},
                    {"tokens_per_step", c.tokens_per_step},
                    {"prompt", c.prompt},
                    {"mode", c.mode},
                    {"concurrency", c.concurrency},
                    {"connections_per_stream", c.connections_per_stream},
                    {"data_plane", c.data_plane},
                    {"fp8_output", c.fp8_output},
                    {"rate", c.rate},
                    {"warmup_s", c.warmup_s},
                    {"duration_s", c.duration_s},
                    {"steps", c.steps}};
  json["stop_reason"] = report.attend.stop_reason;
  json["prompt_seconds"] = report.prompt_seconds;
  nlohmann::json attend = PhaseJson(report.attend);
  attend["decode_steps_per_s"] = report.DecodeStepsPerSecond();
  attend["tokens_per_s"] = report.TokensPerSecond();
  const ServerTiming& s = report.attend.server;
  attend["server_timing_mean_us"] = {
      {"count", s.count},
      {"queue", s.queue_us},
      {"plan", s.plan_us},
      {"upload", s.upload_us},
      {"prologue", s.prologue_us},
      {"decode", s.decode_us},
      {"readback", s.readback_us},
      {"other", s.other_us()},
      {"total", s.total_us},
      {"serialize", s.serialize_us},
      {"transport_and_client", TransportUs(report.attend)},
      {"batch_tokens", s.batch_tokens}};
  json["attend"] = std::move(attend);
  if (report.echo.has_value()) {
    json["echo"] = PhaseJson(*report.echo);
    json["overhead"] = {{"latency_p50_ratio", report.LatencyOverhead()},
                        {"throughput_ratio", report.ThroughputOverhead()}};
  }
  const KvUse& kv = report.kv;
  // null: not read.
  auto known = [](int64_t blocks) {
    return blocks < 0 ? nlohmann::json() : nlohmann::json(blocks);
  };
  json["kv"] = {{"blocks_total", kv.blocks_total},
                {"used_at_start", kv.used_at_start},
                {"used_after_prompt", kv.used_after_prompt},
                {"used_at_end", known(kv.used_at_end)},
                {"used_after_close", known(kv.used_after_close)},
                {"block_tokens", kv.block_tokens},
                {"bytes_per_token", kv.bytes_per_token},
                {"block_bytes", kv.block_bytes}};
  json["cleanup_errors"] = report.cleanup_errors;
  if (report.verify.enabled) {
    const VerifyStats& v = report.verify;
    json["verify"] = {{"passed", v.passed()},
                      {"layer_steps", v.layer_steps},
                      {"tokens", v.tokens},
                      {"failed_tokens", v.failed_tokens},
                      {"bit_identical_tokens", v.bit_identical},
                      {"max_excess", v.max_excess},
                      {"first_failure", v.first_failure}};
  }
  return json;
}

void ServerTiming::Add(const ServerTiming& other) {
  count += other.count;
  queue_us += other.queue_us;
  plan_us += other.plan_us;
  upload_us += other.upload_us;
  prologue_us += other.prologue_us;
  decode_us += other.decode_us;
  readback_us += other.readback_us;
  total_us += other.total_us;
  batch_tokens += other.batch_tokens;
  serialize_us += other.serialize_us;
}

ServerTiming ServerTiming::Mean() const {
  if (count == 0) return *this;
  const double n = static_cast<double>(count);
  return ServerTiming{count,          queue_us / n,      plan_us / n,     upload_us / n,
                      prologue_us / n, decode_us / n,    readback_us / n, total_us / n,
                      batch_tokens / n, serialize_us / n};
}

double ServerTiming::other_us() const {
  return total_us - queue_us - plan_us - upload_us - prologue_us - decode_us - readback_us;
}

void WriteStepCsv(const std::vector<StepRecord>& records, std::ostream& out) {
  out << "phase,stream,step,layer,due_s,latency_us,code,tokens,bytes_in,bytes_out,"
         "server_queue_us,server_prologue_us,server_decode_us,server_total_us,batch_tokens,"
         "server_plan_us,server_upload_us,server_readback_us,server_serialize_us\n";
  char line[512];
  for (const StepRecord& r : records) {
    std::snprintf(line, sizeof(line),
                  "%s,%d,%lld,%d,%.6f,%.1f,%s,%d,%lld,%lld,%.1f,%.1f,%.1f,%.1f,%d,%.1f,%.1f,%.1f,"
                  "%.1f\n",
                  r.phase == 'e' ? "echo" : "attend", r.stream, static_cast<long long>(r.step),
                  r.layer, r.due_s, r.latency_us, StatusCodeName(r.code).c_str(), r.tokens,
                  static_cast<long long>(r.bytes_in), static_cast<long long>(r.bytes_out),
                  r.queue_us, r.prologue_us, r.decode_us, r.server_total_us, r.batch_tokens,
                  r.plan_us, r.upload_us, r.readback_us, r.serialize_us);
    out << line;
  }
}

}  // namespace mla::loadtest

// mla_offload_loadtest: sizes an mla-offload deployment. Simulates serving
// nodes decoding DeepSeek-V4 layer by layer against one or more servers and
// reports per-layer-step latency percentiles, throughput, payload rates,
// errors by status code, the server's own time breakdown and KV use; writes
// JSON, CSV and a latency picture. See README.md beside this file.
#include <unistd.h>

#include <atomic>
#include <csignal>
#include <cstdio>
#include <fstream>
#include <string>
#include <vector>

#include "absl/flags/flag.h"
#include "absl/flags/parse.h"
#include "absl/flags/usage.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "client/connect_flags.h"
#include "client/loadtest/command_line.h"
#include "client/loadtest/driver.h"
#include "client/loadtest/plot.h"
#include "client/loadtest/report.h"
#include "kernels/model_profile.h"

ABSL_FLAG(std::vector<std::string>, target, {"127.0.0.1:50051"},
          "HOST:PORT of a server; repeat the flag or give a comma list for several servers "
          "(each session is placed on one by rendezvous hashing of its key and stays there).");
ABSL_FLAG(std::string, model, "deepseek-v4-flash",
          "Model profile of the sessions (built in: deepseek-v4-flash, deepseek-v4-pro).");
ABSL_FLAG(int, tp, 8,
          "Tensor-parallel degree: each layer step carries H = h_total / tp query heads (the "
          "heads of one rank; node n sends the heads of rank n mod tp).");
ABSL_FLAG(int, layers, 0,
          "L: attention layers each decode step runs, the model's first L; 0 = all (44 for "
          "V4-Flash, 62 for V4-Pro, MTP layer included). Prompts fill every layer regardless.");
ABSL_FLAG(int, streams, 1,
          "N: simulated serving nodes; each has its own sessions, its own connection and one "
          "Attend stream per server.");
ABSL_FLAG(int, sessions, 8, "S: sessions (sequences) per node, all decoded in every layer step.");
ABSL_FLAG(int, tokens_per_step, 1,
          "Tokens each session decodes per step (1; more for speculative or MTP decoding): a "
          "layer step carries T = S x tokens_per_step tokens.");
ABSL_FLAG(int, prompt, 512,
          "P: prompt tokens appended to every session (AppendKV) before decoding.");
ABSL_FLAG(int, concurrency, 1,
          "Closed loop: layer steps each node keeps in flight (sent, not yet answered).");
ABSL_FLAG(double, rate, 0,
          "Open loop when > 0: target layer steps per second over all nodes (at most 1e7), "
          "Poisson arrivals; latency counts from each step's scheduled arrival, so falling "
          "behind shows.");
ABSL_FLAG(double, warmup_s, 1.0,
          "Seconds at the start whose layer steps are not measured (at most 3600).");
ABSL_FLAG(double, duration_s, 10.0,
          "Seconds measured after the warm-up, at most 604800 (a week), unless --steps is given.");
ABSL_FLAG(int64_t, steps, 0,
          "When > 0: each node runs this many measured decode steps (L layer steps each) after "
          "the warm-up, instead of --duration_s.");
ABSL_FLAG(bool, baseline, false,
          "After the Attend load, send the same number of bytes per layer step with the same "
          "schedule to the server's Echo RPC, and report the service's overhead over pure "
          "transport.");
ABSL_FLAG(bool, verify, false,
          "Keep the answers of sampled layer steps and recompute them locally with the CPU "
          "backend and the float64 reference; out and lse must be within spec section 7 "
          "tolerances. Mismatches are reported and make the exit status 1.");
ABSL_FLAG(int, verify_every, 17, "--verify samples every N-th layer step of each node.");
ABSL_FLAG(int, verify_max, 32, "--verify checks at most this many layer steps (all nodes).");
ABSL_FLAG(int, verify_tokens, 4, "--verify checks this many tokens of each sampled layer step.");
ABSL_FLAG(bool, derotate, false, "Ask the server to de-rotate outputs (derotate_output).");
ABSL_FLAG(bool, fp8_output, false,
          "Ask for the FP8 output (fp8_output): e4m3 out with one UE8M0 scale per 128 dims, 516 "
          "bytes a head back instead of bf16's 1024 (counted so in the payload out); --verify "
          "holds it to the FP8 tolerance of spec section 7.");
ABSL_FLAG(uint64_t, seed, 1, "Seed of the synthetic data, session keys and arrivals.");
ABSL_FLAG(double, step_timeout_s, 30,
          "A layer step not answered within this many seconds (at most 3600) is "
          "DEADLINE_EXCEEDED.");
ABSL_FLAG(bool, connection_per_node, true,
          "Each node gets its own TCP connection to each server (as real serving nodes would); "
          "false: all nodes share one.");
ABSL_FLAG(int, connections_per_stream, 1,
          "TCP connections each node's Attend stream is spread over (its Echo baseline's too, "
          "so that it compares like with like), 1 to 16. One HTTP/2 connection's reads and "
          "writes are serialised, so a node with several layer steps in flight (--concurrency) "
          "may move more over two; messages on one session layer stay on one connection, in "
          "order.");
ABSL_FLAG(std::string, data_plane, "inline",
          "How the tensors travel: inline (in the gRPC messages), shm or cuda_ipc (the same-host "
          "data plane: each node keeps a region on each server, POSIX shared memory or device "
          "memory of --cuda_device, writes q, kv and the compressed rows there and has out and "
          "lse written there; only the top-k and the message's fields go through gRPC, and the "
          "Echo baseline echoes only those bytes). Both need a server on this host (loopback or "
          "a unix: target) and the closed loop; cuda_ipc needs a --backend=cuda server and "
          "writes a slot's tensors once, as a model's kernels would have left them there "
          "(every step with --verify).");
ABSL_FLAG(int, cuda_device, 0,
          "--data_plane=cuda_ipc: the GPU of this host that the regions are allocated on (the "
          "server's GPU, or one it reaches by peer access).");
ABSL_FLAG(bool, progress, true,
          "A one-line progress display on stderr (rewritten in place on a terminal, a line every "
          "5 s otherwise).");
ABSL_FLAG(std::string, json_out, "", "Write the report as JSON to this file.");
ABSL_FLAG(std::string, csv_out, "",
          "Write one CSV line per measured layer step (attend and echo) to this file.");
ABSL_FLAG(std::string, plot_out, "",
          "Draw the latency histogram and CDF into this .png or .svg file (needs gnuplot, "
          "checked before the run).");
ABSL_FLAG(std::string, gnuplot, "gnuplot",
          "The gnuplot program for --plot_out (a path or a name in $PATH).");

namespace mla::loadtest {
namespace {

// 128 + SIGINT, as a shell reports a process Ctrl-C ended.
constexpr int kExitInterruptedBeforeWindow = 130;

std::atomic<bool> g_interrupted{false};

// The first Ctrl-C ends the run early with a report (before the measured
// window: without one, after closing the sessions); a second one kills.
void OnInterrupt(int) {
  g_interrupted = true;
  std::signal(SIGINT, SIG_DFL);
}

int Main(const std::vector<std::string>& repeated_targets) {
  LoadOptions options;
  options.targets = repeated_targets.size() > 1 ? repeated_targets : absl::GetFlag(FLAGS_target);
  options.model = absl::GetFlag(FLAGS_model);
  options.tp = absl::GetFlag(FLAGS_tp);
  options.layers = absl::GetFlag(FLAGS_layers);
  options.streams = absl::GetFlag(FLAGS_streams);
  options.sessions = absl::GetFlag(FLAGS_sessions);
  options.tokens_per_step = absl::GetFlag(FLAGS_tokens_per_step);
  options.prompt = absl::GetFlag(FLAGS_prompt);
  options.concurrency = absl::GetFlag(FLAGS_concurrency);
  options.rate = absl::GetFlag(FLAGS_rate);
  options.warmup_s = absl::GetFlag(FLAGS_warmup_s);
  options.duration_s = absl::GetFlag(FLAGS_duration_s);
  options.steps = absl::GetFlag(FLAGS_steps);
  options.baseline = absl::GetFlag(FLAGS_baseline);
  options.verify = absl::GetFlag(FLAGS_verify);
  options.verify_every = absl::GetFlag(FLAGS_verify_every);
  options.verify_max = absl::GetFlag(FLAGS_verify_max);
  options.verify_tokens = absl::GetFlag(FLAGS_verify_tokens);
  options.derotate = absl::GetFlag(FLAGS_derotate);
  options.fp8_output = absl::GetFlag(FLAGS_fp8_output);
  options.seed = absl::GetFlag(FLAGS_seed);
  options.step_timeout_s = absl::GetFlag(FLAGS_step_timeout_s);
  options.connection_per_node = absl::GetFlag(FLAGS_connection_per_node);
  options.connections_per_stream = absl::GetFlag(FLAGS_connections_per_stream);
  options.data_plane = absl::GetFlag(FLAGS_data_plane);
  options.cuda_device = absl::GetFlag(FLAGS_cuda_device);
  options.progress = absl::GetFlag(FLAGS_progress);
  options.progress_tty = isatty(fileno(stderr)) != 0;
  options.interrupted = &g_interrupted;
  absl::StatusOr<client::ConnectOptions> connect = client::ConnectOptionsFromFlags();
  if (!connect.ok()) {
    std::fprintf(stderr, "mla_offload_loadtest: %s\n",
                 std::string(connect.status().message()).c_str());
    return 2;
  }
  options.connect = *std::move(connect);
  if (absl::Status status = ValidateOptions(options); !status.ok()) {
    std::fprintf(stderr, "mla_offload_loadtest: %s\n", std::string(status.message()).c_str());
    return 2;
  }
  const std::string plot_out = absl::GetFlag(FLAGS_plot_out);
  if (!plot_out.empty()) {
    // A wrong extension or a missing gnuplot is known before the run; say so
    // before spending it.
    absl::Status plottable = GnuplotTerminal(plot_out).status();
    if (plottable.ok()) plottable = FindGnuplot(absl::GetFlag(FLAGS_gnuplot)).status();
    if (!plottable.ok()) {
      std::fprintf(stderr, "mla_offload_loadtest: %s\n", std::string(plottable.message()).c_str());
      return 2;
    }
  }

  std::signal(SIGINT, OnInterrupt);
  absl::StatusOr<RunOutput> run = RunLoadTest(options);
  if (!run.ok()) {
    if (run.status().code() == absl::StatusCode::kCancelled && g_interrupted) {
      std::fprintf(stderr, "mla_offload_loadtest: %s\n",
                   std::string(run.status().message()).c_str());
      return kExitInterruptedBeforeWindow;
    }
    std::fprintf(stderr, "mla_offload_loadtest: %s\n", run.status().ToString().c_str());
    return 1;
  }
  const RunReport& report = run->report;
  std::printf("%s", FormatReport(report).c_str());
  std::fflush(stdout);

  int exit_code = 0;
  for (const std::string& error : report.cleanup_errors) {
    std::fprintf(stderr, "mla_offload_loadtest: after the run: %s\n", error.c_str());
    exit_code = 1;
  }
  const std::string json_out = absl::GetFlag(FLAGS_json_out);
  if (!json_out.empty()) {
    std::ofstream file(json_out);
    file << ReportJson(report).dump(2) << "\n";
    file.close();
    if (!file) {
      std::fprintf(stderr, "mla_offload_loadtest: cannot write --json_out=%s\n", json_out.c_str());
      exit_code = 1;
    }
  }
  const std::string csv_out = absl::GetFlag(FLAGS_csv_out);
  if (!csv_out.empty()) {
    std::ofstream file(csv_out);
    WriteStepCsv(run->records, file);
    file.close();
    if (!file) {
      std::fprintf(stderr, "mla_offload_loadtest: cannot write --csv_out=%s\n", csv_out.c_str());
      exit_code = 1;
    }
  }
  if (!plot_out.empty()) {
    std::vector<PlotSeries> series = {{"Attend", &report.attend.latency}};
    if (report.echo.has_value()) series.push_back({"Echo, same bytes", &report.echo->latency});
    const std::string title = absl::StrFormat(
        "%s TP%d, %d node(s) x %d session(s), %s loop: latency per layer step", report.config.model,
        report.config.tp, report.config.streams, report.config.sessions, report.config.mode);
    if (absl::Status status =
            WriteLatencyPlot(series, title, plot_out, absl::GetFlag(FLAGS_gnuplot));
        !status.ok()) {
      std::fprintf(stderr, "mla_offload_loadtest: %s\n", std::string(status.message()).c_str());
      exit_code = 1;
    }
  }
  if (report.attend.ok == 0) {
    std::fprintf(stderr,
                 "mla_offload_loadtest: no layer step was answered in the measured window\n");
    exit_code = 1;
  }
  if (options.verify && !report.verify.passed()) {
    std::fprintf(stderr,
                 "mla_offload_loadtest: --verify failed: %lld of %lld tokens out of tolerance%s\n",
                 static_cast<long long>(report.verify.failed_tokens),
                 static_cast<long long>(report.verify.tokens),
                 report.verify.layer_steps == 0 ? " (no layer step was sampled)" : "");
    exit_code = 1;
  }
  return exit_code;
}

}  // namespace
}  // namespace mla::loadtest

int main(int argc, char** argv) {
  absl::SetProgramUsageMessage(
      "Load test of mla_offload_server: N simulated serving nodes, each with S sessions, decode\n"
      "L layers per step of a DeepSeek-V4 profile at a tensor-parallel degree (one Attend\n"
      "message per layer step, H = heads / tp), after a P-token prompt. Closed loop\n"
      "(--concurrency layer steps in flight per node) or open loop (--rate layer steps/s,\n"
      "Poisson arrivals). Reports latency per layer step (p50/p90/p99/p99.9/max), decode\n"
      "steps/s, tokens/s, payload GB/s, errors by status code, the server's time breakdown\n"
      "and KV use; --baseline compares with Echo of the same bytes, --verify recomputes\n"
      "sampled steps locally. Ctrl-C ends the run early and still reports (before the\n"
      "window, while sessions are created, prompts appended or in the warm-up: closes\n"
      "the sessions and exits 130 without a report).\n"
      "Exit status: 0 done; 1 failed, --verify found mismatches, or closing the sessions\n"
      "failed after the run (the report says so); 2 bad flags (checked before the run,\n"
      "--plot_out's gnuplot included); 130 interrupted before anything was measured.\n\n"
      "  mla_offload_loadtest --target=127.0.0.1:50051 --model=deepseek-v4-flash --tp=8 \\\n"
      "      --streams=2 --sessions=8 --duration_s=10 --baseline --verify \\\n"
      "      --json_out=run.json --csv_out=run.csv --plot_out=latency.png");
  const std::vector<std::string> targets = mla::loadtest::RepeatedFlagValues(argc, argv, "target");
  absl::ParseCommandLine(argc, argv);
  return mla::loadtest::Main(targets);
}

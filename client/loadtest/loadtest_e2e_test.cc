// mla_offload_loadtest against the real mla_offload_server (CPU backend),
// both as child processes over loopback (client/test_processes.h): short
// closed- and open-loop runs with --verify, the Echo baseline and every
// output file, a full KV cache (mid-run and mid-prompt), sessions the server
// expired before the end, Ctrl-C (in the window and during setup), and the
// exits of runs that cannot go.
//
// The numbers are checked for consistency with each other and with what the
// run was told to do (counts of layer steps and tokens, CSV lines against the
// JSON, percentiles in order, zero errors, verification passed, KV freed),
// not against fixed figures: CI has two cores and other work.
#include <chrono>
#include <cstdint>
#include <cstdlib>
#include <fstream>
#include <map>
#include <memory>
#include <sstream>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "absl/time/time.h"
#include "client/mla_client.h"
#include "client/test_processes.h"
#include "tests/support/test_certs.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "nlohmann/json.hpp"

namespace mla::loadtest {
namespace {

using ::testing::HasSubstr;
using ::testing::Not;

std::string OutDir() {
  const char* dir = std::getenv("TEST_UNDECLARED_OUTPUTS_DIR");
  if (dir == nullptr) dir = std::getenv("TEST_TMPDIR");
  return dir != nullptr ? dir : "/tmp";
}

std::string ReadFile(const std::string& path) {
  std::ifstream file(path, std::ios::binary);
  std::stringstream text;
  text << file.rdbuf();
  return text.str();
}

// The server (client/test_processes.h: CPU backend, a free loopback port),
// with `flags` after its defaults.
std::unique_ptr<client::TestServer> StartServer(const std::vector<std::string>& flags = {}) {
  std::vector<std::string> all = {"--kv_cache_gb=0.2", "--max_position=4096"};
  all.insert(all.end(), flags.begin(), flags.end());
  absl::StatusOr<std::unique_ptr<client::TestServer>> server = client::TestServer::Start(all);
  EXPECT_TRUE(server.ok()) << server.status();
  return server.ok() ? *std::move(server) : nullptr;
}

// KV blocks the server holds now (GetServerInfo), -1 when it does not answer.
int64_t KvBlocksUsed(const client::TestServer& server) {
  absl::StatusOr<std::unique_ptr<client::Client>> connected =
      client::Client::Connect(server.target());
  if (!connected.ok()) return -1;
  absl::StatusOr<mla_offload::v1::ServerInfo> info = (*connected)->GetServerInfo();
  EXPECT_TRUE(info.ok()) << info.status();
  return info.ok() ? info->kv_blocks_used() : -1;
}

struct LoadTestRun {
  int exit_code = -1;
  std::string output;  // stdout (the report), then stderr (progress, errors)
};

// Runs the load test to its end; `prefix` goes before the binary (e.g. a
// `timeout` that interrupts it).
LoadTestRun LoadTest(const std::vector<std::string>& flags,
                     const std::vector<std::string>& prefix = {}) {
  LoadTestRun run;
  absl::StatusOr<std::string> binary = client::RunfilePath("client/loadtest/mla_offload_loadtest");
  EXPECT_TRUE(binary.ok()) << binary.status();
  if (!binary.ok()) return run;
  std::vector<std::string> argv = prefix;
  argv.push_back(*binary);
  argv.insert(argv.end(), flags.begin(), flags.end());
  absl::StatusOr<client::CommandResult> result = client::RunCommand(argv, absl::Seconds(120));
  EXPECT_TRUE(result.ok()) << result.status();
  if (!result.ok()) return run;
  run.exit_code = result->exit_code;
  run.output = result->out + result->err;
  return run;
}

// The CSV's lines by column name.
std::vector<std::map<std::string, std::string>> ReadCsv(const std::string& path) {
  std::vector<std::map<std::string, std::string>> rows;
  std::istringstream text(ReadFile(path));
  std::string line;
  std::getline(text, line);
  const std::vector<std::string> header = absl::StrSplit(line, ',');
  while (std::getline(text, line)) {
    const std::vector<std::string> cells = absl::StrSplit(line, ',');
    EXPECT_EQ(cells.size(), header.size()) << line;
    std::map<std::string, std::string> row;
    for (size_t i = 0; i < header.size() && i < cells.size(); ++i) row[header[i]] = cells[i];
    rows.push_back(std::move(row));
  }
  return rows;
}

// Latency figures in order and positive.
void ExpectSaneLatency(const nlohmann::json& latency) {
  const double p50 = latency["p50_us"], p90 = latency["p90_us"], p99 = latency["p99_us"];
  const double p999 = latency["p99_9_us"], max = latency["max_us"], min = latency["min_us"];
  EXPECT_GT(min, 0);
  EXPECT_LE(min, p50);
  EXPECT_LE(p50, p90);
  EXPECT_LE(p90, p99);
  EXPECT_LE(p99, p999);
  EXPECT_LE(p999, max);
  EXPECT_LT(max, 30e6);  // well below the step timeout
  int64_t buckets = 0;
  for (const auto& bucket : latency["buckets_us"]) buckets += bucket[2].get<int64_t>();
  EXPECT_EQ(buckets, latency["count"].get<int64_t>());
}

TEST(LoadTestEndToEnd, ClosedLoopWithBaselineVerifyAndEveryOutput) {
  std::unique_ptr<client::TestServer> server = StartServer();
  ASSERT_NE(server, nullptr);
  const std::string dir = OutDir();
  const std::string json_path = dir + "/closed.json", csv_path = dir + "/closed.csv",
                    png_path = dir + "/closed.png";
  const LoadTestRun run =
      LoadTest({"--target=" + server->target(), "--model=deepseek-v4-flash", "--tp=8", "--layers=4",
                "--streams=2", "--sessions=2", "--prompt=200", "--concurrency=2", "--warmup_s=0.3",
                "--duration_s=1.5", "--baseline", "--verify", "--verify_every=3", "--verify_max=8",
                "--verify_tokens=2", "--json_out=" + json_path, "--csv_out=" + csv_path,
                "--plot_out=" + png_path});
  ASSERT_EQ(run.exit_code, 0) << run.output;
  EXPECT_THAT(run.output, HasSubstr("latency per layer step   p50 "));
  EXPECT_THAT(run.output, HasSubstr("errors                   none"));
  EXPECT_THAT(run.output, HasSubstr("verify                   PASSED: 8 layer steps (16 tokens)"));
  EXPECT_THAT(run.output, HasSubstr("service overhead"));

  const nlohmann::json json = nlohmann::json::parse(ReadFile(json_path));
  const nlohmann::json& attend = json["attend"];
  const int64_t ok = attend["layer_steps_ok"];
  EXPECT_GT(ok, 10);
  EXPECT_EQ(attend["layer_steps_failed"], 0);
  EXPECT_EQ(attend["tokens"], ok * 2);  // 2 sessions x 1 token
  // The window: 1.5 s of schedule, and the answers of its last layer steps.
  const double seconds = attend["seconds"];
  EXPECT_DOUBLE_EQ(attend["planned_seconds"].get<double>(), 1.5);
  EXPECT_GE(seconds, 1.5);
  EXPECT_LT(seconds, 1.5 + attend["latency"]["max_us"].get<double>() / 1e6 + 0.01);
  EXPECT_NEAR(attend["decode_steps_per_s"].get<double>(), ok / seconds / 4, 1e-9);
  EXPECT_NEAR(attend["tokens_per_s"].get<double>(), ok / seconds / 4 * 2, 1e-9);
  // q 2 x 8 x 1 KiB + kv 2 x 1 KiB each, at least; out 2 x 8 x 1 KiB.
  EXPECT_GE(attend["payload_in_bytes"].get<int64_t>(), ok * 18 * 1024);
  EXPECT_GE(attend["payload_out_bytes"].get<int64_t>(), ok * 16 * 1024);
  EXPECT_EQ(attend["latency"]["count"], ok);
  ExpectSaneLatency(attend["latency"]);
  const nlohmann::json& timing = attend["server_timing_mean_us"];
  EXPECT_EQ(timing["count"], ok);
  EXPECT_GT(timing["decode"].get<double>(), 0);
  for (const char* stage : {"plan", "upload", "prologue", "serialize"}) {
    EXPECT_GT(timing[stage].get<double>(), 0) << stage;
  }
  // The CPU backend writes out and lse in place: nothing to read back.
  EXPECT_GE(timing["readback"].get<double>(), 0);
  EXPECT_GE(timing["other"].get<double>(), 0);
  EXPECT_GT(timing["transport_and_client"].get<double>(), 0);
  EXPECT_LE(timing["total"].get<double>() + timing["serialize"].get<double>(),
            attend["latency"]["mean_us"].get<double>());
  EXPECT_GE(timing["batch_tokens"].get<double>(), 2);

  ASSERT_TRUE(json.contains("echo"));
  EXPECT_GT(json["echo"]["layer_steps_ok"].get<int64_t>(), 0);
  EXPECT_EQ(json["echo"]["layer_steps_failed"], 0);
  ExpectSaneLatency(json["echo"]["latency"]);
  EXPECT_GT(json["overhead"]["latency_p50_ratio"].get<double>(), 0);

  EXPECT_TRUE(json["verify"]["passed"].get<bool>());
  EXPECT_EQ(json["verify"]["layer_steps"], 8);
  EXPECT_EQ(json["verify"]["tokens"], 16);
  EXPECT_EQ(json["verify"]["failed_tokens"], 0);
  // The server runs the same CPU backend: bit for bit.
  EXPECT_EQ(json["verify"]["bit_identical_tokens"], 16);

  const nlohmann::json& kv = json["kv"];
  EXPECT_GT(kv["used_after_prompt"].get<int64_t>(), kv["used_at_start"].get<int64_t>());
  EXPECT_GE(kv["used_at_end"].get<int64_t>(), kv["used_after_prompt"].get<int64_t>());
  EXPECT_EQ(kv["used_after_close"], kv["used_at_start"]);
  EXPECT_GT(kv["blocks_total"].get<int64_t>(), kv["used_at_end"].get<int64_t>());

  // One CSV line per measured layer step of each phase, all OK, each with the
  // payload of its layer step: 2 tokens of q (8 heads) and kv, the new
  // compressed rows, and on the C4A layer the top-k (512 int32 a token);
  // Echo sends the same bytes.
  const int kRatios[] = {0, 0, 4, 128};  // V4-Flash layers 0..3
  const std::vector<std::map<std::string, std::string>> rows = ReadCsv(csv_path);
  int64_t attend_rows = 0, echo_rows = 0;
  for (const auto& row : rows) {
    EXPECT_EQ(row.at("code"), "OK");
    const int layer = std::stoi(row.at("layer"));
    const int position = 200 + std::stoi(row.at("step"));
    const int ratio = kRatios[layer];
    const int64_t new_rows = ratio > 0 ? (position + 1) / ratio - position / ratio : 0;
    const int64_t expected_in =
        2 * (8 + 1) * 1024 + 2 * new_rows * 1024 + (ratio == 4 ? 2 * 512 * 4 : 0);
    EXPECT_EQ(std::stoll(row.at("bytes_in")), expected_in) << row.at("phase") << " layer " << layer;
    const int64_t out = std::stoll(row.at("bytes_out"));
    if (row.at("phase") == "attend") {
      // out [2, 8, 512] bf16, and lse [2, 8] fp32 on the steps sampled for --verify.
      EXPECT_TRUE(out == 2 * 8 * 1024 || out == 2 * 8 * 1024 + 2 * 8 * 4) << out;
    } else {
      EXPECT_EQ(out, expected_in);
    }
    if (row.at("phase") == "attend") {
      EXPECT_GT(std::stod(row.at("server_serialize_us")), 0) << "step " << row.at("step");
    }
    (row.at("phase") == "attend" ? attend_rows : echo_rows) += 1;
    EXPECT_GT(std::stod(row.at("latency_us")), 0);
    EXPECT_GE(std::stod(row.at("due_s")), 0);
    EXPECT_LT(std::stoi(row.at("layer")), 4);
  }
  EXPECT_EQ(attend_rows, ok);
  EXPECT_EQ(echo_rows, json["echo"]["layer_steps_ok"].get<int64_t>());

  const std::string png = ReadFile(png_path);
  ASSERT_GT(png.size(), 1000u);
  EXPECT_EQ(png.substr(1, 3), "PNG");
}

// Each node's stream (and its Echo baseline) spread over two connections,
// with four layer steps in flight: answers verified and none failed (the
// steps of one session layer stay on one connection), and the report and
// JSON say so.
TEST(LoadTestEndToEnd, StreamsSpreadOverConnections) {
  std::unique_ptr<client::TestServer> server = StartServer();
  ASSERT_NE(server, nullptr);
  const std::string json_path = OutDir() + "/spread.json";
  const LoadTestRun run = LoadTest(
      {"--target=" + server->target(), "--model=deepseek-v4-flash", "--tp=8", "--layers=4",
       "--streams=2", "--sessions=2", "--prompt=200", "--concurrency=4",
       "--connections_per_stream=2", "--warmup_s=0.2", "--duration_s=1", "--baseline", "--verify",
       "--verify_every=3", "--verify_max=8", "--verify_tokens=2", "--json_out=" + json_path});
  ASSERT_EQ(run.exit_code, 0) << run.output;
  EXPECT_THAT(run.output, HasSubstr("each node's stream over 2 connections"));
  EXPECT_THAT(run.output, HasSubstr("errors                   none"));
  EXPECT_THAT(run.output, HasSubstr("verify                   PASSED"));
  const nlohmann::json json = nlohmann::json::parse(ReadFile(json_path));
  EXPECT_EQ(json["config"]["connections_per_stream"], 2);
  EXPECT_EQ(json["attend"]["layer_steps_failed"], 0);
  EXPECT_GT(json["attend"]["layer_steps_ok"].get<int64_t>(), 10);
  EXPECT_EQ(json["echo"]["layer_steps_failed"], 0);
}

// The same-host data plane: each node's tensors in a shared-memory region
// on the server, answers written there, three layer steps in flight over
// two connections. Verified answers, none failed; the report and JSON say
// which plane, and the Echo baseline echoes only what went inline (the
// top-k of the C4A layer, none for the others).
TEST(LoadTestEndToEnd, TensorsInSharedMemory) {
  std::unique_ptr<client::TestServer> server = StartServer();
  ASSERT_NE(server, nullptr);
  const std::string json_path = OutDir() + "/shm.json", csv_path = OutDir() + "/shm.csv";
  const LoadTestRun run = LoadTest(
      {"--target=" + server->target(), "--model=deepseek-v4-flash", "--tp=8", "--layers=4",
       "--streams=2", "--sessions=2", "--prompt=200", "--concurrency=3",
       "--connections_per_stream=2", "--data_plane=shm", "--warmup_s=0.2", "--duration_s=1",
       "--baseline", "--verify", "--verify_every=3", "--verify_max=8", "--verify_tokens=2",
       "--json_out=" + json_path, "--csv_out=" + csv_path});
  ASSERT_EQ(run.exit_code, 0) << run.output;
  EXPECT_THAT(run.output, HasSubstr("tensors in shared memory (--data_plane=shm)"));
  EXPECT_THAT(run.output, HasSubstr("errors                   none"));
  EXPECT_THAT(run.output, HasSubstr("verify                   PASSED: 8 layer steps"));
  const nlohmann::json json = nlohmann::json::parse(ReadFile(json_path));
  EXPECT_EQ(json["config"]["data_plane"], "shm");
  EXPECT_EQ(json["attend"]["layer_steps_failed"], 0);
  EXPECT_GT(json["attend"]["layer_steps_ok"].get<int64_t>(), 10);
  EXPECT_EQ(json["echo"]["layer_steps_failed"], 0);
  const int kTopkBytes = 2 * 512 * 4;  // V4-Flash's C4A layer (2): 2 tokens x 512 entries
  for (const auto& row : ReadCsv(csv_path)) {
    const int64_t in = std::stoll(row.at("bytes_in")), out = std::stoll(row.at("bytes_out"));
    if (row.at("phase") == "echo") {
      EXPECT_EQ(in, row.at("layer") == "2" ? kTopkBytes : 0) << "layer " << row.at("layer");
    } else {
      // q and kv in the region, out [2, 8, 512] bf16 (and lse) written there.
      EXPECT_GE(in, 2 * (8 + 1) * 1024) << "layer " << row.at("layer");
      EXPECT_TRUE(out == 2 * 8 * 1024 || out == 2 * 8 * 1024 + 2 * 8 * 4) << out;
    }
  }
}

// --fp8_output, inline and in shared memory: every answer is e4m3 out with
// its scales (516 bytes a head, counted so), --verify holds the sampled
// ones to the FP8 rule and finds them the CPU backend's bytes, and the
// report and JSON say which output was asked.
TEST(LoadTestEndToEnd, Fp8OutputInlineAndInSharedMemory) {
  std::unique_ptr<client::TestServer> server = StartServer();
  ASSERT_NE(server, nullptr);
  for (const std::string plane : {"inline", "shm"}) {
    SCOPED_TRACE(plane);
    const std::string json_path = OutDir() + "/fp8_" + plane + ".json";
    const std::string csv_path = OutDir() + "/fp8_" + plane + ".csv";
    const LoadTestRun run = LoadTest(
        {"--target=" + server->target(), "--model=deepseek-v4-flash", "--tp=8", "--layers=4",
         "--streams=2", "--sessions=2", "--prompt=200", "--concurrency=2",
         "--data_plane=" + plane, "--fp8_output", "--derotate", "--warmup_s=0.2",
         "--duration_s=1", "--verify", "--verify_every=3", "--verify_max=8", "--verify_tokens=2",
         "--json_out=" + json_path, "--csv_out=" + csv_path});
    ASSERT_EQ(run.exit_code, 0) << run.output;
    EXPECT_THAT(run.output, HasSubstr("FP8 output (--fp8_output"));
    EXPECT_THAT(run.output, HasSubstr("errors                   none"));
    EXPECT_THAT(run.output, HasSubstr("verify                   PASSED: 8 layer steps (16 tokens)"));
    const nlohmann::json json = nlohmann::json::parse(ReadFile(json_path));
    EXPECT_TRUE(json["config"]["fp8_output"].get<bool>());
    EXPECT_EQ(json["verify"]["failed_tokens"], 0);
    EXPECT_EQ(json["verify"]["bit_identical_tokens"], 16);
    for (const auto& row : ReadCsv(csv_path)) {
      // out [2, 8, 512] e4m3 and its scales [2, 8, 4], and lse [2, 8] on
      // the steps sampled for --verify.
      const int64_t out = std::stoll(row.at("bytes_out"));
      EXPECT_TRUE(out == 2 * 8 * 516 || out == 2 * 8 * 516 + 2 * 8 * 4) << out;
    }
  }
}

// CUDA IPC regions against a server without a GPU (or from a machine
// without one): the setup fails saying why, and leaves no session behind.
TEST(LoadTestEndToEnd, CudaIpcWithoutAGpuServerFailsAtSetup) {
  std::unique_ptr<client::TestServer> server = StartServer();
  ASSERT_NE(server, nullptr);
  const LoadTestRun run = LoadTest({"--target=" + server->target(), "--model=deepseek-v4-flash",
                                    "--tp=8", "--layers=4", "--sessions=2", "--prompt=64",
                                    "--data_plane=cuda_ipc", "--duration_s=1"});
  EXPECT_NE(run.exit_code, 0) << run.output;
  EXPECT_THAT(run.output, HasSubstr("--data_plane=cuda_ipc: making a node's region"));
  EXPECT_EQ(KvBlocksUsed(*server), 0) << "the failed setup left sessions";
}

TEST(LoadTestEndToEnd, OpenLoopStepsAndTwoServers) {
  std::unique_ptr<client::TestServer> first = StartServer(), second = StartServer();
  ASSERT_NE(first, nullptr);
  ASSERT_NE(second, nullptr);
  const std::string dir = OutDir();
  const std::string json_path = dir + "/open.json", svg_path = dir + "/open.svg";
  // 2 nodes x 5 decode steps x 3 layers: exactly 30 measured layer steps.
  const LoadTestRun run = LoadTest(
      {"--target=" + first->target(), "--target", second->target(), "--model=deepseek-v4-pro",
       "--tp=16", "--layers=3", "--streams=2", "--sessions=4", "--tokens_per_step=2",
       "--prompt=130", "--rate=150", "--warmup_s=0.2", "--steps=5", "--verify", "--verify_every=2",
       "--verify_max=6", "--json_out=" + json_path, "--plot_out=" + svg_path});
  ASSERT_EQ(run.exit_code, 0) << run.output;
  EXPECT_THAT(run.output, HasSubstr("open loop, Poisson arrivals at 150.0 layer steps/s"));
  const nlohmann::json json = nlohmann::json::parse(ReadFile(json_path));
  EXPECT_EQ(json["config"]["mode"], "open");
  EXPECT_EQ(json["config"]["heads"], 8);  // 128 / 16
  EXPECT_EQ(json["attend"]["layer_steps_ok"], 30);
  EXPECT_EQ(json["attend"]["layer_steps_failed"], 0);
  ExpectSaneLatency(json["attend"]["latency"]);
  EXPECT_GT(json["attend"]["seconds"].get<double>(), 0);
  EXPECT_TRUE(json["verify"]["passed"].get<bool>());
  EXPECT_EQ(json["verify"]["layer_steps"], 6);
  // Sessions were placed on both servers, 8 in all.
  const std::vector<int> placed = json["config"]["sessions_per_target"];
  ASSERT_EQ(placed.size(), 2u);
  EXPECT_EQ(placed[0] + placed[1], 8);
  EXPECT_GT(placed[0], 0);
  EXPECT_GT(placed[1], 0);
  EXPECT_THAT(ReadFile(svg_path), HasSubstr("<svg"));
}

TEST(LoadTestEndToEnd, AFullKvCacheIsCountedByCodeAndStopsTheNode) {
  // 434 blocks: two V4-Flash sessions of 256 prompt tokens fill them (4 ring
  // blocks a layer and one page a compressed layer each), so the first C4A
  // layer step that needs a new page (position 259) finds none.
  std::unique_ptr<client::TestServer> server = StartServer({"--kv_cache_gb=0.01625"});
  ASSERT_NE(server, nullptr);
  const std::string dir = OutDir();
  const std::string json_path = dir + "/full.json", csv_path = dir + "/full.csv";
  const LoadTestRun run = LoadTest({"--target=" + server->target(), "--tp=8", "--layers=4",
                                    "--sessions=2", "--prompt=256", "--warmup_s=0", "--steps=10",
                                    "--json_out=" + json_path, "--csv_out=" + csv_path});
  // Layer steps before the failure were answered: a run, not a failure.
  ASSERT_EQ(run.exit_code, 0) << run.output;
  EXPECT_THAT(run.output, HasSubstr("RESOURCE_EXHAUSTED 1"));
  const nlohmann::json json = nlohmann::json::parse(ReadFile(json_path));
  const int64_t ok = json["attend"]["layer_steps_ok"];
  EXPECT_GT(ok, 0);
  EXPECT_LT(ok, 40);                                   // it stopped before its 10 steps x 4 layers
  EXPECT_EQ(json["attend"]["layer_steps_failed"], 1);  // one in flight, then the node stops
  EXPECT_EQ(json["attend"]["errors"]["RESOURCE_EXHAUSTED"], 1);
  EXPECT_THAT(json["stop_reason"].get<std::string>(),
              HasSubstr("stopped at its first failed layer step"));
  EXPECT_EQ(json["kv"]["used_at_end"], json["kv"]["blocks_total"]);
  int64_t ok_lines = 0, failed_lines = 0;
  for (const auto& row : ReadCsv(csv_path)) {
    if (row.at("code") == "OK") {
      ++ok_lines;
    } else {
      ++failed_lines;
      EXPECT_EQ(row.at("code"), "RESOURCE_EXHAUSTED");
      EXPECT_EQ(row.at("layer"), "2");  // the first C4A layer
      EXPECT_EQ(std::stod(row.at("latency_us")), 0);
    }
  }
  EXPECT_EQ(ok_lines, ok);
  EXPECT_EQ(failed_lines, 1);
}

TEST(LoadTestEndToEnd, CtrlCEndsTheRunWithAReport) {
  // Positions for a minute of steps (about 1100 a second here), so that the
  // interrupt, not max_position, ends the run.
  std::unique_ptr<client::TestServer> server = StartServer({"--max_position=65536"});
  ASSERT_NE(server, nullptr);
  const std::string json_path = OutDir() + "/interrupted.json";
  // One SIGINT after 4 s of a 60 s run, as a terminal's Ctrl-C sends; the exit
  // status is the load test's own. Without --foreground, timeout signals the
  // child and then its whole process group: a second SIGINT, which kills by
  // design when it lands after the first one's handler ran.
  const LoadTestRun run = LoadTest(
      {"--target=" + server->target(), "--tp=8", "--layers=2", "--sessions=2", "--prompt=64",
       "--warmup_s=0.2", "--duration_s=60", "--baseline", "--json_out=" + json_path},
      {"/usr/bin/timeout", "--foreground", "--preserve-status", "-s", "INT", "4"});
  ASSERT_EQ(run.exit_code, 0) << run.output;
  EXPECT_THAT(run.output, HasSubstr("(interrupted)"));
  EXPECT_THAT(run.output, Not(HasSubstr("echo baseline  ")));
  const nlohmann::json json = nlohmann::json::parse(ReadFile(json_path));
  EXPECT_EQ(json["stop_reason"], "interrupted");
  EXPECT_GT(json["attend"]["layer_steps_ok"].get<int64_t>(), 0);
  EXPECT_LT(json["attend"]["seconds"].get<double>(), 30);
  EXPECT_GT(json["attend"]["seconds"].get<double>(), 0);
  EXPECT_FALSE(json.contains("echo"));
  EXPECT_EQ(json["kv"]["used_after_close"], json["kv"]["used_at_start"]);
}

TEST(LoadTestEndToEnd, APromptThatFailsPartwayLeavesNoSessionBehind) {
  // 434 blocks: the first AppendKV chunks of a 4000-token V4-Flash prompt
  // (1117 tokens each) fit, a later one does not. The session holds what the
  // first chunks filled until the load test closes it.
  std::unique_ptr<client::TestServer> server = StartServer({"--kv_cache_gb=0.01625"});
  ASSERT_NE(server, nullptr);
  const LoadTestRun run =
      LoadTest({"--target=" + server->target(), "--tp=8", "--layers=4", "--sessions=1",
                "--prompt=4000", "--warmup_s=0", "--duration_s=1"});
  EXPECT_EQ(run.exit_code, 1) << run.output;
  EXPECT_THAT(run.output, HasSubstr("creating sessions and prompts: "));
  EXPECT_THAT(run.output, HasSubstr("RESOURCE_EXHAUSTED"));
  EXPECT_THAT(run.output, Not(HasSubstr("closing sessions")));  // closing worked
  EXPECT_EQ(KvBlocksUsed(*server), 0);
}

TEST(LoadTestEndToEnd, SessionsGoneAtTheEndStillGiveTheReport) {
  // The server closes sessions idle for 1 s (checked every second); the Echo
  // phase leaves them idle for 4 s, so closing them at the end finds none.
  // Its positions stay below the server's max_position (the Echo phase too
  // stops there), so it lasts the 4 s.
  std::unique_ptr<client::TestServer> server =
      StartServer({"--session_idle_ttl_s=1", "--max_position=262144"});
  ASSERT_NE(server, nullptr);
  const std::string json_path = OutDir() + "/expired.json";
  const LoadTestRun run = LoadTest({"--target=" + server->target(), "--tp=8", "--layers=2",
                                    "--sessions=2", "--prompt=64", "--warmup_s=0", "--duration_s=4",
                                    "--baseline", "--json_out=" + json_path});
  // The run measured: its report is printed and written, and the exit
  // status says that cleaning up failed.
  EXPECT_EQ(run.exit_code, 1) << run.output;
  EXPECT_THAT(run.output, HasSubstr("latency per layer step   p50 "));
  EXPECT_THAT(run.output, HasSubstr("echo baseline"));
  EXPECT_THAT(run.output, HasSubstr("  WARNING                  closing sessions: 2 of 2 failed"));
  EXPECT_THAT(run.output, HasSubstr("NOT_FOUND"));
  const nlohmann::json json = nlohmann::json::parse(ReadFile(json_path));
  EXPECT_GT(json["attend"]["layer_steps_ok"].get<int64_t>(), 0);
  ASSERT_EQ(json["cleanup_errors"].size(), 1u);
  EXPECT_THAT(json["cleanup_errors"][0].get<std::string>(), HasSubstr("closing sessions: 2 of 2"));
  EXPECT_EQ(json["kv"]["used_after_close"], json["kv"]["used_at_start"]);  // the server freed them
}

// Nodes that reach the server's max_position stop; when all have, the window
// ends with the last answer (rates over the time something was sent), and
// the Echo baseline, which stops there too, says so.
TEST(LoadTestEndToEnd, NodesAtMaxPositionEndTheWindowAndSaySo) {
  // 64 prompt positions + 100 decode steps of 1 token.
  std::unique_ptr<client::TestServer> server = StartServer({"--max_position=164"});
  ASSERT_NE(server, nullptr);
  const std::string json_path = OutDir() + "/max_position.json";
  const LoadTestRun run = LoadTest({"--target=" + server->target(), "--tp=8", "--layers=2",
                                    "--sessions=1", "--prompt=64", "--warmup_s=0",
                                    "--duration_s=60", "--baseline", "--json_out=" + json_path});
  ASSERT_EQ(run.exit_code, 0) << run.output;
  const nlohmann::json json = nlohmann::json::parse(ReadFile(json_path));
  for (const char* phase : {"attend", "echo"}) {
    SCOPED_TRACE(phase);
    const nlohmann::json& stats = json[phase];
    EXPECT_TRUE(stats["stopped_early"].get<bool>());
    EXPECT_THAT(stats["stop_reason"].get<std::string>(), HasSubstr("max_position 164"));
    EXPECT_EQ(stats["layer_steps_ok"].get<int64_t>(), 200);  // 100 steps x 2 layers
    const double seconds = stats["seconds"].get<double>();
    EXPECT_LT(seconds, 30) << "the window ran on after the last layer step";
    EXPECT_NEAR(stats["layer_steps_per_s"].get<double>(), 200 / seconds, 1e-6 * 200 / seconds);
  }
  EXPECT_THAT(run.output, HasSubstr("reached the server's max_position 164"));
  EXPECT_THAT(run.output, HasSubstr("(measured "));
}

TEST(LoadTestEndToEnd, CtrlCWhileAppendingPromptsClosesTheSessionsWithoutAReport) {
  // 64 sessions of 4000 prompt tokens (34000 of the cache's 53000 blocks,
  // 11 GB of AppendKV): far more than a second of setup, interrupted after
  // one second.
  std::unique_ptr<client::TestServer> server = StartServer({"--kv_cache_gb=2"});
  ASSERT_NE(server, nullptr);
  const std::string json_path = OutDir() + "/interrupted_setup.json";
  std::remove(json_path.c_str());
  const auto start = std::chrono::steady_clock::now();
  const LoadTestRun run =
      LoadTest({"--target=" + server->target(), "--tp=8", "--layers=2", "--sessions=64",
                "--prompt=4000", "--warmup_s=0", "--duration_s=5", "--json_out=" + json_path},
               {"/usr/bin/timeout", "--foreground", "--preserve-status", "-s", "INT", "1"});
  const double seconds =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  EXPECT_EQ(run.exit_code, 130) << run.output;
  EXPECT_THAT(run.output, HasSubstr("interrupted while creating sessions and appending prompts: "
                                    "nothing was measured; this run's sessions were closed"));
  EXPECT_THAT(run.output, Not(HasSubstr("latency per layer step")));
  EXPECT_FALSE(std::ifstream(json_path).good());
  EXPECT_LT(seconds, 10);  // it stopped at the next prompt chunk, not after the setup
  EXPECT_EQ(KvBlocksUsed(*server), 0);
}

TEST(LoadTestEndToEnd, CtrlCDuringTheWarmUpClosesTheSessionsWithoutAReport) {
  std::unique_ptr<client::TestServer> server = StartServer();
  ASSERT_NE(server, nullptr);
  const LoadTestRun run =
      LoadTest({"--target=" + server->target(), "--tp=8", "--layers=2", "--sessions=2",
                "--prompt=64", "--warmup_s=60", "--duration_s=5"},
               {"/usr/bin/timeout", "--foreground", "--preserve-status", "-s", "INT", "2"});
  EXPECT_EQ(run.exit_code, 130) << run.output;
  EXPECT_THAT(run.output, HasSubstr("interrupted during the warm-up: nothing was measured; this "
                                    "run's sessions were closed"));
  EXPECT_THAT(run.output, Not(HasSubstr("latency per layer step")));
  EXPECT_EQ(KvBlocksUsed(*server), 0);
}

// Against a server with TLS and bearer tokens (certificates made by openssl
// in the test): the run with the CA and a token file passes with --verify
// and closes its sessions; the token never appears in its output; without
// the token, or without TLS, it fails with the server's refusal.
TEST(LoadTestEndToEnd, TlsAndATokenAgainstAnAuthenticatedServer) {
  absl::StatusOr<std::string> certs = testing::TestCertsDir();
  ASSERT_TRUE(certs.ok()) << certs.status();
  const std::string tokens = OutDir() + "/loadtest.tokens";
  testing::WriteTokensFile(tokens, {{"loadtest", "lt-secret-token"}, {"ops", "ops-token", true}});
  const std::string token_file = OutDir() + "/loadtest.token";
  std::ofstream(token_file) << "lt-secret-token\n";
  std::unique_ptr<client::TestServer> server =
      StartServer({"--tls_cert_file=" + *certs + "/server.pem",
                   "--tls_key_file=" + *certs + "/server.key", "--auth_tokens_file=" + tokens});
  ASSERT_NE(server, nullptr);
  const std::vector<std::string> run_flags = {
      "--target=" + server->target(), "--model=deepseek-v4-flash", "--tp=8", "--layers=4",
      "--sessions=2", "--prompt=200", "--warmup_s=0.2", "--duration_s=1", "--verify",
      "--verify_every=3", "--verify_max=4", "--verify_tokens=2"};
  std::vector<std::string> flags = run_flags;
  flags.insert(flags.end(),
               {"--tls", "--tls_ca=" + *certs + "/ca.pem", "--token_file=" + token_file});
  LoadTestRun run = LoadTest(flags);
  ASSERT_EQ(run.exit_code, 0) << run.output;
  EXPECT_THAT(run.output, HasSubstr("errors                   none"));
  EXPECT_THAT(run.output, HasSubstr("verify                   PASSED"));
  EXPECT_THAT(run.output, Not(HasSubstr("lt-secret-token")));
  EXPECT_THAT(server->Output(), Not(HasSubstr("lt-secret-token")));
  // Its sessions are gone (the operator sees every tenant's).
  client::ConnectOptions ops;
  ops.use_tls = true;
  ops.tls_root_certs_pem = testing::ReadText(*certs + "/ca.pem");
  ops.bearer_token = "ops-token";
  absl::StatusOr<std::unique_ptr<client::Client>> operator_client =
      client::Client::Connect(server->target(), ops);
  ASSERT_TRUE(operator_client.ok());
  absl::StatusOr<std::vector<mla_offload::v1::SessionInfo>> left =
      (*operator_client)->ListSessions();
  ASSERT_TRUE(left.ok()) << left.status();
  EXPECT_TRUE(left->empty());

  flags = run_flags;
  flags.insert(flags.end(), {"--tls", "--tls_ca=" + *certs + "/ca.pem", "--token_env="});
  run = LoadTest(flags);
  EXPECT_EQ(run.exit_code, 1) << run.output;
  EXPECT_THAT(run.output, HasSubstr("UNAUTHENTICATED"));
  flags = run_flags;
  flags.push_back("--token_file=" + token_file);
  run = LoadTest(flags);
  EXPECT_EQ(run.exit_code, 1) << run.output;
  EXPECT_THAT(run.output, HasSubstr("UNAVAILABLE"));
}

TEST(LoadTestEndToEnd, RunsThatCannotGoSaySo) {
  LoadTestRun run = LoadTest({"--target=127.0.0.1:1", "--tp=3"});
  EXPECT_EQ(run.exit_code, 2);
  EXPECT_THAT(run.output, HasSubstr("--tp=3"));
  run = LoadTest({"--target=127.0.0.1:1", "--plot_out=x.jpg"});
  EXPECT_EQ(run.exit_code, 2);
  EXPECT_THAT(run.output, HasSubstr(".png or .svg"));
  // Before the run (nothing listens on port 1: a run would fail UNAVAILABLE).
  run = LoadTest({"--target=127.0.0.1:1", "--plot_out=x.png", "--gnuplot=/nonexistent/gnuplot"});
  EXPECT_EQ(run.exit_code, 2);
  EXPECT_THAT(run.output, HasSubstr("not found as '/nonexistent/gnuplot'"));
  EXPECT_THAT(run.output, Not(HasSubstr("UNAVAILABLE")));
  run = LoadTest({"--target=127.0.0.1:1", "--duration_s=1e10"});
  EXPECT_EQ(run.exit_code, 2);
  EXPECT_THAT(run.output, HasSubstr("--duration_s=1e+10"));
  run = LoadTest({"--target=127.0.0.1:1", "--rate=nan"});
  EXPECT_EQ(run.exit_code, 2);
  EXPECT_THAT(run.output, HasSubstr("--rate=nan"));
  // Nothing listens on port 1.
  run = LoadTest({"--target=127.0.0.1:1", "--duration_s=1"});
  EXPECT_EQ(run.exit_code, 1);
  EXPECT_THAT(run.output, HasSubstr("UNAVAILABLE"));
}

}  // namespace
}  // namespace mla::loadtest

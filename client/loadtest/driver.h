// The load itself: N simulated serving nodes, each with S sessions, decoding
// L layers per step against one or more mla_offload_servers through the C++
// client library (client/mla_client.h), and what they measured.
//
// A run:
// 1. Connects to every target (one Cluster per node, each with connections of
//    its own, as real serving nodes would have), checks the
//    model and head count against GetServerInfo.
// 2. Creates the sessions (placed by the library's rendezvous hashing of
//    "mla_loadtest/<seed>/node<n>/session<s>") with sinks, and appends a
//    P-token prompt to each (AppendKV, every layer, in chunks); untimed.
// 3. Attend phase: each node streams layer steps in order (step 0 layers
//    0..L-1, step 1, ...), one Attend message per server holding its
//    sessions, S x tokens_per_step tokens, on one stream per server. Closed
//    loop: --concurrency layer steps in flight per node. Open loop: Poisson
//    arrivals at --rate / N per node, latency measured from the scheduled
//    arrival. The first --warmup_s seconds are not measured; the window ends
//    after --duration_s (or --steps decode steps per node). A node stops at
//    its first failed layer step (its sessions' positions no longer line up)
//    or when its positions would reach the server's max_position.
// 4. Echo phase (--baseline): the same schedule sending the same number of
//    bytes per layer step to Echo on each node's own streams.
// 5. --verify: sampled layer steps (their answers were kept) are recomputed
//    locally (verifier.h); then sessions are closed and KV use read again.
//
// Errors of setup (unreachable server, unknown model, bad flags, a failed
// prompt) are returned, after closing every session the run had created;
// errors of layer steps are counted in the report by code. Once the window
// has run, a report always comes back: a failure to close the sessions or to
// read KV use at the end is in its cleanup_errors.
#ifndef MLA_OFFLOAD_CLIENT_LOADTEST_DRIVER_H_
#define MLA_OFFLOAD_CLIENT_LOADTEST_DRIVER_H_

#include <atomic>
#include <cstdint>
#include <cstdio>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "client/loadtest/report.h"
#include "client/mla_client.h"

namespace mla::loadtest {

struct LoadOptions {
  std::vector<std::string> targets;
  // How every node connects (TLS, mutual TLS, a bearer token);
  // own_connection is set per node from connection_per_node.
  client::ConnectOptions connect;
  std::string model = "deepseek-v4-flash";
  int tp = 8;
  int layers = 0;  // first L attention layers; 0 = all
  int streams = 1;
  int sessions = 8;
  int tokens_per_step = 1;
  int prompt = 512;
  int concurrency = 1;  // closed loop
  double rate = 0;      // > 0: open loop, layer steps/s over all nodes
  double warmup_s = 1;
  double duration_s = 10;
  int64_t steps = 0;  // > 0: decode steps per node instead of duration_s
  bool baseline = false;
  bool verify = false;
  int verify_every = 17;  // sample every N-th layer step of a node
  int verify_max = 32;    // layer steps checked, all nodes together
  int verify_tokens = 4;  // tokens checked per sampled layer step
  int verify_threads = 2;
  bool derotate = false;
  // Ask for the FP8 output (fp8_output): e4m3 out with UE8M0 scales, 516
  // bytes a head back instead of 1024; --verify holds it to its tolerance.
  bool fp8_output = false;
  bool connection_per_node = true;
  // TCP connections each node's Attend stream (and its Echo baseline) is
  // spread over (client::StreamOptions::connections).
  int connections_per_stream = 1;
  // "inline": the tensors travel in the gRPC messages; "shm": each node
  // keeps a shared-memory region on each server it uses (client::HostRegion,
  // the same-host data plane), its messages name q, kv and the compressed
  // rows there and have out and lse written there (the top-k stays inline).
  // shm needs the closed loop: a region holds --concurrency layer steps.
  // "cuda_ipc": the same with device memory of GPU cuda_device
  // (client::CudaRegion) on a --backend=cuda server; a slot's tensors are
  // written once, as a model's kernels would have left them there, or every
  // step with verify.
  std::string data_plane = "inline";
  int cuda_device = 0;
  double step_timeout_s = 30;
  uint64_t seed = 1;
  bool progress = true;
  bool progress_tty = false;
  std::FILE* progress_out = stderr;
  // When it becomes true (a SIGINT handler sets it) while the sessions are
  // created or their prompts appended, setup stops at the next session or
  // prompt chunk, the sessions are closed and RunLoadTest returns CANCELLED:
  // nothing was measured. Later, the nodes stop sending, what is in flight
  // is answered, the Echo phase is skipped, and the report covers the window
  // up to then.
  const std::atomic<bool>* interrupted = nullptr;
};

// InvalidArgument naming the flag for settings that cannot run, including
// times and rates that are not finite or beyond what a run can mean: at most
// a week of --duration_s, an hour of --warmup_s or --step_timeout_s, 1e7
// layer steps/s of --rate.
absl::Status ValidateOptions(const LoadOptions& options);

struct RunOutput {
  RunReport report;
  std::vector<StepRecord> records;  // measured layer steps, both phases
};

absl::StatusOr<RunOutput> RunLoadTest(const LoadOptions& options);

}  // namespace mla::loadtest

#endif  // MLA_OFFLOAD_CLIENT_LOADTEST_DRIVER_H_

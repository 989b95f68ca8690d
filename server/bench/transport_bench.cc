// transport_bench: how fast the Attend stream moves tensor bytes, per stream,
// against a plain gRPC echo of the same bytes (the first measurement's baseline: typed
// messages, protobuf `bytes`, default channel arguments, one message in
// flight: 0.73 GB/s each way at 2 MiB on a 16-core H200 host).
//
// Everything runs in this one process over real loopback TCP (127.0.0.1,
// port 0): client and server share the machine's cores (and gRPC's pollers),
// so on a small machine every row is also limited by the other side's CPU
// time. The CPU column (process CPU per message, both ends) is the figure
// that moves least when other work shares the machine.
//
// Rows:
//   plain echo          server/bench/plain_echo.proto, sync API, generated
//                       classes; default channel arguments except the
//                       message size limit; one message in flight.
//   plain echo, server transport
//                       the same code with our server's transport settings
//                       on both ends (separates "windows and frames" from
//                       "copy-free codec").
//   our Echo (raw)      the real service's raw Echo method, raw client
//                       (grpc::GenericStub, a slice referencing the payload,
//                       no serialization copy): pure transport of our
//                       server's configuration; 1 or 2 messages in flight.
//   Attend (codec)      the real service stack (--backend, engine,
//                       scheduler, metrics) and a raw client using
//                       proto/attend_codec.h, 1, 2 or 4 messages in flight.
//   Attend (shm)        the same through the same-host data plane
//                       (--data_plane=shm): each stream registers a POSIX
//                       shared-memory region (its mla-client-id the owner)
//                       with q and kv written once in a slot a message in
//                       flight; messages name them there and have out
//                       written there (copied out like the inline answer).
//   Attend (cuda_ipc)   the same with device memory (--data_plane=cuda_ipc,
//                       --backend=cuda): a child process (cuda_ipc_holder,
//                       beside this binary) holds each stream's region,
//                       since CUDA opens an IPC handle only in another
//                       process than the exporter, and this one is the
//                       server's; out stays on the GPU (nothing to copy).
// Each row runs with 1 and with 4 streams (--streams); "x plain" divides a
// row's GB/s per stream by the plain echo's GB/s per stream at the same
// stream count.
//
// The Attend messages keep compute small so that transport dominates as far
// as a CPU backend allows: T tokens of T distinct sessions (one token each)
// on an SWA-only layer at small positions, so each query attends
// 1..--positions keys. Every message inserts new KV rows (positions
// advance); after --positions steps on every SWA-only layer the sessions are
// closed and recreated outside the timed region. The server's own timing
// (queue, prologue, decode) is averaged from the responses and printed beside
// the transport figures so that compute can be told apart from transport.
#include <algorithm>
#include <atomic>
#include <chrono>
#include <cmath>
#include <condition_variable>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <fstream>
#include <functional>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include <fcntl.h>
#include <signal.h>
#include <spawn.h>
#include <sys/mman.h>
#include <sys/wait.h>
#include <sys/resource.h>
#include <unistd.h>

#include <grpcpp/generic/generic_stub.h>
#include <grpcpp/grpcpp.h>

#include "absl/flags/flag.h"
#include "absl/flags/parse.h"
#include "absl/flags/usage.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/escaping.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_split.h"
#include "absl/synchronization/blocking_counter.h"
#include "absl/time/time.h"
#include "kernels/backend_factory.h"
#include "kernels/geometry.h"
#include "kernels/model_profile.h"
#include "proto/attend_codec.h"
#include "proto/mla_offload.grpc.pb.h"
#include "server/bench/plain_echo.grpc.pb.h"
#include "server/metrics/registry.h"
#include "server/offload_server.h"
#include "server/process/host_memory.h"
#include "server/server_metrics.h"
#include "server/service.h"

ABSL_FLAG(double, seconds, 2.0, "Timed seconds per row (whole chunks of messages).");
ABSL_FLAG(double, warmup_seconds, 0.3, "Untimed seconds before each row.");
ABSL_FLAG(int, repeats, 1,
          "Runs of each row; the run with the median GB/s is reported (the JSON keeps the "
          "slowest and fastest too). Use 3 or more on a machine shared with other work.");
ABSL_FLAG(std::string, rows, "plain,plain_tuned,echo,attend",
          "Which rows to run, comma separated: plain, plain_tuned, echo, attend.");
ABSL_FLAG(std::string, streams, "1,4", "Stream counts, comma separated: each row runs at each.");
ABSL_FLAG(std::string, in_flight, "1,2,4",
          "Attend messages a client stream keeps in flight, comma separated (the server reads "
          "ahead up to --max_messages_in_flight).");
ABSL_FLAG(bool, shared_connection, false,
          "Streams of a row share one channel (one TCP connection); by default each stream has "
          "its own channel and connection.");
ABSL_FLAG(bool, client_copy, true,
          "The raw clients copy each response's payload into their own buffer: the one copy a "
          "real client makes on receipt (the plain client's parse makes it anyway).");
ABSL_FLAG(std::string, model, "deepseek-v4-flash",
          "Model profile of the Attend sessions; its SWA-only layers (compress ratio 0) are "
          "used. deepseek-v4-flash has three (0, 1, MTP), deepseek-v4-pro one (MTP).");
ABSL_FLAG(int, tokens, 128, "T: query tokens per Attend message, one per session.");
ABSL_FLAG(int, heads, 16,
          "H: query heads per rank (16 = V4-Pro at TP8). q is T x H x 512 bf16 = 2 MiB at the "
          "defaults; the echo rows send the same number of bytes.");
ABSL_FLAG(int, positions, 4,
          "Positions each session steps through on every SWA-only layer before the sessions "
          "are recreated (untimed): queries attend 1..N keys.");
ABSL_FLAG(int, session_sets, 4,
          "Sets of T sessions per stream; a chunk is session_sets x SWA layers x positions "
          "messages per stream.");
ABSL_FLAG(std::string, echo_in_flight, "1,2",
          "Messages our Echo client keeps in flight, comma separated (the server's Echo answers "
          "one at a time; more in flight only lets the next request travel meanwhile).");
ABSL_FLAG(int, echo_chunk, 32, "Echo messages per stream between timing checks.");
ABSL_FLAG(std::string, backend, "cpu",
          "Compute backend of the Attend rows' server: cpu, or cuda (on a GPU machine).");
ABSL_FLAG(int, device, 0, "GPU ordinal for --backend=cuda.");
ABSL_FLAG(int, cpu_threads, 0, "Threads of the CPU backend; 0 uses every hardware thread.");
ABSL_FLAG(int, batch_wait_us, 200, "Server --batch_wait_us.");
ABSL_FLAG(int, max_batch_tokens, 1024, "Server --max_batch_tokens.");
ABSL_FLAG(int, max_messages_in_flight, 8, "Server --max_messages_in_flight (Attend read-ahead).");
ABSL_FLAG(int, max_message_mb, 256, "Server --max_message_mb; also the clients' limit.");
ABSL_FLAG(int, lookahead_bytes, 64 << 20,
          "GRPC_ARG_HTTP2_STREAM_LOOKAHEAD_BYTES of our server and raw clients (the server's "
          "value); -1 leaves gRPC's default.");
ABSL_FLAG(int, max_frame_size, 16 << 20,
          "GRPC_ARG_HTTP2_MAX_FRAME_SIZE of our server and raw clients; -1: gRPC's default.");
ABSL_FLAG(int, write_buffer_size, 8 << 20,
          "GRPC_ARG_HTTP2_WRITE_BUFFER_SIZE of our server and raw clients; -1: gRPC's default.");
ABSL_FLAG(int, bdp_probe, -1, "GRPC_ARG_HTTP2_BDP_PROBE (0 or 1) of ours; -1: gRPC's default.");
ABSL_FLAG(int, tcp_min_read_chunk, -1,
          "GRPC_ARG_TCP_MIN_READ_CHUNK_SIZE of ours; -1: gRPC's default.");
ABSL_FLAG(int, tcp_max_read_chunk, -1,
          "GRPC_ARG_TCP_MAX_READ_CHUNK_SIZE of ours; -1: gRPC's default.");
ABSL_FLAG(bool, malloc_keep, true,
          "Before anything starts, keep freed memory in the process as mla_offload_server does "
          "by default (--keep_freed_memory, server/process/host_memory.h), so that gRPC's read buffers "
          "are not returned to the kernel and faulted in (zeroed) again on every message. "
          "--malloc_keep=false: glibc's defaults.");
ABSL_FLAG(bool, sweep, false,
          "After the table, time our Echo (1 and 2 in flight) and Attend (1 in flight), one "
          "stream, under variants of the transport settings (each with its own server), and "
          "print a second table.");
ABSL_FLAG(std::string, json_out, "", "Also write every row as JSON to this file.");
ABSL_FLAG(std::string, data_plane, "inline",
          "How the Attend rows' tensors travel, comma separated: each Attend row runs with each. "
          "inline: in the gRPC messages; shm: the same-host data plane (each stream's q and kv "
          "in a POSIX shared-memory region it registered, one slot a message in flight, written "
          "once; out written there by the server and copied out as --client_copy says). "
          "cuda_ipc (with --backend=cuda): the same in device memory, held by a "
          "cuda_ipc_holder child process beside this binary (CUDA opens an IPC handle only in "
          "another process); out stays on the GPU.");

namespace mla {
namespace {

namespace pb = ::mla_offload::v1;
using Clock = std::chrono::steady_clock;

double SecondsSince(Clock::time_point start) {
  return std::chrono::duration<double>(Clock::now() - start).count();
}

// CPU time of this whole process (client and server), user + system.
double ProcessCpuSeconds() {
  rusage usage;
  getrusage(RUSAGE_SELF, &usage);
  return usage.ru_utime.tv_sec + usage.ru_stime.tv_sec +
         (usage.ru_utime.tv_usec + usage.ru_stime.tv_usec) * 1e-6;
}

// /proc/loadavg: other work on the machine skews every row.
std::string LoadAverage() {
  std::ifstream file("/proc/loadavg");
  std::string line;
  std::getline(file, line);
  return line + "\n";
}

std::vector<int> ParseIntList(const std::string& text, const char* flag) {
  std::vector<int> values;
  for (absl::string_view part : absl::StrSplit(text, ',', absl::SkipEmpty())) {
    int value = 0;
    if (!absl::SimpleAtoi(part, &value) || value < 1) {
      std::fprintf(stderr, "transport_bench: --%s: '%s' is not a positive integer\n", flag,
                   std::string(part).c_str());
      std::exit(2);
    }
    values.push_back(value);
  }
  return values;
}

// HTTP/2 and TCP settings of one end (proto/transport_settings.h), named
// for the report.
struct TransportConfig : TransportSettings {
  std::string name;
};

// The settings server/mla_offload_server.cc builds its server with, as the
// flags above leave them.
TransportConfig FlagTransport() {
  TransportConfig config;
  config.name = "server";
  config.lookahead_bytes = absl::GetFlag(FLAGS_lookahead_bytes);
  config.max_frame_size = absl::GetFlag(FLAGS_max_frame_size);
  config.write_buffer_size = absl::GetFlag(FLAGS_write_buffer_size);
  config.bdp_probe = absl::GetFlag(FLAGS_bdp_probe);
  config.tcp_min_read_chunk = absl::GetFlag(FLAGS_tcp_min_read_chunk);
  config.tcp_max_read_chunk = absl::GetFlag(FLAGS_tcp_max_read_chunk);
  return config;
}

// The plain echo's server: the offload server's message limits and this
// run's HTTP/2 settings.
void ConfigureServerBuilder(grpc::ServerBuilder& builder, int64_t max_message_bytes,
                            const TransportConfig& transport, int* port) {
  builder.AddListeningPort("127.0.0.1:0", grpc::InsecureServerCredentials(), port);
  const int max_bytes = TransportMessageLimit(max_message_bytes);
  builder.SetMaxReceiveMessageSize(max_bytes);
  builder.SetMaxSendMessageSize(max_bytes);
  transport.Apply([&builder](const char* name, int value) { builder.AddChannelArgument(name, value); });
}

std::shared_ptr<grpc::Channel> MakeChannel(int port, int64_t max_message_bytes,
                                           const TransportConfig& transport, bool own_connection) {
  grpc::ChannelArguments args;
  const int max_bytes = static_cast<int>(std::min<int64_t>(max_message_bytes, INT32_MAX));
  args.SetMaxReceiveMessageSize(max_bytes);
  args.SetMaxSendMessageSize(max_bytes);
  transport.Apply([&args](const char* name, int value) { args.SetInt(name, value); });
  // Channels with equal arguments share one connection unless each keeps
  // its own subchannel pool.
  if (own_connection) args.SetInt(GRPC_ARG_USE_LOCAL_SUBCHANNEL_POOL, 1);
  return grpc::CreateCustomChannel(absl::StrCat("127.0.0.1:", port),
                                   grpc::InsecureChannelCredentials(), args);
}

// ----------------------------------------------------------------------------
// Servers.

class PlainEchoService final : public mla_offload::bench::PlainEcho::Service {
 public:
  grpc::Status Echo(grpc::ServerContext*,
                    grpc::ServerReaderWriter<mla_offload::bench::Blob, mla_offload::bench::Blob>*
                        stream) override {
    mla_offload::bench::Blob blob;
    while (stream->Read(&blob)) {
      if (!stream->Write(blob)) break;
    }
    return grpc::Status::OK;
  }
};

class PlainEchoServer {
 public:
  PlainEchoServer(int64_t max_message_bytes, const TransportConfig& transport) {
    grpc::ServerBuilder builder;
    ConfigureServerBuilder(builder, max_message_bytes, transport, &port_);
    builder.RegisterService(&service_);
    server_ = builder.BuildAndStart();
  }
  ~PlainEchoServer() {
    if (server_ != nullptr) server_->Shutdown(std::chrono::system_clock::now() + std::chrono::seconds(1));
  }
  bool ok() const { return server_ != nullptr && port_ != 0; }
  int port() const { return port_; }

 private:
  PlainEchoService service_;
  std::unique_ptr<grpc::Server> server_;
  int port_ = 0;
};

struct OffloadOptions {
  const ModelProfile* model = nullptr;
  int64_t kv_blocks = 0;
  int cpu_threads = 0;
  std::string backend = "cpu";
  int device = 0;
  int batch_wait_us = 200;
  int max_batch_tokens = 1024;
  int max_messages_in_flight = 8;
  int64_t max_message_bytes = int64_t{256} << 20;
  TransportConfig transport;
};

// The real service stack of server/mla_offload_server.cc in this process
// (server/offload_server.h), with this run's HTTP/2 settings.
class OffloadServerHandle {
 public:
  static absl::StatusOr<std::unique_ptr<OffloadServerHandle>> Start(const OffloadOptions& options) {
    BackendOptions backend_options;
    backend_options.cpu_threads = options.cpu_threads;
    backend_options.device = options.device;
    absl::StatusOr<std::unique_ptr<ComputeBackend>> backend =
        CreateBackend(options.backend, backend_options);
    if (!backend.ok()) return backend.status();
    OffloadServerOptions server_options;
    server_options.engine.kv_blocks = options.kv_blocks;
    server_options.engine.max_position = 4096;
    server_options.engine.max_tokens_per_message = 1024;
    server_options.engine.models = {options.model};
    server_options.scheduler.max_batch_tokens = options.max_batch_tokens;
    server_options.scheduler.batch_wait = absl::Microseconds(options.batch_wait_us);
    server_options.service.max_messages_in_flight = options.max_messages_in_flight;
    server_options.service.max_message_bytes = options.max_message_bytes;
    server_options.service.version = "transport_bench";
    server_options.transport = options.transport;
    std::unique_ptr<OffloadServerHandle> handle(new OffloadServerHandle());
    server_options.service.devices = (*backend)->Describe();
    absl::StatusOr<std::unique_ptr<OffloadServer>> server =
        OffloadServer::Start(*std::move(backend), server_options, handle->registry_);
    if (!server.ok()) return server.status();
    handle->server_ = *std::move(server);
    return handle;
  }
  int port() const { return server_->port(); }
  const std::string& backend_text() const { return server_->backend_text(); }

 private:
  OffloadServerHandle() = default;

  // The metrics outlive the server that records into them.
  metrics::Registry registry_;
  std::unique_ptr<OffloadServer> server_;
};

// ----------------------------------------------------------------------------
// Results.

struct RowResult {
  std::string name;
  std::string transport;
  std::string data_plane = "inline";  // the Attend rows' (--data_plane)
  int streams = 0;
  int in_flight = 1;
  double request_bytes = 0;   // tensor payload per message
  double response_bytes = 0;
  int64_t messages = 0;       // all streams
  double seconds = 0;
  double cpu_seconds = 0;     // process CPU time in the timed region, both ends
  std::vector<double> latency_ms;
  // Attend only: the server's timing, averaged over responses.
  bool has_timing = false;
  double queue_us = 0, plan_us = 0, upload_us = 0, prologue_us = 0, decode_us = 0, total_us = 0,
         batch_tokens = 0;
  // Raw rows: slices (pieces of the payload) per response on the client.
  double pieces_per_response = 0;
  double ratio = 0;  // GB/s per stream over the plain echo's
  double slowest_gbps = 0, fastest_gbps = 0;  // over --repeats runs

  double MessagesPerSecond() const { return messages / seconds; }
  double GBpsEachWay() const {
    return messages * (request_bytes + response_bytes) / 2 / seconds / 1e9;
  }
  double GBpsPerStream() const { return GBpsEachWay() / streams; }
  double CpuMsPerMessage() const { return cpu_seconds * 1e3 / messages; }
  double CoresBusy() const { return cpu_seconds / seconds; }
  double Percentile(double p) const {
    if (latency_ms.empty()) return 0;
    std::vector<double> sorted = latency_ms;
    std::sort(sorted.begin(), sorted.end());
    const size_t rank = static_cast<size_t>(std::ceil(p * sorted.size()));
    return sorted[std::min(sorted.size() - 1, rank == 0 ? 0 : rank - 1)];
  }
};

// ----------------------------------------------------------------------------
// The plain echo client: generated stub, sync API, one message in flight.

RowResult RunPlainEcho(const std::string& name, int port, const TransportConfig& transport,
                       int64_t max_message_bytes, int streams, size_t payload_bytes,
                       double seconds, double warmup_seconds, bool shared_connection) {
  using mla_offload::bench::Blob;
  using mla_offload::bench::PlainEcho;
  std::vector<std::shared_ptr<grpc::Channel>> channels;
  for (int s = 0; s < (shared_connection ? 1 : streams); ++s) {
    channels.push_back(MakeChannel(port, max_message_bytes, transport, !shared_connection));
  }
  std::mutex mutex;
  std::condition_variable cv;
  int ready = 0;
  bool go = false;
  Clock::time_point deadline;
  std::vector<std::vector<double>> latencies(streams);
  std::vector<int64_t> counts(streams, 0);
  std::vector<std::thread> threads;
  std::atomic<bool> failed{false};
  for (int s = 0; s < streams; ++s) {
    threads.emplace_back([&, s] {
      std::unique_ptr<PlainEcho::Stub> stub = PlainEcho::NewStub(channels[s % channels.size()]);
      grpc::ClientContext context;
      auto stream = stub->Echo(&context);
      Blob request, response;
      request.mutable_payload()->assign(payload_bytes, '\x5a');
      auto one = [&]() {
        if (!stream->Write(request) || !stream->Read(&response) ||
            response.payload().size() != payload_bytes) {
          failed = true;
          return false;
        }
        return true;
      };
      const Clock::time_point warm_end =
          Clock::now() + std::chrono::duration_cast<Clock::duration>(
                             std::chrono::duration<double>(warmup_seconds));
      do {
        if (!one()) break;
      } while (Clock::now() < warm_end);
      {
        std::unique_lock<std::mutex> lock(mutex);
        ++ready;
        cv.notify_all();
        cv.wait(lock, [&] { return go; });
      }
      latencies[s].reserve(1 << 16);
      while (!failed && Clock::now() < deadline) {
        const Clock::time_point start = Clock::now();
        if (!one()) break;
        latencies[s].push_back(std::chrono::duration<double, std::milli>(Clock::now() - start).count());
        ++counts[s];
      }
      stream->WritesDone();
      stream->Finish();
    });
  }
  Clock::time_point start;
  double cpu_start = 0;
  {
    std::unique_lock<std::mutex> lock(mutex);
    cv.wait(lock, [&] { return ready == streams; });
    cpu_start = ProcessCpuSeconds();
    start = Clock::now();
    deadline = start + std::chrono::duration_cast<Clock::duration>(std::chrono::duration<double>(seconds));
    go = true;
    cv.notify_all();
  }
  // The timed region ends when the last stream's last message is back.
  for (std::thread& thread : threads) thread.join();
  RowResult row;
  row.seconds = SecondsSince(start);
  row.cpu_seconds = ProcessCpuSeconds() - cpu_start;
  if (failed) {
    std::fprintf(stderr, "transport_bench: %s: a plain echo stream failed\n", name.c_str());
    std::exit(1);
  }
  row.name = name;
  row.transport = transport.name;
  row.streams = streams;
  row.request_bytes = row.response_bytes = static_cast<double>(payload_bytes);
  for (int s = 0; s < streams; ++s) {
    row.messages += counts[s];
    row.latency_ms.insert(row.latency_ms.end(), latencies[s].begin(), latencies[s].end());
  }
  return row;
}

// ----------------------------------------------------------------------------
// Raw streams: grpc::GenericStub, ByteBuffer messages, up to `in_flight`
// messages written and not yet answered.

// What a raw stream sends and how it checks the answers. Request and
// Response are called on gRPC threads, one at a time per stream.
class Workload {
 public:
  virtual ~Workload() = default;
  virtual std::string method() const = 0;
  // Messages per stream between two calls of PrepareChunk.
  virtual int64_t chunk_messages() const = 0;
  // Untimed work before each chunk (the Attend rows recreate sessions).
  virtual absl::Status PrepareChunk() { return absl::OkStatus(); }
  virtual grpc::ByteBuffer Request(int stream, int64_t index) = 0;
  virtual absl::Status Response(int stream, int64_t index, const grpc::ByteBuffer& buffer) = 0;
  // The mla-client-id its streams send (the owner of its regions); empty:
  // none.
  virtual std::string client_id() const { return ""; }
  virtual void ResetStats() = 0;
  virtual void Report(RowResult& row) const = 0;
};

class RawStream final : public grpc::ClientBidiReactor<grpc::ByteBuffer, grpc::ByteBuffer> {
 public:
  RawStream(grpc::GenericStub& stub, Workload& workload, int stream, int in_flight)
      : workload_(workload), stream_(stream), in_flight_(in_flight), send_times_(in_flight) {
    latency_ms_.reserve(1 << 16);
    if (!workload.client_id().empty()) {
      context_.AddMetadata(wire::kClientIdMetadata, workload.client_id());
    }
    stub.PrepareBidiStreamingCall(&context_, workload.method(), grpc::StubOptions(), this);
    AddHold();
    StartRead(&read_buffer_);
    StartCall();
  }

  // Lets `count` more messages go; returns at once.
  void Begin(int64_t count) {
    std::unique_lock<std::mutex> lock(mutex_);
    target_ += count;
    MaybeWrite(lock);
  }
  // Waits until every message let go so far is answered.
  absl::Status Wait() {
    std::unique_lock<std::mutex> lock(mutex_);
    cv_.wait(lock, [this] { return received_ == target_ || !status_.ok(); });
    return status_;
  }
  // Ends the call and waits for it to be done. The last answer can come
  // back before its request's write has completed; WritesDone waits for it.
  absl::Status Close() {
    {
      std::unique_lock<std::mutex> lock(mutex_);
      cv_.wait(lock, [this] { return !writing_; });
    }
    StartWritesDone();
    RemoveHold();
    std::unique_lock<std::mutex> lock(mutex_);
    cv_.wait(lock, [this] { return done_; });
    return status_;
  }
  std::vector<double> TakeLatencies() {
    std::lock_guard<std::mutex> lock(mutex_);
    std::vector<double> latencies;
    latencies.swap(latency_ms_);
    latency_ms_.reserve(1 << 16);
    return latencies;
  }

  void OnWriteDone(bool ok) override {
    std::unique_lock<std::mutex> lock(mutex_);
    writing_ = false;
    if (!ok) Fail(lock, absl::UnavailableError("a write failed"));
    MaybeWrite(lock);
    if (!writing_) cv_.notify_all();
  }

  void OnReadDone(bool ok) override {
    if (!ok) {
      std::unique_lock<std::mutex> lock(mutex_);
      if (received_ != target_) Fail(lock, absl::UnavailableError("the stream ended early"));
      return;
    }
    const int64_t index = received_;  // only this callback changes it
    absl::Status status = workload_.Response(stream_, index, read_buffer_);
    read_buffer_.Clear();
    {
      std::unique_lock<std::mutex> lock(mutex_);
      latency_ms_.push_back(std::chrono::duration<double, std::milli>(
                                Clock::now() - send_times_[index % in_flight_])
                                .count());
      ++received_;
      if (!status.ok()) Fail(lock, status);
      if (received_ == target_) cv_.notify_all();
      MaybeWrite(lock);
    }
    StartRead(&read_buffer_);
  }

  void OnDone(const grpc::Status& status) override {
    std::lock_guard<std::mutex> lock(mutex_);
    if (!status.ok() && status_.ok()) {
      status_ = absl::Status(static_cast<absl::StatusCode>(status.error_code()), status.error_message());
    }
    done_ = true;
    cv_.notify_all();
  }

 private:
  void Fail(std::unique_lock<std::mutex>&, absl::Status status) {
    if (status_.ok()) status_ = std::move(status);
    cv_.notify_all();
  }

  // Starts the next write when one may go; releases the lock to do it.
  void MaybeWrite(std::unique_lock<std::mutex>& lock) {
    if (writing_ || !status_.ok() || sent_ >= target_ || sent_ - received_ >= in_flight_) return;
    const int64_t index = sent_++;
    writing_ = true;
    send_times_[index % in_flight_] = Clock::now();
    lock.unlock();
    write_buffer_ = workload_.Request(stream_, index);
    StartWrite(&write_buffer_);
    lock.lock();
  }

  Workload& workload_;
  const int stream_;
  const int in_flight_;
  grpc::ClientContext context_;
  grpc::ByteBuffer read_buffer_;
  grpc::ByteBuffer write_buffer_;
  std::mutex mutex_;
  std::condition_variable cv_;
  std::vector<Clock::time_point> send_times_;  // by index % in_flight
  std::vector<double> latency_ms_;
  int64_t target_ = 0;
  int64_t sent_ = 0;
  int64_t received_ = 0;
  bool writing_ = false;
  bool done_ = false;
  absl::Status status_;
};

RowResult RunRaw(const std::string& name, int port, const TransportConfig& transport,
                 int64_t max_message_bytes, Workload& workload, int streams, int in_flight,
                 double seconds, double warmup_seconds, bool shared_connection) {
  std::vector<std::shared_ptr<grpc::Channel>> channels;
  std::vector<std::unique_ptr<grpc::GenericStub>> stubs;
  for (int s = 0; s < (shared_connection ? 1 : streams); ++s) {
    channels.push_back(MakeChannel(port, max_message_bytes, transport, !shared_connection));
    stubs.push_back(std::make_unique<grpc::GenericStub>(channels.back()));
  }
  std::vector<std::unique_ptr<RawStream>> raw;
  for (int s = 0; s < streams; ++s) {
    raw.push_back(std::make_unique<RawStream>(*stubs[s % stubs.size()], workload, s, in_flight));
  }
  auto check = [&name](const absl::Status& status) {
    if (!status.ok()) {
      std::fprintf(stderr, "transport_bench: %s: %s\n", name.c_str(), status.ToString().c_str());
      std::exit(1);
    }
  };
  const int64_t chunk = workload.chunk_messages();
  double cpu_seconds = 0;
  auto run_chunk = [&]() {
    check(workload.PrepareChunk());
    const double cpu_start = ProcessCpuSeconds();
    const Clock::time_point start = Clock::now();
    for (auto& stream : raw) stream->Begin(chunk);
    for (auto& stream : raw) check(stream->Wait());
    const double seconds = SecondsSince(start);
    cpu_seconds += ProcessCpuSeconds() - cpu_start;
    return seconds;
  };
  const Clock::time_point warm_start = Clock::now();
  do {
    run_chunk();
  } while (SecondsSince(warm_start) < warmup_seconds);
  workload.ResetStats();
  for (auto& stream : raw) stream->TakeLatencies();
  cpu_seconds = 0;

  RowResult row;
  row.name = name;
  row.transport = transport.name;
  row.streams = streams;
  row.in_flight = in_flight;
  while (row.seconds < seconds) {
    row.seconds += run_chunk();
    row.messages += chunk * streams;
  }
  for (auto& stream : raw) {
    std::vector<double> latencies = stream->TakeLatencies();
    row.latency_ms.insert(row.latency_ms.end(), latencies.begin(), latencies.end());
  }
  row.cpu_seconds = cpu_seconds;
  for (auto& stream : raw) check(stream->Close());
  workload.Report(row);
  return row;
}

// Per-stream statistics of the responses; each stream's are written by one
// gRPC thread at a time and read after Wait().
struct StreamStats {
  int64_t responses = 0;
  int64_t pieces = 0;
  double queue_us = 0, plan_us = 0, upload_us = 0, prologue_us = 0, decode_us = 0, total_us = 0,
         batch_tokens = 0;
};

void ReportStats(const std::vector<StreamStats>& stats, bool timing, RowResult& row) {
  StreamStats sum;
  for (const StreamStats& s : stats) {
    sum.responses += s.responses;
    sum.pieces += s.pieces;
    sum.queue_us += s.queue_us;
    sum.plan_us += s.plan_us;
    sum.upload_us += s.upload_us;
    sum.prologue_us += s.prologue_us;
    sum.decode_us += s.decode_us;
    sum.total_us += s.total_us;
    sum.batch_tokens += s.batch_tokens;
  }
  if (sum.responses == 0) return;
  const double n = static_cast<double>(sum.responses);
  row.pieces_per_response = sum.pieces / n;
  row.has_timing = timing;
  row.queue_us = sum.queue_us / n;
  row.plan_us = sum.plan_us / n;
  row.upload_us = sum.upload_us / n;
  row.prologue_us = sum.prologue_us / n;
  row.decode_us = sum.decode_us / n;
  row.total_us = sum.total_us / n;
  row.batch_tokens = sum.batch_tokens / n;
}

// Our raw Echo method: an EchoMessage whose payload slice points at the
// client's buffer (no serialization copy).
class EchoWorkload final : public Workload {
 public:
  EchoWorkload(int streams, size_t payload_bytes, bool client_copy)
      : payload_(payload_bytes, 0x5a), stats_(streams), client_copy_(client_copy) {
    // Field 1, wire type 2, then the varint length.
    header_.push_back('\x0a');
    for (uint64_t n = payload_bytes; ; n >>= 7) {
      header_.push_back(static_cast<char>((n & 0x7f) | (n >= 0x80 ? 0x80 : 0)));
      if (n < 0x80) break;
    }
    for (int s = 0; s < streams; ++s) received_.emplace_back(header_.size() + payload_bytes);
  }
  std::string method() const override { return "/mla_offload.v1.MlaOffload/Echo"; }
  int64_t chunk_messages() const override { return absl::GetFlag(FLAGS_echo_chunk); }
  grpc::ByteBuffer Request(int, int64_t) override {
    grpc::Slice slices[2] = {grpc::Slice(header_),
                             grpc::Slice(payload_.data(), payload_.size(), grpc::Slice::STATIC_SLICE)};
    return grpc::ByteBuffer(slices, 2);
  }
  absl::Status Response(int stream, int64_t, const grpc::ByteBuffer& buffer) override {
    std::vector<grpc::Slice> slices;
    if (!buffer.Dump(&slices).ok()) return absl::InternalError("cannot read the echo");
    size_t total = 0;
    std::vector<uint8_t>& out = received_[stream];
    for (const grpc::Slice& slice : slices) {
      if (total + slice.size() > out.size()) return absl::DataLossError("echo longer than sent");
      if (client_copy_) std::memcpy(out.data() + total, slice.begin(), slice.size());
      total += slice.size();
    }
    if (total != out.size()) return absl::DataLossError("echo shorter than sent");
    stats_[stream].responses++;
    stats_[stream].pieces += static_cast<int64_t>(slices.size());
    return absl::OkStatus();
  }
  void ResetStats() override { std::fill(stats_.begin(), stats_.end(), StreamStats()); }
  void Report(RowResult& row) const override {
    row.request_bytes = row.response_bytes = static_cast<double>(payload_.size());
    ReportStats(stats_, false, row);
  }

 private:
  std::vector<uint8_t> payload_;
  std::string header_;
  std::vector<std::vector<uint8_t>> received_;
  std::vector<StreamStats> stats_;
  const bool client_copy_;
};

// One stream's region for --data_plane=shm: made with shm_open as a client
// makes one, mapped here, registered by the workload; for cuda_ipc: device
// memory a cuda_ipc_holder child holds until its stdin (holder_in) closes.
struct StreamRegion {
  std::string name;
  uint8_t* data = nullptr;
  int64_t bytes = 0;
  uint64_t id = 0;
  pid_t holder = 0;
  int holder_in = -1;
};

// The cuda_ipc_holder beside this binary.
std::string HolderPath() {
  char self[4096];
  const ssize_t n = readlink("/proc/self/exe", self, sizeof(self) - 1);
  std::string path(self, n > 0 ? static_cast<size_t>(n) : 0);
  return path.substr(0, path.rfind('/') + 1) + "cuda_ipc_holder";
}

extern "C" char** environ;

// Starts a cuda_ipc_holder with the region's first contents `bytes` (through
// `file`); the handle and GPU it printed, and the child in `region`.
absl::StatusOr<std::pair<std::string, std::string>> StartHolder(const std::string& file,
                                                                const std::vector<uint8_t>& bytes,
                                                                int device, StreamRegion& region) {
  {
    std::ofstream out(file, std::ios::binary);
    out.write(reinterpret_cast<const char*>(bytes.data()), static_cast<std::streamsize>(bytes.size()));
    if (!out.good()) return absl::InternalError(absl::StrCat("writing ", file, " failed"));
  }
  // Close-on-exec: a later holder must not inherit this one's stdin (its
  // end of the pipe would keep it from ever seeing the bench close it).
  int to_child[2], from_child[2];
  if (pipe2(to_child, O_CLOEXEC) != 0 || pipe2(from_child, O_CLOEXEC) != 0) {
    return absl::InternalError("pipe2 failed");
  }
  posix_spawn_file_actions_t actions;
  posix_spawn_file_actions_init(&actions);
  posix_spawn_file_actions_adddup2(&actions, to_child[0], 0);
  posix_spawn_file_actions_adddup2(&actions, from_child[1], 1);
  posix_spawn_file_actions_addclose(&actions, to_child[1]);
  posix_spawn_file_actions_addclose(&actions, from_child[0]);
  std::string holder = HolderPath(), device_text = std::to_string(device), file_arg = file;
  char* argv[] = {holder.data(), device_text.data(), file_arg.data(), nullptr};
  const int spawned = posix_spawn(&region.holder, holder.c_str(), &actions, nullptr, argv, environ);
  posix_spawn_file_actions_destroy(&actions);
  close(to_child[0]);
  close(from_child[1]);
  region.holder_in = to_child[1];
  if (spawned != 0) {
    close(from_child[0]);
    region.holder = 0;
    return absl::NotFoundError(absl::StrCat("starting ", holder, ": ", std::strerror(spawned),
                                            " (it is built beside transport_bench)"));
  }
  std::string line;
  char c;
  while (read(from_child[0], &c, 1) == 1 && c != '\n') line += c;
  close(from_child[0]);
  const size_t space = line.find(' ');
  const std::string hex = line.substr(0, space);
  if (space == std::string::npos || hex.empty() || hex.size() % 2 != 0 ||
      hex.find_first_not_of("0123456789abcdef") != std::string::npos) {
    return absl::InternalError(absl::StrCat(holder, " gave no handle (see its message above)"));
  }
  return std::make_pair(absl::HexStringToBytes(hex), line.substr(space + 1));
}

// Attend: T tokens of T sessions per message on an SWA-only layer; every
// message inserts the next position of its sessions on its layer. With
// `plane` shm or cuda_ipc, each stream's q and kv lie in its region (a slot
// for each of `in_flight` messages, written once) and out is written there.
class AttendWorkload final : public Workload {
 public:
  AttendWorkload(std::shared_ptr<grpc::Channel> control, const ModelProfile& model, int streams,
                 int tokens, int heads, int positions, int session_sets, int64_t max_message_bytes,
                 bool client_copy, const std::string& plane, int device, int in_flight)
      : shm_(plane != "inline"),
        cuda_(plane == "cuda_ipc"),
        device_(device),
        in_flight_(in_flight),
        client_id_(shm_ ? absl::StrCat("transport-bench-", getpid(), "-", next_client_++) : ""),
        stub_(pb::MlaOffload::NewStub(std::move(control))),
        model_(model),
        tokens_(tokens),
        heads_(heads),
        positions_(positions),
        sets_(session_sets),
        max_message_bytes_(max_message_bytes),
        client_copy_(client_copy),
        sessions_(streams),
        out_(streams, std::vector<uint8_t>(size_t(tokens) * heads * kHeadDim * 2)),
        stats_(streams) {
    for (int layer = 0; layer < model.num_attention_layers(); ++layer) {
      if (model.compress_ratio(layer) == 0) layers_.push_back(layer);
    }
    // Finite bf16 values in [-1, 1): the top halves of small floats.
    auto fill = [](size_t count, uint32_t seed) {
      auto data = std::make_shared<std::vector<uint16_t>>(count);
      uint32_t state = seed;
      for (uint16_t& value : *data) {
        state = state * 1664525u + 1013904223u;
        const float f = static_cast<float>(state >> 8) / 8388608.0f - 1.0f;
        uint32_t bits;
        std::memcpy(&bits, &f, 4);
        value = static_cast<uint16_t>(bits >> 16);
      }
      return data;
    };
    q_ = fill(size_t(tokens) * heads * kHeadDim, 1);
    kv_ = fill(size_t(tokens) * kHeadDim, 2);
  }
  ~AttendWorkload() override {
    CloseAll().IgnoreError();
    for (const StreamRegion& region : regions_) {
      if (region.id != 0) {
        pb::UnregisterRegionRequest request;
        request.set_region_id(region.id);
        pb::UnregisterRegionResponse response;
        grpc::ClientContext context;
        context.AddMetadata(wire::kClientIdMetadata, client_id_);
        stub_->UnregisterRegion(&context, request, &response);
      }
      if (region.holder != 0) {
        close(region.holder_in);
        waitpid(region.holder, nullptr, 0);
        std::remove(region.name.c_str());
      } else if (region.data != nullptr) {
        munmap(region.data, static_cast<size_t>(region.bytes));
        shm_unlink(region.name.c_str());
      }
    }
  }

  std::string client_id() const override { return client_id_; }

  const std::vector<int>& layers() const { return layers_; }
  std::string method() const override { return "/mla_offload.v1.MlaOffload/Attend"; }
  int64_t chunk_messages() const override {
    return int64_t{sets_} * static_cast<int64_t>(layers_.size()) * positions_;
  }

  absl::Status PrepareChunk() override {
    if (shm_ && regions_.empty()) {
      if (absl::Status status = MakeRegions(); !status.ok()) return status;
    }
    if (absl::Status status = CloseAll(); !status.ok()) return status;
    const int per_stream = sets_ * tokens_;
    const int total = per_stream * static_cast<int>(sessions_.size());
    std::vector<pb::CreateSessionRequest> requests(1);
    requests[0].set_model(model_.name);
    requests[0].set_num_heads(heads_);
    std::vector<pb::CreateSessionResponse> responses(total);
    std::vector<grpc::ClientContext> contexts(total);
    std::vector<grpc::Status> statuses(total);
    absl::BlockingCounter pending(total);
    for (int i = 0; i < total; ++i) {
      // The regions' owner's sessions keep its regions too, between rows.
      if (shm_) contexts[i].AddMetadata(wire::kClientIdMetadata, client_id_);
      stub_->async()->CreateSession(&contexts[i], &requests[0], &responses[i],
                                    [&statuses, &pending, i](grpc::Status status) {
                                      statuses[i] = std::move(status);
                                      pending.DecrementCount();
                                    });
    }
    pending.Wait();
    for (int i = 0; i < total; ++i) {
      if (!statuses[i].ok()) {
        return absl::Status(static_cast<absl::StatusCode>(statuses[i].error_code()),
                            absl::StrCat("CreateSession: ", statuses[i].error_message()));
      }
      sessions_[i / per_stream].push_back(responses[i].session_id());
    }
    return absl::OkStatus();
  }

  grpc::ByteBuffer Request(int stream, int64_t index) override {
    // Within a chunk: position-major, then layer, then session set, so the
    // messages in flight on one stream touch different session layers.
    const int64_t within = index % chunk_messages();
    const int per_position = sets_ * static_cast<int>(layers_.size());
    const int position = static_cast<int>(within / per_position);
    const int layer = layers_[within % per_position / sets_];
    const int set = static_cast<int>(within % sets_);
    wire::AttendRequestView request;
    request.request_id = static_cast<uint64_t>(index);
    request.layer = layer;
    request.segments.resize(tokens_);
    for (int t = 0; t < tokens_; ++t) {
      wire::SegmentView& segment = request.segments[t];
      segment.session_id = sessions_[stream][set * tokens_ + t];
      segment.position = position;
      segment.num_tokens = 1;
    }
    if (shm_) {
      const uint64_t id = regions_[stream].id;
      const int64_t slot = SlotAt(index);
      const int64_t q_bytes = static_cast<int64_t>(q_->size()) * 2;
      const int64_t kv_bytes = static_cast<int64_t>(kv_->size()) * 2;
      request.q.emplace();
      request.q->dtype = wire::DType::kBf16;
      request.q->shape = {tokens_, heads_, kHeadDim};
      request.q->region = wire::RegionRefView{id, slot, q_bytes};
      request.kv.emplace();
      request.kv->dtype = wire::DType::kBf16;
      request.kv->shape = {tokens_, kHeadDim};
      request.kv->region = wire::RegionRefView{id, slot + q_bytes, kv_bytes};
      request.out_region = wire::RegionRefView{id, slot + q_bytes + kv_bytes, OutBytes()};
      return wire::SerializeAttendRequest(request);
    }
    request.q = wire::MakeTensorView(wire::DType::kBf16, {tokens_, heads_, kHeadDim}, q_->data(),
                                     q_->size() * 2, q_);
    request.kv = wire::MakeTensorView(wire::DType::kBf16, {tokens_, kHeadDim}, kv_->data(),
                                      kv_->size() * 2, kv_);
    return wire::SerializeAttendRequest(request);
  }

  absl::Status Response(int stream, int64_t index, const grpc::ByteBuffer& buffer) override {
    absl::StatusOr<wire::AttendResponseView> response =
        wire::ParseAttendResponse(buffer, static_cast<size_t>(max_message_bytes_));
    if (!response.ok()) return response.status();
    if (response->status.has_value() && response->status->code != 0) {
      return absl::Status(static_cast<absl::StatusCode>(response->status->code),
                          absl::StrCat("Attend message ", index, ": ", response->status->message));
    }
    if (response->request_id != static_cast<uint64_t>(index)) {
      return absl::DataLossError(absl::StrCat("Attend message ", index, " was answered with request_id ",
                                              response->request_id, ": answers out of order"));
    }
    std::vector<uint8_t>& out = out_[stream];
    StreamStats& stats = stats_[stream];
    if (shm_) {
      if (response->out.has_value()) {
        return absl::DataLossError(absl::StrCat("Attend message ", index,
                                                ": answered into its region and inline too"));
      }
      if (cuda_) {
        // The answer stays on the GPU, for the client's next kernel.
        stats.responses++;
        AddTiming(*response, stats);
        return absl::OkStatus();
      }
      const uint8_t* in_region = regions_[stream].data + SlotAt(index) +
                                 static_cast<int64_t>(q_->size() + kv_->size()) * 2;
      if (client_copy_) std::memcpy(out.data(), in_region, out.size());
    } else {
      if (!response->out.has_value() || response->out->size_bytes() != out.size()) {
        return absl::DataLossError(absl::StrCat("Attend message ", index, ": out is not ",
                                                out.size(), " bytes"));
      }
      if (client_copy_) response->out->CopyTo(out.data());
      stats.pieces += static_cast<int64_t>(response->out->pieces.size());
    }
    stats.responses++;
    AddTiming(*response, stats);
    return absl::OkStatus();
  }
  void ResetStats() override { std::fill(stats_.begin(), stats_.end(), StreamStats()); }
  void Report(RowResult& row) const override {
    row.request_bytes = static_cast<double>((q_->size() + kv_->size()) * 2);
    row.response_bytes = static_cast<double>(out_[0].size());
    row.data_plane = cuda_ ? "cuda_ipc" : shm_ ? "shm" : "inline";
    ReportStats(stats_, true, row);
  }

 private:
  int64_t OutBytes() const { return int64_t{tokens_} * heads_ * kHeadDim * 2; }
  int64_t SlotBytes() const {
    return static_cast<int64_t>(q_->size() + kv_->size()) * 2 + OutBytes();
  }
  // Where message `index` of a stream lies in its region: the slot of its
  // place among the messages in flight (answered in order, so the slot is
  // free again when its next message goes).
  int64_t SlotAt(int64_t index) const { return index % in_flight_ * SlotBytes(); }

  static void AddTiming(const wire::AttendResponseView& response, StreamStats& stats) {
    if (!response.timing.has_value()) return;
    stats.queue_us += response.timing->queue_us;
    stats.plan_us += response.timing->plan_us;
    stats.upload_us += response.timing->upload_us;
    stats.prologue_us += response.timing->prologue_us;
    stats.decode_us += response.timing->decode_us;
    stats.total_us += response.timing->total_us;
    stats.batch_tokens += response.timing->batch_tokens;
  }

  // The region's first contents: q and kv in every slot.
  std::vector<uint8_t> FirstContents() const {
    std::vector<uint8_t> bytes(static_cast<size_t>(SlotBytes() * in_flight_));
    for (int slot = 0; slot < in_flight_; ++slot) {
      uint8_t* at = bytes.data() + slot * SlotBytes();
      std::memcpy(at, q_->data(), q_->size() * 2);
      std::memcpy(at + q_->size() * 2, kv_->data(), kv_->size() * 2);
    }
    return bytes;
  }

  // A stream's region in device memory, held by a cuda_ipc_holder child and
  // registered under client_id_.
  absl::Status MakeDeviceRegion() {
    StreamRegion region;
    const char* tmp = std::getenv("TMPDIR");
    region.name = absl::StrCat(tmp != nullptr ? tmp : "/tmp", "/mla-transport-bench-", getpid(),
                               "-", next_region_++);
    region.bytes = SlotBytes() * in_flight_;
    absl::StatusOr<std::pair<std::string, std::string>> exported =
        StartHolder(region.name, FirstContents(), device_, region);
    regions_.push_back(region);
    if (!exported.ok()) return exported.status();
    pb::RegisterRegionRequest request;
    request.set_kind(pb::REGION_KIND_CUDA_IPC);
    request.set_cuda_ipc_handle(exported->first);
    request.set_device_uuid(exported->second);
    request.set_byte_size(region.bytes);
    return Register(request);
  }

  // Registers the last region of regions_ under client_id_.
  absl::Status Register(const pb::RegisterRegionRequest& request) {
    pb::RegisterRegionResponse response;
    grpc::ClientContext context;
    context.AddMetadata(wire::kClientIdMetadata, client_id_);
    const grpc::Status status = stub_->RegisterRegion(&context, request, &response);
    if (!status.ok()) {
      return absl::Status(static_cast<absl::StatusCode>(status.error_code()),
                          absl::StrCat("RegisterRegion: ", status.error_message()));
    }
    regions_.back().id = response.region_id();
    return absl::OkStatus();
  }

  // A region a stream, registered under client_id_, with q and kv in every
  // slot.
  absl::Status MakeRegions() {
    for (size_t s = 0; s < sessions_.size(); ++s) {
      if (cuda_) {
        if (absl::Status status = MakeDeviceRegion(); !status.ok()) return status;
        continue;
      }
      StreamRegion region;
      region.name = absl::StrCat("/mla-transport-bench-", getpid(), "-", next_region_++);
      region.bytes = SlotBytes() * in_flight_;
      const int fd = shm_open(region.name.c_str(), O_CREAT | O_EXCL | O_RDWR, 0600);
      if (fd < 0) return absl::InternalError(absl::StrCat("shm_open ", region.name, " failed"));
      const bool sized = ftruncate(fd, region.bytes) == 0;
      void* data = sized ? mmap(nullptr, static_cast<size_t>(region.bytes), PROT_READ | PROT_WRITE,
                                MAP_SHARED, fd, 0)
                         : MAP_FAILED;
      close(fd);
      if (data == MAP_FAILED) {
        shm_unlink(region.name.c_str());
        return absl::InternalError(absl::StrCat("sizing or mapping ", region.name, " failed"));
      }
      region.data = static_cast<uint8_t*>(data);
      const std::vector<uint8_t> contents = FirstContents();
      std::memcpy(region.data, contents.data(), contents.size());
      regions_.push_back(region);
      pb::RegisterRegionRequest request;
      request.set_kind(pb::REGION_KIND_SYSTEM_SHM);
      request.set_name(region.name);
      request.set_byte_size(region.bytes);
      if (absl::Status status = Register(request); !status.ok()) return status;
    }
    return absl::OkStatus();
  }

  absl::Status CloseAll() {
    std::vector<std::string> ids;
    for (std::vector<std::string>& stream : sessions_) {
      ids.insert(ids.end(), stream.begin(), stream.end());
      stream.clear();
    }
    if (ids.empty()) return absl::OkStatus();
    const size_t total = ids.size();
    std::vector<pb::CloseSessionRequest> requests(total);
    std::vector<pb::CloseSessionResponse> responses(total);
    std::vector<grpc::ClientContext> contexts(total);
    std::vector<grpc::Status> statuses(total);
    absl::BlockingCounter pending(static_cast<int>(total));
    for (size_t i = 0; i < total; ++i) {
      requests[i].set_session_id(ids[i]);
      stub_->async()->CloseSession(&contexts[i], &requests[i], &responses[i],
                                   [&statuses, &pending, i](grpc::Status status) {
                                     statuses[i] = std::move(status);
                                     pending.DecrementCount();
                                   });
    }
    pending.Wait();
    for (const grpc::Status& status : statuses) {
      if (!status.ok()) {
        return absl::Status(static_cast<absl::StatusCode>(status.error_code()),
                            absl::StrCat("CloseSession: ", status.error_message()));
      }
    }
    return absl::OkStatus();
  }

  static inline std::atomic<int> next_client_{0};
  static inline std::atomic<int> next_region_{0};
  const bool shm_;   // the tensors lie in a region
  const bool cuda_;  // ... of device memory (cuda_ipc)
  const int device_;
  const int in_flight_;
  const std::string client_id_;
  std::vector<StreamRegion> regions_;  // per stream, with --data_plane=shm
  std::unique_ptr<pb::MlaOffload::Stub> stub_;
  const ModelProfile& model_;
  const int tokens_, heads_, positions_, sets_;
  const int64_t max_message_bytes_;
  const bool client_copy_;
  std::vector<int> layers_;
  std::vector<std::vector<std::string>> sessions_;  // per stream: set-major
  std::shared_ptr<std::vector<uint16_t>> q_, kv_;
  std::vector<std::vector<uint8_t>> out_;
  std::vector<StreamStats> stats_;
};

// ----------------------------------------------------------------------------
// Output.

void PrintTable(const std::vector<RowResult>& rows) {
  std::printf("\n%-34s %3s %3s %11s %7s %7s %7s %7s %7s %7s %6s %5s\n", "row", "str", "inf",
              "MiB req/rsp", "msg/s", "GB/s", "GB/s/st", "p50 ms", "p99 ms", "x plain",
              "CPUms", "cores");
  for (const RowResult& row : rows) {
    std::printf("%-34s %3d %3d %5.2f/%5.2f %7.1f %7.3f %7.3f %7.2f %7.2f %7.2f %6.2f %5.2f\n",
                row.name.c_str(), row.streams, row.in_flight, row.request_bytes / (1 << 20),
                row.response_bytes / (1 << 20), row.MessagesPerSecond(), row.GBpsEachWay(),
                row.GBpsPerStream(), row.Percentile(0.5), row.Percentile(0.99), row.ratio,
                row.CpuMsPerMessage(), row.CoresBusy());
  }
  std::printf("(GB/s: payload each way; x plain: GB/s per stream / plain echo's at the same "
              "streams; CPUms: process CPU per message, client and server together; cores: "
              "CPU busy during the row)\n");
  bool any_detail = false;
  for (const RowResult& row : rows) any_detail |= row.pieces_per_response > 0 || row.has_timing;
  if (!any_detail) return;
  std::printf("\n%-34s %3s %3s %10s %9s %7s %7s %11s %9s %9s %8s\n",
              "row (server timing, us/msg)", "str", "inf", "slices/rsp", "queue", "plan", "upload",
              "prologue", "decode", "total", "batch T");
  for (const RowResult& row : rows) {
    if (row.pieces_per_response == 0 && !row.has_timing) continue;
    if (row.has_timing) {
      std::printf("%-34s %3d %3d %10.1f %9.0f %7.0f %7.0f %11.0f %9.0f %9.0f %8.0f\n",
                  row.name.c_str(), row.streams, row.in_flight, row.pieces_per_response,
                  row.queue_us, row.plan_us, row.upload_us, row.prologue_us, row.decode_us,
                  row.total_us, row.batch_tokens);
    } else {
      std::printf("%-34s %3d %3d %10.1f\n", row.name.c_str(), row.streams, row.in_flight,
                  row.pieces_per_response);
    }
  }
}

std::string JsonString(const std::string& text) {
  std::string out = "\"";
  for (char c : text) {
    if (c == '"' || c == '\\') out.push_back('\\');
    out.push_back(c);
  }
  return out + "\"";
}

std::string RowJson(const RowResult& row) {
  std::string json = absl::StrFormat(
      "{\"name\": %s, \"transport\": %s, \"streams\": %d, \"in_flight\": %d, "
      "\"request_payload_bytes\": %.0f, \"response_payload_bytes\": %.0f, \"messages\": %d, "
      "\"seconds\": %.4f, \"messages_per_second\": %.2f, \"gb_per_s_each_way\": %.4f, "
      "\"gb_per_s_per_stream\": %.4f, \"p50_ms\": %.4f, \"p99_ms\": %.4f, "
      "\"ratio_to_plain_echo_per_stream\": %.3f, \"cpu_ms_per_message\": %.4f, "
      "\"cores_busy\": %.3f, \"data_plane\": %s",
      JsonString(row.name), JsonString(row.transport), row.streams, row.in_flight,
      row.request_bytes, row.response_bytes, row.messages, row.seconds, row.MessagesPerSecond(),
      row.GBpsEachWay(), row.GBpsPerStream(), row.Percentile(0.5), row.Percentile(0.99),
      row.ratio, row.CpuMsPerMessage(), row.CoresBusy(), JsonString(row.data_plane));
  absl::StrAppendFormat(&json, ", \"repeats_gb_per_s_min\": %.4f, \"repeats_gb_per_s_max\": %.4f",
                        row.slowest_gbps, row.fastest_gbps);
  if (row.pieces_per_response > 0) {
    absl::StrAppendFormat(&json, ", \"slices_per_response\": %.2f", row.pieces_per_response);
  }
  if (row.has_timing) {
    absl::StrAppendFormat(&json,
                          ", \"server_timing_us\": {\"queue\": %.1f, \"plan\": %.1f, "
                          "\"upload\": %.1f, \"prologue\": %.1f, \"decode\": %.1f, "
                          "\"total\": %.1f, \"batch_tokens\": %.1f}",
                          row.queue_us, row.plan_us, row.upload_us, row.prologue_us,
                          row.decode_us, row.total_us, row.batch_tokens);
  }
  return json + "}";
}

// ----------------------------------------------------------------------------

struct Setup {
  const ModelProfile* model = nullptr;
  int tokens = 0, heads = 0, positions = 0, session_sets = 0;
  size_t payload_bytes = 0;
  int64_t max_message_bytes = 0;
  double seconds = 0, warmup = 0;
  bool shared_connection = false, client_copy = true;
  std::vector<int> streams, in_flight, echo_in_flight;
  std::vector<std::string> data_planes;  // of the Attend rows: "inline", "shm", "cuda_ipc"
  int device = 0;                        // --device: the server's GPU, and cuda_ipc's memory
  int repeats = 1;
};

OffloadOptions MakeOffloadOptions(const Setup& setup, const TransportConfig& transport,
                                  int max_streams) {
  OffloadOptions options;
  options.model = setup.model;
  // Every session holds a 4-block SWA ring per layer (allocated lazily by
  // the CPU backend's calloc; only the rings written are touched).
  options.kv_blocks = int64_t{max_streams} * setup.session_sets * setup.tokens *
                          setup.model->num_attention_layers() * 4 + 1024;
  options.cpu_threads = absl::GetFlag(FLAGS_cpu_threads);
  options.backend = absl::GetFlag(FLAGS_backend);
  options.device = absl::GetFlag(FLAGS_device);
  options.batch_wait_us = absl::GetFlag(FLAGS_batch_wait_us);
  options.max_batch_tokens = absl::GetFlag(FLAGS_max_batch_tokens);
  options.max_messages_in_flight = absl::GetFlag(FLAGS_max_messages_in_flight);
  options.max_message_bytes = setup.max_message_bytes;
  options.transport = transport;
  return options;
}

std::unique_ptr<OffloadServerHandle> StartOffload(const OffloadOptions& options) {
  absl::StatusOr<std::unique_ptr<OffloadServerHandle>> server = OffloadServerHandle::Start(options);
  if (!server.ok()) {
    std::fprintf(stderr,
                 "transport_bench: %s (the KV pool is %.1f GB: every session holds a 4-block SWA "
                 "ring for each layer; lower --session_sets or the largest of --streams)\n",
                 server.status().ToString().c_str(), options.kv_blocks * kBlockBytes / 1e9);
    std::exit(1);
  }
  return *std::move(server);
}

RowResult RunEchoRow(const std::string& name, const OffloadServerHandle& server,
                     const TransportConfig& transport, const Setup& setup, int streams,
                     int in_flight) {
  EchoWorkload workload(streams, setup.payload_bytes, setup.client_copy);
  return RunRaw(name, server.port(), transport, setup.max_message_bytes, workload, streams, in_flight,
                setup.seconds, setup.warmup, setup.shared_connection);
}

RowResult RunAttendRow(const std::string& name, const OffloadServerHandle& server,
                       const TransportConfig& transport, const Setup& setup, int streams,
                       int in_flight, const std::string& plane = "inline") {
  AttendWorkload workload(MakeChannel(server.port(), setup.max_message_bytes, transport, true),
                          *setup.model, streams, setup.tokens, setup.heads, setup.positions,
                          setup.session_sets, setup.max_message_bytes, setup.client_copy, plane,
                          setup.device, in_flight);
  return RunRaw(name, server.port(), transport, setup.max_message_bytes, workload, streams,
                in_flight, setup.seconds, setup.warmup, setup.shared_connection);
}

std::vector<TransportConfig> SweepVariants() {
  std::vector<TransportConfig> variants;
  TransportConfig defaults;
  defaults.name = "grpc defaults (max msg only)";
  variants.push_back(defaults);
  TransportConfig server = FlagTransport();
  server.name = "server (as mla_offload_server)";
  variants.push_back(server);
  TransportConfig v = server;
  v.name = "server + bdp_probe=0";
  v.bdp_probe = 0;
  variants.push_back(v);
  v = server;
  v.name = "server, lookahead default";
  v.lookahead_bytes = -1;
  variants.push_back(v);
  v = server;
  v.name = "server, frame default (16 KiB)";
  v.max_frame_size = -1;
  variants.push_back(v);
  v = server;
  v.name = "server, write buffer default";
  v.write_buffer_size = -1;
  variants.push_back(v);
  v = server;
  v.name = "server + write buffer 64 MiB";
  v.write_buffer_size = 64 << 20;
  variants.push_back(v);
  v = server;
  v.name = "server + tcp read chunk 1-4 MiB";
  v.tcp_min_read_chunk = 1 << 20;
  v.tcp_max_read_chunk = 4 << 20;
  variants.push_back(v);
  v = server;
  v.name = "server + tcp read chunk 256K-16M";
  v.tcp_min_read_chunk = 256 << 10;
  v.tcp_max_read_chunk = 16 << 20;
  variants.push_back(v);
  return variants;
}

int Main() {
  if (absl::GetFlag(FLAGS_malloc_keep)) KeepFreedHostMemory();
  Setup setup;
  absl::StatusOr<const ModelProfile*> model = FindModelProfile(absl::GetFlag(FLAGS_model));
  if (!model.ok()) {
    std::fprintf(stderr, "transport_bench: --model: %s\n", std::string(model.status().message()).c_str());
    return 2;
  }
  setup.model = *model;
  setup.tokens = absl::GetFlag(FLAGS_tokens);
  setup.heads = absl::GetFlag(FLAGS_heads);
  setup.positions = absl::GetFlag(FLAGS_positions);
  setup.session_sets = absl::GetFlag(FLAGS_session_sets);
  if (setup.tokens < 1 || setup.heads < 1 || setup.positions < 1 || setup.session_sets < 1) {
    std::fprintf(stderr, "transport_bench: --tokens, --heads, --positions and --session_sets must be positive\n");
    return 2;
  }
  setup.payload_bytes = size_t(setup.tokens) * setup.heads * kHeadDim * 2;
  setup.max_message_bytes = int64_t{absl::GetFlag(FLAGS_max_message_mb)} << 20;
  setup.seconds = absl::GetFlag(FLAGS_seconds);
  setup.warmup = absl::GetFlag(FLAGS_warmup_seconds);
  setup.shared_connection = absl::GetFlag(FLAGS_shared_connection);
  setup.client_copy = absl::GetFlag(FLAGS_client_copy);
  setup.streams = ParseIntList(absl::GetFlag(FLAGS_streams), "streams");
  setup.in_flight = ParseIntList(absl::GetFlag(FLAGS_in_flight), "in_flight");
  setup.echo_in_flight = ParseIntList(absl::GetFlag(FLAGS_echo_in_flight), "echo_in_flight");
  setup.repeats = std::max(1, absl::GetFlag(FLAGS_repeats));
  setup.device = absl::GetFlag(FLAGS_device);
  setup.data_planes = absl::StrSplit(absl::GetFlag(FLAGS_data_plane), ',', absl::SkipEmpty());
  for (const std::string& plane : setup.data_planes) {
    if (plane != "inline" && plane != "shm" && plane != "cuda_ipc") {
      std::fprintf(stderr, "transport_bench: --data_plane: '%s' is not inline, shm or cuda_ipc\n",
                   plane.c_str());
      return 2;
    }
    if (plane == "cuda_ipc" && absl::GetFlag(FLAGS_backend) != "cuda") {
      std::fprintf(stderr,
                   "transport_bench: --data_plane=cuda_ipc needs --backend=cuda: the server's "
                   "kernels read and write the GPU memory\n");
      return 2;
    }
  }
  if (setup.data_planes.empty()) {
    std::fprintf(stderr, "transport_bench: --data_plane: give inline, shm, cuda_ipc or a list\n");
    return 2;
  }
  std::vector<std::string> rows_wanted = absl::StrSplit(absl::GetFlag(FLAGS_rows), ',', absl::SkipEmpty());
  auto want = [&rows_wanted](const char* row) {
    return std::find(rows_wanted.begin(), rows_wanted.end(), row) != rows_wanted.end();
  };
  const int max_streams = *std::max_element(setup.streams.begin(), setup.streams.end());

  TransportConfig plain_transport;
  plain_transport.name = "grpc defaults";
  const TransportConfig ours = FlagTransport();

  std::vector<int> swa_layers;
  for (int layer = 0; layer < setup.model->num_attention_layers(); ++layer) {
    if (setup.model->compress_ratio(layer) == 0) swa_layers.push_back(layer);
  }
  if (swa_layers.empty()) {
    std::fprintf(stderr, "transport_bench: --model %s has no SWA-only layer\n", setup.model->name.c_str());
    return 2;
  }
  std::printf("transport_bench: %u hardware threads shared by client and server; loopback TCP; "
              "%zu-byte payload (T=%d x H=%d x 512 bf16); Attend on %s layers [%s], positions "
              "0..%d, %d session sets of %d per stream\n",
              std::thread::hardware_concurrency(), setup.payload_bytes, setup.tokens, setup.heads,
              setup.model->name.c_str(), absl::StrJoin(swa_layers, ",").c_str(), setup.positions - 1, setup.session_sets, setup.tokens);
  std::printf("our transport: %s; connections: %s; client copy on receipt: %s; malloc keeps "
              "freed memory: %s\n",
              ours.Describe().c_str(), setup.shared_connection ? "one shared" : "one per stream",
              setup.client_copy ? "yes" : "no", absl::GetFlag(FLAGS_malloc_keep) ? "yes" : "no");
  std::printf("load average at start: %s", LoadAverage().c_str());
  std::fflush(stdout);

  std::vector<RowResult> rows;
  auto median = [&setup](const std::function<RowResult()>& run) {
    std::vector<RowResult> runs;
    for (int r = 0; r < setup.repeats; ++r) runs.push_back(run());
    std::sort(runs.begin(), runs.end(), [](const RowResult& a, const RowResult& b) {
      return a.GBpsEachWay() < b.GBpsEachWay();
    });
    RowResult row = std::move(runs[runs.size() / 2]);
    row.slowest_gbps = runs.front().GBpsEachWay();
    row.fastest_gbps = runs.back().GBpsEachWay();
    return row;
  };
  auto add = [&rows, &median](const std::function<RowResult()>& run) {
    RowResult row = median(run);
    std::printf("  %-34s streams=%d in_flight=%d: %.3f GB/s each way, p50 %.2f ms\n",
                row.name.c_str(), row.streams, row.in_flight, row.GBpsEachWay(), row.Percentile(0.5));
    std::fflush(stdout);
    rows.push_back(std::move(row));
  };
  std::unique_ptr<OffloadServerHandle> offload;
  if (want("echo") || want("attend")) {
    offload = StartOffload(MakeOffloadOptions(setup, ours, max_streams));
    std::printf("offload server on port %d, backend %s\n", offload->port(),
                offload->backend_text().c_str());
  }
  for (int streams : setup.streams) {
    if (want("plain")) {
      PlainEchoServer server(setup.max_message_bytes, plain_transport);
      if (!server.ok()) return 1;
      add([&] {
        return RunPlainEcho("plain echo", server.port(), plain_transport, setup.max_message_bytes,
                            streams, setup.payload_bytes, setup.seconds, setup.warmup,
                            setup.shared_connection);
      });
    }
    if (want("plain_tuned")) {
      PlainEchoServer server(setup.max_message_bytes, ours);
      if (!server.ok()) return 1;
      add([&] {
        return RunPlainEcho("plain echo, server transport", server.port(), ours,
                            setup.max_message_bytes, streams, setup.payload_bytes, setup.seconds,
                            setup.warmup, setup.shared_connection);
      });
    }
    if (want("echo")) {
      for (int in_flight : setup.echo_in_flight) {
        add([&] { return RunEchoRow("our Echo (raw)", *offload, ours, setup, streams, in_flight); });
      }
    }
    if (want("attend")) {
      for (const std::string& plane : setup.data_planes) {
        for (int in_flight : setup.in_flight) {
          add([&] {
            return RunAttendRow(plane == "inline" ? "Attend (codec)"
                                                  : absl::StrCat("Attend (", plane, ")"),
                                *offload, ours, setup, streams, in_flight, plane);
          });
        }
      }
    }
  }
  offload.reset();

  auto fill_ratios = [&rows](std::vector<RowResult>& target) {
    for (RowResult& row : target) {
      for (const RowResult& base : rows) {
        if (base.name == "plain echo" && base.streams == row.streams) {
          row.ratio = row.GBpsPerStream() / base.GBpsPerStream();
        }
      }
    }
  };
  fill_ratios(rows);
  PrintTable(rows);
  std::printf("load average at end: %s", LoadAverage().c_str());

  std::vector<RowResult> sweep;
  if (absl::GetFlag(FLAGS_sweep)) {
    std::printf("\nsweep: transport variants on our server and raw clients (1 stream)\n");
    for (const TransportConfig& variant : SweepVariants()) {
      std::unique_ptr<OffloadServerHandle> server = StartOffload(MakeOffloadOptions(setup, variant, 1));
      std::printf("  %-36s", variant.name.c_str());
      for (int in_flight : {1, 2}) {
        RowResult echo = median([&] {
          return RunEchoRow("Echo: " + variant.name, *server, variant, setup, 1, in_flight);
        });
        std::printf(" Echo if%d %.3f GB/s %.2f CPUms;", in_flight, echo.GBpsEachWay(),
                    echo.CpuMsPerMessage());
        std::fflush(stdout);
        sweep.push_back(std::move(echo));
      }
      RowResult attend = median(
          [&] { return RunAttendRow("Attend: " + variant.name, *server, variant, setup, 1, 1); });
      std::printf(" Attend if1 %.3f GB/s\n", attend.GBpsEachWay());
      std::fflush(stdout);
      sweep.push_back(std::move(attend));
    }
    fill_ratios(sweep);
    PrintTable(sweep);
  }

  const std::string json_out = absl::GetFlag(FLAGS_json_out);
  if (!json_out.empty()) {
    std::vector<std::string> row_json, sweep_json;
    for (const RowResult& row : rows) row_json.push_back(RowJson(row));
    for (const RowResult& row : sweep) sweep_json.push_back(RowJson(row));
    std::ofstream file(json_out);
    file << "{\n  \"hardware_threads\": " << std::thread::hardware_concurrency()
         << ",\n  \"payload_bytes\": " << setup.payload_bytes
         << ",\n  \"model\": " << JsonString(setup.model->name)
         << ",\n  \"our_transport\": " << JsonString(ours.Describe())
         << ",\n  \"malloc_keep\": " << (absl::GetFlag(FLAGS_malloc_keep) ? "true" : "false")
         << ",\n  \"client_copy\": " << (setup.client_copy ? "true" : "false")
         << ",\n  \"connections\": " << JsonString(setup.shared_connection ? "shared" : "per_stream")
         << ",\n  \"rows\": [\n    " << absl::StrJoin(row_json, ",\n    ")
         << "\n  ],\n  \"sweep\": [\n    " << absl::StrJoin(sweep_json, ",\n    ") << "\n  ]\n}\n";
    if (!file) {
      std::fprintf(stderr, "transport_bench: cannot write --json_out=%s\n", json_out.c_str());
      return 1;
    }
  }
  return 0;
}

}  // namespace
}  // namespace mla

int main(int argc, char** argv) {
  absl::SetProgramUsageMessage(
      "Attend payload GB/s per stream against a plain gRPC echo of the same bytes.\n\n"
      "In one process over loopback TCP it starts (1) a plain echo service\n"
      "(server/bench/plain_echo.proto: generated classes, protobuf bytes, sync API, default\n"
      "channel arguments but the message size limit) and (2) the real mla-offload stack (CPU\n"
      "backend, engine, scheduler, MlaOffloadService, the ServerBuilder settings of\n"
      "mla_offload_server), then times, per row and stream count:\n"
      "  plain echo                   one 2 MiB bytes message in flight per stream\n"
      "  plain echo, server transport the same with our HTTP/2 windows, frames, buffers\n"
      "  our Echo (raw)               our raw Echo method, GenericStub client, no copies\n"
      "  Attend (codec)               T=128 tokens x H=16 heads (2 MiB q, 2 MiB out) with the\n"
      "                               zero-copy codec, 1/2/4 messages in flight per stream\n"
      "GB/s is tensor payload (request + response) / 2 per second: each way. 'x plain' is GB/s\n"
      "per stream over the plain echo's at the same stream count (the target: >= 3 at\n"
      "2 MiB). Attend keeps compute small (SWA-only layers, one token per session, positions\n"
      "0..--positions-1, sessions recreated untimed) and prints the server's own timing.\n"
      "Client and server share this machine's cores. --sweep adds a table of transport\n"
      "variants; --json_out writes every row as JSON.\n\n"
      "  bazel run //server/bench:transport_bench -- --repeats=3 --json_out=/tmp/transport.json");
  absl::ParseCommandLine(argc, argv);
  return mla::Main();
}

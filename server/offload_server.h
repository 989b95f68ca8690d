// One mla-offload server in a process: the engine on its compute backend,
// the scheduler that feeds it, the MlaOffloadService, and the gRPC server
// they answer on, wired the one way that the binary
// (mla_offload_server.cc), the in-process tests and transport_bench share.
//
// Start builds everything, waits until the engine has published its state
// (so the first GetServerInfo is answered), and starts listening. Health
// (grpc.health.v1) answers for two names: "" (the process is alive: what a
// liveness probe asks) and "mla_offload.v1.MlaOffload" (it takes work: what
// a readiness probe asks). Drain is SIGTERM's sequence: the service's name
// NOT_SERVING while "" stays SERVING until the gRPC server stops, no new
// sessions or prompts, open streams given until the drain's end, then the
// gRPC server stops; destroying an
// OffloadServer that was not drained stops it at once (what is still open
// is cancelled). The engine thread stops after the gRPC server, and the
// service after the engine thread, which calls into it.
//
// Security: with options.tls the TCP port serves TLS only (server/access/tls.h;
// the Unix sockets stay plaintext: the socket file's permissions guard
// them); with options.auth's tokens, or a TLS client CA, every MlaOffload
// call must authenticate (server/access/auth.h) and sessions belong to tenants
// (server/access/tenants.h). Health and reflection answer every caller, for probes
// and tools: they tell only whether the server serves, and its API.
//
// Thread-safe after Start; Drain is called once.
#ifndef MLA_OFFLOAD_SERVER_OFFLOAD_SERVER_H_
#define MLA_OFFLOAD_SERVER_OFFLOAD_SERVER_H_

#include <memory>
#include <string>
#include <vector>

#include <grpcpp/grpcpp.h>

#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "kernels/backend.h"
#include "proto/transport_settings.h"
#include "server/access/auth.h"
#include "server/access/tls.h"
#include "server/engine/engine.h"
#include "server/metrics/registry.h"
#include "server/scheduler.h"
#include "server/server_metrics.h"
#include "server/service.h"

namespace mla {

// What one client connection may hold and for how long (gRPC's server
// channel arguments); zero durations switch a bound off.
struct ConnectionLimits {
  int max_streams_per_connection = 256;  // streams and calls at once; more wait
  absl::Duration max_idle = absl::Minutes(10);  // a connection without calls is closed
  absl::Duration max_age = absl::ZeroDuration();  // then GOAWAY: the client reconnects
  absl::Duration max_age_grace = absl::Seconds(30);  // for the calls in flight at max_age
  // Keepalive pings (with or without calls) more often than this without
  // data count as strikes; the third strike closes the connection.
  absl::Duration min_ping_interval = absl::Seconds(10);
  // gRPC's memory quota for every connection together (its ResourceQuota:
  // read buffers, HTTP/2 state; 0: none). gRPC 1.51 has no bound on the
  // number of connections; this is what bounds what they hold: near it gRPC
  // shrinks the flow-control windows, sends idle connections away (GOAWAY)
  // and then cancels streams (RESOURCE_EXHAUSTED), rather than growing.
  int64_t max_transport_memory_bytes = int64_t{4} << 30;
};

struct OffloadServerOptions {
  std::string listen = "127.0.0.1:0";  // HOST:PORT; port 0 picks a free one
  // Paths of Unix domain sockets to serve gRPC on as well (for clients on
  // the same host). A path that exists already is refused: it may be
  // another server's socket.
  std::vector<std::string> unix_sockets;
  EngineOptions engine;  // max_answer_bytes is set from service.max_message_bytes
  SchedulerOptions scheduler;
  ServiceOptions service;
  TransportSettings transport = DefaultTransport();
  ConnectionLimits connections;
  TlsOptions tls;  // on the TCP port
  // Tokens; client_certificates is set from tls.client_ca_file.
  AuthOptions auth;
  // grpc.health.v1 and gRPC server reflection, which answer every caller
  // without a token (probes, tools): each can be left out. Health is a
  // setting of the process's gRPC library, so the last server started in a
  // process decides (the server binary starts one).
  bool health = true;
  bool reflection = true;
};

class OffloadServer {
 public:
  // `registry` receives the server's metrics and must outlive it.
  static absl::StatusOr<std::unique_ptr<OffloadServer>> Start(
      std::unique_ptr<ComputeBackend> backend, const OffloadServerOptions& options,
      metrics::Registry& registry);
  ~OffloadServer();
  OffloadServer(const OffloadServer&) = delete;
  OffloadServer& operator=(const OffloadServer&) = delete;

  int port() const { return port_; }
  // The backend's description (ServerInfo.backend).
  const std::string& backend_text() const { return backend_text_; }
  Scheduler& scheduler() { return *scheduler_; }
  MlaOffloadService& service() { return *service_; }
  grpc::Server& grpc_server() { return *server_; }

  // Reports the service's name NOT_SERVING ("" stays SERVING), refuses new
  // sessions and prompts, waits up to
  // `drain` for the open streams to end, then stops the gRPC server
  // (cancelling what is still open).
  void Drain(absl::Duration drain);

 private:
  OffloadServer() = default;

  std::string backend_text_;
  // Destroyed bottom-up: the gRPC server, then the engine thread, then the
  // service and the metrics they both use.
  std::unique_ptr<ServerMetrics> metrics_;
  std::unique_ptr<Authenticator> auth_;
  std::unique_ptr<MlaOffloadService> service_;
  std::unique_ptr<Scheduler> scheduler_;
  std::unique_ptr<grpc::Server> server_;
  int port_ = 0;
  bool stopped_ = false;
};

}  // namespace mla

#endif  // MLA_OFFLOAD_SERVER_OFFLOAD_SERVER_H_

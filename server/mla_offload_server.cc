// mla_offload_server: serves DeepSeek-V4 sparse MLA attention over gRPC.
#include <csignal>
#include <cstdio>
#include <iostream>
#include <algorithm>
#include <memory>
#include <optional>
#include <string>
#include <thread>
#include <vector>

#include "absl/flags/flag.h"
#include "absl/flags/internal/parse.h"
#include "absl/flags/internal/usage.h"
#include "absl/flags/parse.h"
#include "absl/flags/usage.h"
#include "absl/flags/usage_config.h"
#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "absl/time/clock.h"
#include "kernels/backend_factory.h"
#include "kernels/geometry.h"
#include "kernels/model_profile.h"
#include "proto/addresses.h"
#include "server/metrics/http_exporter.h"
#include "server/metrics/process_metrics.h"
#include "server/metrics/registry.h"
#include "server/offload_server.h"
#include "server/process/build_info.h"
#include "server/process/host_memory.h"

ABSL_FLAG(std::vector<std::string>, listen, {"127.0.0.1:50051"},
          "Where to serve gRPC, a comma list: one HOST:PORT (port 0 picks a free port, printed "
          "at start), and any number of unix:PATH, Unix domain sockets for clients on this host "
          "(a PATH that exists is refused; the server removes its sockets when it stops). A "
          "HOST other hosts can reach (0.0.0.0, [::], a network address) needs TLS "
          "(--tls_cert_file) and authentication (--auth_tokens_file or --tls_client_ca_file), "
          "or --allow_insecure.");
ABSL_FLAG(int, max_connections, 1024,
          "Client connections that may have calls running at once; a call from another "
          "connection meanwhile is RESOURCE_EXHAUSTED (0: no limit). gRPC itself caps no "
          "connections: idle ones cost little and close after --max_connection_idle_s.");
ABSL_FLAG(int, max_streams_per_connection, 256,
          "Streams and calls one client connection may have open at once; more wait for one "
          "to end (HTTP/2 MAX_CONCURRENT_STREAMS).");
ABSL_FLAG(int, max_connection_idle_s, 600,
          "A client connection without a call for this long is closed (0: never).");
ABSL_FLAG(int, max_connection_age_s, 0,
          "A client connection is asked to go (GOAWAY) after this long, and the client "
          "reconnects (0: never); calls in flight get --max_connection_age_grace_s more.");
ABSL_FLAG(int, max_connection_age_grace_s, 30,
          "How long calls in flight may go on after --max_connection_age_s.");
ABSL_FLAG(int, min_client_ping_interval_s, 10,
          "Keepalive pings a client sends more often than this without data are strikes; the "
          "third closes its connection.");
ABSL_FLAG(int, max_transport_memory_mb, 4096,
          "MiB of memory gRPC may hold for all client connections together (its ResourceQuota: "
          "read buffers, HTTP/2 state); 0: no bound. This gRPC (1.51) cannot limit the number "
          "of connections; this bounds what they cost instead: near it gRPC shrinks the "
          "flow-control windows and sends idle connections away (GOAWAY: clients reconnect), "
          "and a message that does not fit ends its stream with RESOURCE_EXHAUSTED. Keep it "
          "above a few of the largest messages (--max_message_mb).");
ABSL_FLAG(bool, health, true,
          "Serve grpc.health.v1 (liveness and readiness probes), which answers without a "
          "token. --nohealth leaves it out (then probe some other way, e.g. an exec probe).");
ABSL_FLAG(bool, reflection, true,
          "Serve gRPC server reflection (the public schema, for tools such as grpcurl), which "
          "answers without a token. --noreflection leaves it out.");
ABSL_FLAG(bool, allow_insecure, false,
          "Serve on an address other hosts can reach without TLS and authentication: any "
          "client that reaches the port can then list, read, change and close every session "
          "(and read the traffic). Only on a network you control (a Kubernetes NetworkPolicy, "
          "as deploy/k8s/base has).");
ABSL_FLAG(std::string, tls_cert_file, "",
          "PEM certificate chain (the server's certificate first) for TLS on the gRPC TCP "
          "port; with --tls_key_file. Read again every --credentials_reload_s, so a rotation "
          "in place (cert-manager) reaches new connections without a restart. Unix sockets "
          "stay plaintext.");
ABSL_FLAG(std::string, tls_key_file, "", "PEM private key of --tls_cert_file (unencrypted).");
ABSL_FLAG(std::string, tls_client_ca_file, "",
          "Mutual TLS: PEM CA certificates; every client must present a certificate one of "
          "them signed, valid now. The certificate's subject common name (CN) is the client's "
          "tenant when it sends no token. Needs --tls_cert_file; reloaded as it is.");
ABSL_FLAG(std::string, auth_tokens_file, "",
          "Bearer tokens: calls must send the metadata \"authorization: Bearer TOKEN\". One "
          "line per token, TENANT SHA256_HEX_OF_TOKEN [operator] (`printf %s \"$TOKEN\" | "
          "sha256sum`), # starts a comment. Hashes only: the file never holds a token. An "
          "operator may list and close every tenant's sessions. Read again every "
          "--credentials_reload_s; a new file that does not parse is logged and the old "
          "tokens stay.");
ABSL_FLAG(int, credentials_reload_s, 10,
          "How often --tls_cert_file, --tls_key_file, --tls_client_ca_file and "
          "--auth_tokens_file are read again for changes.");
ABSL_FLAG(int, max_sessions_per_tenant, 1024,
          "Sessions one tenant may hold at once; CreateSession past it is RESOURCE_EXHAUSTED. "
          "Only with authentication (--auth_tokens_file or --tls_client_ca_file): without it "
          "the server is one tenant, bounded by --kv_cache_gb alone.");
ABSL_FLAG(int64_t, max_kv_blocks_per_tenant, 0,
          "KV blocks (64 tokens each) one tenant's sessions may hold; a CreateSession or "
          "AppendKV that would pass it is RESOURCE_EXHAUSTED (blocks that decode steps add are "
          "counted, not refused). 0: only the pool's size; set it when tenants share a server. "
          "Only with authentication.");
ABSL_FLAG(int, max_streams_per_tenant, 1024,
          "Attend and Echo streams one tenant may have open at once; more are refused "
          "RESOURCE_EXHAUSTED. Only with authentication.");
ABSL_FLAG(std::string, backend, "cpu",
          "Compute backend: cpu (any machine) or cuda (an NVIDIA Hopper GPU).");
ABSL_FLAG(int, device, 0, "GPU ordinal for --backend=cuda.");
ABSL_FLAG(int, cpu_threads, 0, "Threads of the CPU backend; 0 uses every hardware thread.");
ABSL_FLAG(std::string, model, "deepseek-v4-flash,deepseek-v4-pro",
          "Comma-separated model profiles this server accepts sessions for.");
ABSL_FLAG(double, kv_cache_gb, 4.0,
          "KV cache size in GB (1e9 bytes): blocks of 64 tokens x 584 bytes, shared by every "
          "session, layer and pool.");
ABSL_FLAG(int, max_position, 1 << 18,
          "Positions must be below this; sizes the RoPE tables (256 bytes a position per "
          "layer kind).");
ABSL_FLAG(int, max_tokens_per_message, 1024, "Largest number of query tokens in one Attend message.");
ABSL_FLAG(int, max_message_mb, 256, "Largest gRPC message accepted or sent, in MiB.");
ABSL_FLAG(int, max_batch_tokens, 1024,
          "Tokens the scheduler gathers into one kernel launch across streams.");
ABSL_FLAG(int, batch_wait_us, 200,
          "The longest a batch waits for Attend messages of other active streams (streams that "
          "sent a message in the last --active_stream_ms and have none in the batch yet); a "
          "lone stream's batches never wait.");
ABSL_FLAG(int, active_stream_ms, 100,
          "How long after its last message an Attend stream counts as active, so that batches "
          "wait (up to --batch_wait_us) for its next message.");
ABSL_FLAG(int, batches_in_flight, -1,
          "Batches left running on the device while the scheduler plans and stages the next "
          "(pipelining: the host's work on one batch overlaps the device's on the one before). "
          "-1: 1 on --backend=cuda, 0 on --backend=cpu (its work is done as it is issued); "
          "0 turns pipelining off.");
ABSL_FLAG(int, max_queued_messages, 4096,
          "Attend messages that may wait for the engine; beyond it new ones get "
          "RESOURCE_EXHAUSTED.");
ABSL_FLAG(int, max_messages_in_flight, 8,
          "Attend messages one stream may have read but not yet answered (read-ahead; "
          "--max_unanswered_mb bounds their bytes).");
ABSL_FLAG(int, max_unanswered_mb, 64,
          "MiB one Attend stream may hold unanswered: the bytes of its messages read and not yet "
          "answered plus its answers not yet written. At the bound the stream's next message is "
          "not read until answers are written, so a client that does not read its answers is "
          "stopped by flow control instead of filling the server's memory (one message larger "
          "than the bound is still taken when nothing else is unanswered). Echo holds one "
          "message at a time.");
ABSL_FLAG(int, session_idle_ttl_s, 600,
          "Sessions idle longer than this are closed (a session may ask for its own TTL).");
ABSL_FLAG(int, max_session_idle_ttl_s, 3600,
          "The longest idle TTL a session may ask for; one that asks for more gets this (so "
          "that no client pins KV blocks for longer). At least --session_idle_ttl_s.");
ABSL_FLAG(int, max_regions_per_client, 64,
          "Same-host data plane: shared-memory regions one client (mla-client-id, else its "
          "connection; with authentication, within its tenant) may hold registered at once; "
          "RegisterRegion past it is RESOURCE_EXHAUSTED.");
ABSL_FLAG(int, max_region_gb_per_client, 64,
          "Same-host data plane: GiB (2^30 bytes) of regions one client (within its tenant, with "
          "authentication) may hold registered at "
          "once (the server maps them: address space, not memory of its own).");
ABSL_FLAG(bool, allow_cuda_ipc, true,
          "Same-host data plane: take CUDA IPC regions (GPU memory of a client process). A "
          "CUDA IPC handle is a bearer credential: any same-host caller that learns one can "
          "have the server read and write that process's GPU memory. On a host shared by "
          "tenants that do not trust each other, pass --allow_cuda_ipc=false (RegisterRegion "
          "of REGION_KIND_CUDA_IPC is then PERMISSION_DENIED).");
ABSL_FLAG(int, region_grace_s, 30,
          "Same-host data plane: a client's regions are unregistered once it has held no Attend "
          "stream and no session it created for this long (a client that died leaves none).");
ABSL_FLAG(std::string, metrics_listen, "127.0.0.1:9464",
          "Where to serve Prometheus's /metrics, HOST:PORT with a numeric host: 127.0.0.1:9464 "
          "(loopback only, the default), 0.0.0.0:9464 (every IPv4 interface), [::1]:9464, "
          "[::]:9464 (every interface, IPv4 too); port 0 picks a free port (printed at start); "
          "empty turns metrics off. Metrics hold counts and timings, never session ids or "
          "tensors; on a network others share, add --metrics_basic_auth_file and "
          "--metrics_tls_cert_file. The default port is not Prometheus's own 9090, so that both "
          "run on one host.");
ABSL_FLAG(std::string, metrics_port, "",
          "For scripts older than --metrics_listen, and read only when given: -1 turns metrics "
          "off, a port (0..65535) replaces --metrics_listen's.");
ABSL_FLAG(int, metrics_idle_timeout_s, 10,
          "A metrics connection that sends nothing for this long (a stalled or slow scraper) is "
          "closed. Two threads serve every connection without blocking, so a slow one never "
          "holds up another scrape.");
ABSL_FLAG(int, metrics_max_connections, 64,
          "Metrics connections open at once; one client address may hold a quarter of them (at "
          "least 1). Past that new connections are closed at once.");
ABSL_FLAG(std::string, metrics_tls_cert_file, "",
          "Serve /metrics over HTTPS with this PEM certificate (chain); needs "
          "--metrics_tls_key_file. Read once at start.");
ABSL_FLAG(std::string, metrics_tls_key_file, "",
          "The PEM private key of --metrics_tls_cert_file.");
ABSL_FLAG(std::string, metrics_basic_auth_file, "",
          "Require HTTP basic auth on /metrics: a file holding one line USER:PASSWORD (read once "
          "at start; a flag would show the password in the process list). Other requests get "
          "401. Use it with TLS on a network others share: basic auth alone sends the password "
          "in the clear.");
ABSL_FLAG(bool, keep_freed_memory, true,
          "Keep freed host memory in the process (glibc mallopt: blocks up to 64 MiB from the "
          "heap, trimmed only above 1 GiB free) so that every Attend message's multi-MiB gRPC "
          "and staging buffers are reused instead of mapped, faulted in and zeroed again. "
          "Costs up to about 1 GiB of resident memory kept after bursts; false: glibc defaults.");
ABSL_FLAG(int, drain_seconds, 25,
          "On SIGTERM: stop taking sessions, report NOT_SERVING for mla_offload.v1.MlaOffload "
          "(\"\" stays SERVING), and give in-flight streams this long before shutting down. "
          "The default stays below Kubernetes' default grace period of 30 s.");

namespace mla {
namespace {

constexpr char kVersionNumber[] = "0.1.0";

// "mla-offload 0.1.0 (mla_offload.v1), commit 0123456789ab": --version,
// ServerInfo.version and the mla_build_info metric.
std::string VersionText() {
  return absl::StrCat("mla-offload ", kVersionNumber, " (mla_offload.v1), commit ", kBuildCommit);
}

volatile std::sig_atomic_t g_signal = 0;
void OnSignal(int signal) { g_signal = signal; }

int Fail(const absl::Status& status) {
  std::fprintf(stderr, "mla_offload_server: %s\n", std::string(status.message()).c_str());
  return 1;
}

// The numeric flags, each in the range the server can run with; the error
// names the flag and the range.
absl::Status CheckFlags() {
  struct IntFlag {
    const char* name;
    int64_t value, low, high;
  };
  const IntFlag int_flags[] = {
      {"cpu_threads", absl::GetFlag(FLAGS_cpu_threads), 0, 4096},
      {"device", absl::GetFlag(FLAGS_device), 0, 1023},
      {"max_position", absl::GetFlag(FLAGS_max_position), 1, 1 << 24},
      {"max_tokens_per_message", absl::GetFlag(FLAGS_max_tokens_per_message), 1, 1 << 16},
      {"max_message_mb", absl::GetFlag(FLAGS_max_message_mb), 1, 1023},
      {"max_batch_tokens", absl::GetFlag(FLAGS_max_batch_tokens), 1, 1 << 20},
      {"batch_wait_us", absl::GetFlag(FLAGS_batch_wait_us), 0, 10000000},
      {"active_stream_ms", absl::GetFlag(FLAGS_active_stream_ms), 0, 3600000},
      {"batches_in_flight", absl::GetFlag(FLAGS_batches_in_flight), -1, 1},
      {"max_queued_messages", absl::GetFlag(FLAGS_max_queued_messages), 1, 1 << 24},
      {"max_messages_in_flight", absl::GetFlag(FLAGS_max_messages_in_flight), 1, 1024},
      {"max_unanswered_mb", absl::GetFlag(FLAGS_max_unanswered_mb), 1, 1 << 16},
      {"session_idle_ttl_s", absl::GetFlag(FLAGS_session_idle_ttl_s), 1, 365 * 24 * 3600},
      {"max_session_idle_ttl_s", absl::GetFlag(FLAGS_max_session_idle_ttl_s), 1, 365 * 24 * 3600},
      {"max_regions_per_client", absl::GetFlag(FLAGS_max_regions_per_client), 1, 1 << 16},
      {"max_region_gb_per_client", absl::GetFlag(FLAGS_max_region_gb_per_client), 1, 1 << 20},
      {"region_grace_s", absl::GetFlag(FLAGS_region_grace_s), 1, 7 * 24 * 3600},
      {"metrics_idle_timeout_s", absl::GetFlag(FLAGS_metrics_idle_timeout_s), 1, 3600},
      {"metrics_max_connections", absl::GetFlag(FLAGS_metrics_max_connections), 1, 1 << 16},
      {"drain_seconds", absl::GetFlag(FLAGS_drain_seconds), 0, 24 * 3600},
      {"max_streams_per_connection", absl::GetFlag(FLAGS_max_streams_per_connection), 1, 1 << 16},
      {"max_connection_idle_s", absl::GetFlag(FLAGS_max_connection_idle_s), 0, 365 * 24 * 3600},
      {"max_connection_age_s", absl::GetFlag(FLAGS_max_connection_age_s), 0, 365 * 24 * 3600},
      {"max_connection_age_grace_s", absl::GetFlag(FLAGS_max_connection_age_grace_s), 0, 24 * 3600},
      {"min_client_ping_interval_s", absl::GetFlag(FLAGS_min_client_ping_interval_s), 0, 3600},
      {"max_transport_memory_mb", absl::GetFlag(FLAGS_max_transport_memory_mb), 0, 1 << 24},
      {"credentials_reload_s", absl::GetFlag(FLAGS_credentials_reload_s), 1, 24 * 3600},
      {"max_sessions_per_tenant", absl::GetFlag(FLAGS_max_sessions_per_tenant), 1, 1 << 24},
      {"max_kv_blocks_per_tenant", absl::GetFlag(FLAGS_max_kv_blocks_per_tenant), 0, int64_t{1} << 40},
      {"max_streams_per_tenant", absl::GetFlag(FLAGS_max_streams_per_tenant), 1, 1 << 24},
      {"max_connections", absl::GetFlag(FLAGS_max_connections), 0, 1 << 24},
  };
  for (const IntFlag& flag : int_flags) {
    if (flag.value < flag.low || flag.value > flag.high) {
      return absl::InvalidArgumentError(absl::StrCat("--", flag.name, "=", flag.value,
                                                     " is outside ", flag.low, "..", flag.high));
    }
  }
  if (absl::GetFlag(FLAGS_session_idle_ttl_s) > absl::GetFlag(FLAGS_max_session_idle_ttl_s)) {
    return absl::InvalidArgumentError(absl::StrCat(
        "--session_idle_ttl_s=", absl::GetFlag(FLAGS_session_idle_ttl_s),
        " is above --max_session_idle_ttl_s=", absl::GetFlag(FLAGS_max_session_idle_ttl_s),
        ": raise the cap or lower the default"));
  }
  const double gb = absl::GetFlag(FLAGS_kv_cache_gb);
  if (!(gb * 1e9 >= kBlockBytes && gb <= 1e6)) {
    return absl::InvalidArgumentError(absl::StrCat(
        "--kv_cache_gb=", gb, " must hold at least one block of ", kBlockBytes,
        " bytes and be at most 1e6"));
  }
  return absl::OkStatus();
}

// The TCP address of --listen (exactly one) and its unix:PATH entries,
// appended to `unix_sockets`.
absl::StatusOr<std::string> SplitListen(const std::vector<std::string>& listen,
                                        std::vector<std::string>& unix_sockets) {
  std::vector<std::string> tcp;
  for (const std::string& address : listen) {
    if (absl::StartsWith(address, "unix:")) {
      unix_sockets.push_back(address.substr(5));
    } else {
      tcp.push_back(address);
    }
  }
  if (tcp.size() != 1) {
    return absl::InvalidArgumentError(absl::StrCat(
        "--listen: give exactly one HOST:PORT (and any number of unix:PATH); got ", tcp.size(),
        " HOST:PORT addresses"));
  }
  // A plain HOST:PORT: a scheme (unix-abstract:, dns:///, ipv4:) would be
  // taken for a host.
  if (absl::StrContains(tcp[0], "/") || absl::StartsWith(tcp[0], "unix-abstract:") ||
      absl::StartsWith(tcp[0], "ipv4:") || absl::StartsWith(tcp[0], "ipv6:")) {
    return absl::InvalidArgumentError(absl::StrCat(
        "--listen=", tcp[0], ": give the TCP address as HOST:PORT (e.g. 127.0.0.1:50051, "
        "[::1]:50051) and Unix sockets as unix:PATH"));
  }
  return tcp[0];
}

// The metrics endpoint's settings from the --metrics_* flags; nullopt when
// metrics are off.
absl::StatusOr<std::optional<metrics::HttpExporterOptions>> MetricsOptions() {
  metrics::HttpExporterOptions options;
  options.listen = absl::GetFlag(FLAGS_metrics_listen);
  if (const std::string text = absl::GetFlag(FLAGS_metrics_port); !text.empty()) {
    int port;
    if (!absl::SimpleAtoi(text, &port) || port < -1 || port > 65535) {
      return absl::InvalidArgumentError(absl::StrCat(
          "--metrics_port=", text, " is not -1 (off) or a port in 0..65535; or give "
          "--metrics_listen=HOST:PORT"));
    }
    if (port == -1) return std::nullopt;
    const size_t colon = options.listen.rfind(':');
    if (colon == std::string::npos) {
      return absl::InvalidArgumentError(absl::StrCat(
          "--metrics_port=", port, " replaces the port of --metrics_listen, which has none ('",
          options.listen, "'): give the whole address as --metrics_listen=HOST:PORT"));
    }
    options.listen = absl::StrCat(options.listen.substr(0, colon), ":", port);
  }
  if (options.listen.empty()) return std::nullopt;
  options.threads = 2;
  options.idle_timeout = absl::Seconds(absl::GetFlag(FLAGS_metrics_idle_timeout_s));
  options.max_connections = absl::GetFlag(FLAGS_metrics_max_connections);
  options.max_connections_per_ip = std::max(1, options.max_connections / 4);
  options.tls_cert_file = absl::GetFlag(FLAGS_metrics_tls_cert_file);
  options.tls_key_file = absl::GetFlag(FLAGS_metrics_tls_key_file);
  if (const std::string path = absl::GetFlag(FLAGS_metrics_basic_auth_file); !path.empty()) {
    absl::StatusOr<metrics::BasicAuthCredentials> credentials = metrics::ReadBasicAuthFile(path);
    if (!credentials.ok()) {
      return absl::Status(credentials.status().code(),
                          absl::StrCat("--metrics_basic_auth_file: ", credentials.status().message()));
    }
    options.basic_auth_user = credentials->user;
    options.basic_auth_password = credentials->password;
  }
  return options;
}

int Main() {
  if (absl::Status status = CheckFlags(); !status.ok()) return Fail(status);
  absl::StatusOr<std::optional<metrics::HttpExporterOptions>> metrics_options = MetricsOptions();
  if (!metrics_options.ok()) return Fail(metrics_options.status());
  std::vector<const ModelProfile*> models;
  for (absl::string_view name : absl::StrSplit(absl::GetFlag(FLAGS_model), ',', absl::SkipEmpty())) {
    absl::StatusOr<const ModelProfile*> profile = FindModelProfile(name);
    if (!profile.ok()) return Fail(absl::InvalidArgumentError(absl::StrCat("--model: ", profile.status().message())));
    models.push_back(*profile);
  }
  if (models.empty()) return Fail(absl::InvalidArgumentError("--model names no profile"));
  const int64_t kv_blocks = static_cast<int64_t>(absl::GetFlag(FLAGS_kv_cache_gb) * 1e9 / kBlockBytes);

  BackendOptions backend_options;
  backend_options.cpu_threads = absl::GetFlag(FLAGS_cpu_threads);
  backend_options.device = absl::GetFlag(FLAGS_device);
  absl::StatusOr<std::unique_ptr<ComputeBackend>> backend =
      CreateBackend(absl::GetFlag(FLAGS_backend), backend_options);
  if (!backend.ok()) return Fail(absl::InvalidArgumentError(absl::StrCat("--backend: ", backend.status().message())));
  const std::string backend_text = (*backend)->Describe();

  OffloadServerOptions options;
  absl::StatusOr<std::string> tcp = SplitListen(absl::GetFlag(FLAGS_listen), options.unix_sockets);
  if (!tcp.ok()) return Fail(tcp.status());
  options.health = absl::GetFlag(FLAGS_health);
  options.reflection = absl::GetFlag(FLAGS_reflection);
  options.tls.cert_file = absl::GetFlag(FLAGS_tls_cert_file);
  options.tls.key_file = absl::GetFlag(FLAGS_tls_key_file);
  options.tls.client_ca_file = absl::GetFlag(FLAGS_tls_client_ca_file);
  options.tls.reload_interval = absl::Seconds(absl::GetFlag(FLAGS_credentials_reload_s));
  options.auth.tokens_file = absl::GetFlag(FLAGS_auth_tokens_file);
  options.auth.reload_interval = options.tls.reload_interval;
  const bool authenticated =
      !options.auth.tokens_file.empty() || !options.tls.client_ca_file.empty();
  if (!mla::wire::IsLoopbackAddress(*tcp) && !absl::GetFlag(FLAGS_allow_insecure) &&
      !(options.tls.enabled() && authenticated)) {
    return Fail(absl::FailedPreconditionError(absl::StrCat(
        "--listen=", *tcp, " can be reached from other hosts, and this server has ",
        options.tls.enabled() ? "TLS but no authentication"
        : authenticated       ? "authentication but no TLS (tokens would cross the network in the clear)"
                              : "no TLS or authentication",
        ": give --tls_cert_file and --tls_key_file, and --auth_tokens_file or "
        "--tls_client_ca_file (docs/operations.md shows how); or listen on 127.0.0.1 or a unix: "
        "socket; or pass --allow_insecure on a network you control")));
  }
  options.listen = *tcp;
  options.engine.kv_blocks = kv_blocks;
  options.connections.max_streams_per_connection = absl::GetFlag(FLAGS_max_streams_per_connection);
  options.connections.max_idle = absl::Seconds(absl::GetFlag(FLAGS_max_connection_idle_s));
  options.connections.max_age = absl::Seconds(absl::GetFlag(FLAGS_max_connection_age_s));
  options.connections.max_age_grace = absl::Seconds(absl::GetFlag(FLAGS_max_connection_age_grace_s));
  options.connections.min_ping_interval =
      absl::Seconds(absl::GetFlag(FLAGS_min_client_ping_interval_s));
  options.connections.max_transport_memory_bytes =
      int64_t{absl::GetFlag(FLAGS_max_transport_memory_mb)} << 20;
  options.engine.max_position = absl::GetFlag(FLAGS_max_position);
  options.engine.max_tokens_per_message = absl::GetFlag(FLAGS_max_tokens_per_message);
  options.engine.default_idle_ttl = absl::Seconds(absl::GetFlag(FLAGS_session_idle_ttl_s));
  options.engine.max_idle_ttl = absl::Seconds(absl::GetFlag(FLAGS_max_session_idle_ttl_s));
  options.engine.models = models;
  options.engine.batches_in_flight = absl::GetFlag(FLAGS_batches_in_flight);
  options.scheduler.max_batch_tokens = absl::GetFlag(FLAGS_max_batch_tokens);
  options.scheduler.batch_wait = absl::Microseconds(absl::GetFlag(FLAGS_batch_wait_us));
  options.scheduler.active_stream_window = absl::Milliseconds(absl::GetFlag(FLAGS_active_stream_ms));
  options.scheduler.max_queued_messages = absl::GetFlag(FLAGS_max_queued_messages);
  options.service.max_messages_in_flight = absl::GetFlag(FLAGS_max_messages_in_flight);
  options.service.max_connections = absl::GetFlag(FLAGS_max_connections);
  options.service.max_unanswered_bytes = int64_t{absl::GetFlag(FLAGS_max_unanswered_mb)} << 20;
  options.service.max_message_bytes = int64_t{absl::GetFlag(FLAGS_max_message_mb)} << 20;
  options.service.version = VersionText();
  options.service.devices = backend_text;
  options.service.regions.max_regions_per_owner = absl::GetFlag(FLAGS_max_regions_per_client);
  options.service.regions.max_bytes_per_owner =
      int64_t{absl::GetFlag(FLAGS_max_region_gb_per_client)} << 30;
  options.service.regions.grace = absl::Seconds(absl::GetFlag(FLAGS_region_grace_s));
  options.service.allow_cuda_ipc = absl::GetFlag(FLAGS_allow_cuda_ipc);
  options.service.tenants.max_sessions = absl::GetFlag(FLAGS_max_sessions_per_tenant);
  options.service.tenants.max_kv_blocks = absl::GetFlag(FLAGS_max_kv_blocks_per_tenant);
  options.service.tenants.max_streams = absl::GetFlag(FLAGS_max_streams_per_tenant);
  metrics::Registry registry;
  if (absl::StatusOr<metrics::GaugeFamily*> build = registry.AddGauge(
          "mla_build_info", "1, labelled with the server's version and the commit it was built from.",
          {"version", "commit"});
      build.ok()) {
    absl::StatusOr<metrics::Gauge*> info = (*build)->WithLabels({kVersionNumber, kBuildCommit});
    if (info.ok()) (*info)->Set(1);
  }
  absl::StatusOr<std::unique_ptr<metrics::ProcessMetrics>> process =
      metrics::ProcessMetrics::Add(registry);
  if (!process.ok()) return Fail(process.status());
  absl::StatusOr<std::unique_ptr<OffloadServer>> started =
      OffloadServer::Start(*std::move(backend), options, registry);
  if (!started.ok()) return Fail(started.status());
  OffloadServer& server = **started;
  const std::string& listen = options.listen;
  const int port = server.port();

  metrics::HttpExporter exporter(&registry);
  if (metrics_options->has_value()) {
    if (absl::Status status = exporter.Start(**metrics_options); !status.ok()) {
      return Fail(absl::Status(status.code(), absl::StrCat("--metrics_listen: ", status.message())));
    }
  }
  // Before the line that says the server is up: a SIGTERM that follows it at
  // once (a test, an orchestrator) drains instead of killing the process.
  std::signal(SIGTERM, OnSignal);
  std::signal(SIGINT, OnSignal);
  std::string also;
  for (const std::string& path : options.unix_sockets) absl::StrAppend(&also, " and unix:", path);
  std::printf("mla_offload_server: serving on %s:%d%s (backend %s, models %s, KV cache %lld blocks = %.2f GB)",
              listen.substr(0, listen.rfind(':')).c_str(), port, also.c_str(), backend_text.c_str(),
              absl::GetFlag(FLAGS_model).c_str(), static_cast<long long>(kv_blocks),
              kv_blocks * kBlockBytes / 1e9);
  if (options.tls.enabled()) {
    std::printf(", TLS%s", options.tls.client_ca_file.empty() ? "" : " with client certificates");
  }
  if (!options.auth.tokens_file.empty()) std::printf(", bearer tokens");
  if (metrics_options->has_value()) {
    const std::string& metrics_listen = (*metrics_options)->listen;
    std::printf(", metrics on port %d (%s://%s:%d/metrics)", exporter.port(),
                (*metrics_options)->tls_cert_file.empty() ? "http" : "https",
                metrics_listen.substr(0, metrics_listen.rfind(':')).c_str(), exporter.port());
  }
  std::printf("\n");
  std::fflush(stdout);

  while (g_signal == 0) std::this_thread::sleep_for(std::chrono::milliseconds(50));

  const int drain_seconds = absl::GetFlag(FLAGS_drain_seconds);
  std::printf("mla_offload_server: signal %d: draining (mla_offload.v1.MlaOffload NOT_SERVING, no new "
              "sessions) for up to %d s\n",
              static_cast<int>(g_signal), drain_seconds);
  std::fflush(stdout);
  server.Drain(absl::Seconds(drain_seconds));
  exporter.Stop();
  started->reset();
  std::printf("mla_offload_server: stopped\n");
  return 0;
}

}  // namespace
}  // namespace mla

int main(int argc, char** argv) {
  absl::SetProgramUsageMessage(
      "Serves DeepSeek-V4 sparse MLA attention over gRPC (mla_offload.v1.MlaOffload).\n"
      "Serving nodes create a session per sequence, append its prompt KV, then stream one\n"
      "Attend message per layer step; the server keeps the FP8 KV cache, runs the fused\n"
      "prologue and the sparse decode, and streams the output back.\n\n"
      "  mla_offload_server --listen=127.0.0.1:50051 --backend=cpu --kv_cache_gb=4\n\n"
      "It listens on loopback by default. An address other hosts reach needs TLS and\n"
      "authentication (or --allow_insecure, on a network you control):\n\n"
      "  mla_offload_server --listen=0.0.0.0:50051 --tls_cert_file=server.pem \\\n"
      "      --tls_key_file=server.key --auth_tokens_file=tokens\n\n"
      "Each token names a tenant; a tenant sees and uses only its own sessions\n"
      "(docs/threat-model.md). Health and reflection answer without a token (--nohealth,\n"
      "--noreflection leave them out).\n\n"
      "Health: grpc.health.v1 for two service names: \"\" (liveness: SERVING until the\n"
      "process exits) and \"mla_offload.v1.MlaOffload\" (readiness: NOT_SERVING from the\n"
      "start of the drain on). Metrics: Prometheus text on http://--metrics_listen/metrics\n"
      "(127.0.0.1:9464 by default; HTTPS and basic auth by flags).\n"
      "SIGTERM drains, then stops.");
  absl::FlagsUsageConfig usage;
  usage.version_string = [] { return mla::VersionText() + "\n"; };
  absl::SetFlagsUsageConfig(usage);
  // As absl::ParseCommandLine, but --help and --version (what an operator
  // asks to learn, not an error) exit 0; Abseil's own handling exits 1.
  absl::flags_internal::ParseCommandLineImpl(
      argc, argv, absl::flags_internal::ArgvListAction::kRemoveParsedArgs,
      absl::flags_internal::UsageFlagsAction::kIgnoreUsage,
      absl::flags_internal::OnUndefinedFlag::kAbortIfUndefined);
  if (absl::flags_internal::HandleUsageFlags(std::cout, absl::ProgramUsageMessage()) != -1) {
    return 0;
  }
  if (absl::GetFlag(FLAGS_keep_freed_memory) && !mla::KeepFreedHostMemory()) {
    std::fprintf(stderr, "warning: malloc refused the --keep_freed_memory settings\n");
  }
  return mla::Main();
}

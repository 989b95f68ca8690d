#include "server/offload_server.h"

#include <sys/stat.h>
#include <sys/un.h>

#include <algorithm>
#include <chrono>
#include <future>
#include <thread>
#include <utility>

#include <grpcpp/ext/proto_server_reflection_plugin.h>
#include <grpcpp/health_check_service_interface.h>
#include <grpcpp/resource_quota.h>

#include "absl/strings/str_cat.h"
#include "proto/mla_offload.grpc.pb.h"

namespace mla {
namespace {

// The health name a readiness probe asks: the service's own.
constexpr const char* kReadinessName = mla_offload::v1::MlaOffload::service_full_name();

// Takes gRPC server reflection's plugin off a builder.
class WithoutReflection : public grpc::ServerBuilderOption {
 public:
  void UpdateArguments(grpc::ChannelArguments*) override {}
  void UpdatePlugins(std::vector<std::unique_ptr<grpc::ServerBuilderPlugin>>* plugins) override {
    plugins->erase(std::remove_if(plugins->begin(), plugins->end(),
                                  [](const std::unique_ptr<grpc::ServerBuilderPlugin>& plugin) {
                                    return plugin->name() == "proto_server_reflection";
                                  }),
                   plugins->end());
  }
};

}  // namespace

absl::StatusOr<std::unique_ptr<OffloadServer>> OffloadServer::Start(
    std::unique_ptr<ComputeBackend> backend, const OffloadServerOptions& options,
    metrics::Registry& registry) {
  std::unique_ptr<OffloadServer> server(new OffloadServer());
  server->backend_text_ = backend->Describe();
  std::shared_ptr<grpc::ServerCredentials> tcp_credentials = grpc::InsecureServerCredentials();
  if (options.tls.enabled()) {
    absl::StatusOr<std::shared_ptr<grpc::ServerCredentials>> tls =
        TlsServerCredentialsFromFiles(options.tls);
    if (!tls.ok()) return tls.status();
    tcp_credentials = *std::move(tls);
  } else if (!options.tls.key_file.empty() || !options.tls.client_ca_file.empty()) {
    return absl::InvalidArgumentError(
        "--tls_key_file and --tls_client_ca_file need --tls_cert_file (TLS on the gRPC port)");
  }
  AuthOptions auth_options = options.auth;
  auth_options.client_certificates = !options.tls.client_ca_file.empty();
  absl::StatusOr<std::unique_ptr<Authenticator>> auth = Authenticator::Create(auth_options);
  if (!auth.ok()) return auth.status();
  server->auth_ = *std::move(auth);
  // Regions are pinned for the device's copies, and CUDA IPC regions opened
  // for its kernels (both outlive the backend).
  std::shared_ptr<HostPinner> pinner = backend->MakeHostPinner();
  std::shared_ptr<DeviceImporter> importer = backend->MakeDeviceImporter();
  EngineOptions engine_options = options.engine;
  engine_options.max_answer_bytes = options.service.max_message_bytes;
  absl::StatusOr<std::unique_ptr<Engine>> engine =
      Engine::Create(std::move(backend), engine_options);
  if (!engine.ok()) return engine.status();
  absl::StatusOr<std::unique_ptr<ServerMetrics>> metrics = ServerMetrics::Create(registry);
  if (!metrics.ok()) return metrics.status();
  server->metrics_ = *std::move(metrics);

  // The service exists before the scheduler whose thread calls into it.
  auto scheduler = std::make_unique<Scheduler>(*std::move(engine), options.scheduler);
  ServiceOptions service_options = options.service;
  service_options.max_segments_per_message = engine_options.max_tokens_per_message;
  if (service_options.regions.pinner == nullptr) service_options.regions.pinner = std::move(pinner);
  if (service_options.regions.importer == nullptr) {
    service_options.regions.importer = std::move(importer);
  }
  if (server->auth_->enabled()) service_options.auth = server->auth_.get();
  server->service_ =
      std::make_unique<MlaOffloadService>(*scheduler, *server->metrics_, service_options);
  ServerMetrics& metrics_ref = *server->metrics_;
  MlaOffloadService& service_ref = *server->service_;
  scheduler->SetBatchObserver([&metrics_ref](const BatchStats& stats) { metrics_ref.RecordBatch(stats); });
  scheduler->SetStateObserver([&service_ref](const Engine& engine) { service_ref.PublishEngineState(engine); });
  scheduler->SetSweepObserver([&service_ref](const Engine& engine) { service_ref.Sweep(engine); });
  // SetStateObserver's first publication is queued; wait for it.
  std::promise<void> published;
  scheduler->Run([&published](Engine&) {
    published.set_value();
    return Scheduler::Reply();
  });
  published.get_future().wait();
  server->scheduler_ = std::move(scheduler);

  grpc::EnableDefaultHealthCheckService(options.health);
  grpc::reflection::InitProtoReflectionServerBuilderPlugin();
  grpc::ServerBuilder builder;
  // The reflection library adds itself to every builder of the process (a
  // static initialiser): left out by taking its plugin off this one.
  if (!options.reflection) builder.SetOption(std::make_unique<WithoutReflection>());
  builder.AddListeningPort(options.listen, tcp_credentials, &server->port_);
  std::vector<int> unix_bound(options.unix_sockets.size(), 0);
  for (size_t i = 0; i < options.unix_sockets.size(); ++i) {
    const std::string& path = options.unix_sockets[i];
    if (path.size() >= sizeof(sockaddr_un::sun_path)) {
      return absl::InvalidArgumentError(absl::StrCat(
          "cannot listen on unix:", path, ": the path has ", path.size(),
          " characters and a Unix socket's at most ", sizeof(sockaddr_un::sun_path) - 1,
          "; use a shorter one"));
    }
    struct stat existing;
    if (path.empty() || ::stat(path.c_str(), &existing) == 0) {
      return absl::FailedPreconditionError(absl::StrCat(
          "cannot listen on unix:", path,
          path.empty() ? ": the path is empty"
                       : ": the path exists (another server's socket, or one left by a server that "
                         "did not stop cleanly: remove it if no server uses it)"));
    }
    builder.AddListeningPort("unix:" + path, grpc::InsecureServerCredentials(), &unix_bound[i]);
  }
  // gRPC binds with SO_REUSEPORT by default: a second server on a port in
  // use would start, and the kernel would split new connections between
  // the two. Without it the bind fails and the server refuses to start.
  builder.AddChannelArgument(GRPC_ARG_ALLOW_REUSEPORT, 0);
  const ConnectionLimits& limits = options.connections;
  const auto ms = [](absl::Duration d) {
    return static_cast<int>(std::min<int64_t>(absl::ToInt64Milliseconds(d), INT32_MAX));
  };
  builder.AddChannelArgument(GRPC_ARG_MAX_CONCURRENT_STREAMS, limits.max_streams_per_connection);
  if (limits.max_idle > absl::ZeroDuration()) {
    builder.AddChannelArgument(GRPC_ARG_MAX_CONNECTION_IDLE_MS, ms(limits.max_idle));
  }
  if (limits.max_age > absl::ZeroDuration()) {
    builder.AddChannelArgument(GRPC_ARG_MAX_CONNECTION_AGE_MS, ms(limits.max_age));
    builder.AddChannelArgument(GRPC_ARG_MAX_CONNECTION_AGE_GRACE_MS, ms(limits.max_age_grace));
  }
  builder.AddChannelArgument(GRPC_ARG_HTTP2_MIN_RECV_PING_INTERVAL_WITHOUT_DATA_MS,
                             ms(limits.min_ping_interval));
  builder.AddChannelArgument(GRPC_ARG_HTTP2_MAX_PING_STRIKES, 2);
  // Idle connections may be kept alive too, at that interval.
  builder.AddChannelArgument(GRPC_ARG_KEEPALIVE_PERMIT_WITHOUT_CALLS, 1);
  if (limits.max_transport_memory_bytes > 0) {
    grpc::ResourceQuota quota("mla-offload connections");
    quota.Resize(static_cast<size_t>(limits.max_transport_memory_bytes));
    builder.SetResourceQuota(quota);
  }
  builder.RegisterService(server->service_.get());
  const int transport_limit = TransportMessageLimit(options.service.max_message_bytes);
  builder.SetMaxReceiveMessageSize(transport_limit);
  builder.SetMaxSendMessageSize(transport_limit);
  options.transport.Apply(
      [&builder](const char* name, int value) { builder.AddChannelArgument(name, value); });
  server->server_ = builder.BuildAndStart();
  if (server->server_ == nullptr || server->port_ == 0) {
    server->server_.reset();
    return absl::UnavailableError(absl::StrCat("cannot listen on --listen=", options.listen,
                                               " (address in use or not local?)"));
  }
  for (size_t i = 0; i < unix_bound.size(); ++i) {
    if (unix_bound[i] == 0) {
      server->server_.reset();
      return absl::UnavailableError(absl::StrCat("cannot listen on unix:", options.unix_sockets[i],
                                                 " (is its directory there and writable?)"));
    }
  }
  if (grpc::HealthCheckServiceInterface* health = server->server_->GetHealthCheckService();
      health != nullptr) {
    health->SetServingStatus("", true);
    health->SetServingStatus(kReadinessName, true);
  }
  return server;
}

void OffloadServer::Drain(absl::Duration drain) {
  const auto deadline = std::chrono::system_clock::now() + absl::ToChronoNanoseconds(drain);
  service_->StartDraining();
  // Only readiness: a liveness probe that failed now would have the pod
  // killed in the middle of its drain.
  if (grpc::HealthCheckServiceInterface* health = server_->GetHealthCheckService();
      health != nullptr) {
    health->SetServingStatus(kReadinessName, false);
  }
  while (service_->open_streams() > 0 && std::chrono::system_clock::now() < deadline) {
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
  }
  // With the streams gone only short unary calls can be in flight: give them
  // a moment, not the rest of the drain.
  server_->Shutdown(std::min(deadline, std::chrono::system_clock::now() + std::chrono::milliseconds(500)));
  stopped_ = true;
}

OffloadServer::~OffloadServer() {
  if (server_ != nullptr && !stopped_) {
    server_->Shutdown(std::chrono::system_clock::now() + std::chrono::seconds(1));
  }
  server_.reset();
  scheduler_.reset();
}

}  // namespace mla

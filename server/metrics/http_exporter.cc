#include "server/metrics/http_exporter.h"

#include <arpa/inet.h>
#include <microhttpd.h>
#include <netinet/in.h>
#include <sys/socket.h>

#include <cstdarg>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <fstream>
#include <sstream>
#include <string>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/strip.h"

namespace mla::metrics {
namespace {

// Where to listen: an IPv4 or an IPv6 socket address.
struct ListenAddress {
  sockaddr_storage storage{};
  bool ipv6 = false;
  bool any = false;  // every interface ([::] also takes IPv4)
  uint16_t port = 0;
};

absl::StatusOr<ListenAddress> ParseListen(const std::string& listen) {
  const auto invalid = [&listen](absl::string_view why) {
    return absl::InvalidArgumentError(absl::StrCat(
        "metrics address '", listen, "': ", why,
        "; give HOST:PORT with a numeric host, e.g. 127.0.0.1:9464, 0.0.0.0:9464, [::1]:9464 "
        "or [::]:9464"));
  };
  const size_t colon = listen.rfind(':');
  if (colon == std::string::npos) return invalid("no port");
  absl::string_view host = absl::string_view(listen).substr(0, colon);
  int port;
  if (!absl::SimpleAtoi(listen.substr(colon + 1), &port) || port < 0 || port > 65535) {
    return invalid("the port is not a number in [0, 65535]");
  }
  ListenAddress address;
  address.port = static_cast<uint16_t>(port);
  if (absl::ConsumePrefix(&host, "[")) {
    if (!absl::ConsumeSuffix(&host, "]")) return invalid("an IPv6 host's '[' has no ']'");
    auto* in6 = reinterpret_cast<sockaddr_in6*>(&address.storage);
    in6->sin6_family = AF_INET6;
    in6->sin6_port = htons(static_cast<uint16_t>(port));
    if (inet_pton(AF_INET6, std::string(host).c_str(), &in6->sin6_addr) != 1) {
      return invalid("the host in brackets is not a numeric IPv6 address");
    }
    address.ipv6 = true;
    address.any = IN6_IS_ADDR_UNSPECIFIED(&in6->sin6_addr);
    return address;
  }
  auto* in4 = reinterpret_cast<sockaddr_in*>(&address.storage);
  in4->sin_family = AF_INET;
  in4->sin_port = htons(static_cast<uint16_t>(port));
  if (inet_pton(AF_INET, std::string(host).c_str(), &in4->sin_addr) != 1) {
    return invalid("the host is not a numeric IPv4 address (an IPv6 one goes in brackets)");
  }
  address.any = in4->sin_addr.s_addr == htonl(INADDR_ANY);
  return address;
}

absl::StatusOr<std::string> ReadFile(const std::string& path, absl::string_view what) {
  std::ifstream file(path, std::ios::binary);
  std::stringstream text;
  text << file.rdbuf();
  if (!file) {
    return absl::NotFoundError(
        absl::StrCat("cannot read ", what, " '", path, "' (is it there and readable?)"));
  }
  return text.str();
}

// Whether `given` equals `expected` (not empty), in a time that does not
// depend on where they differ.
bool SameSecret(absl::string_view given, absl::string_view expected) {
  if (expected.empty()) return false;
  unsigned char differ = given.size() != expected.size() ? 1 : 0;
  for (size_t i = 0; i < given.size(); ++i) differ |= given[i] ^ expected[i % expected.size()];
  return differ == 0;
}

MHD_Result Respond(MHD_Connection* connection, unsigned int code, const std::string& body,
                   const char* content_type) {
  MHD_Response* response = MHD_create_response_from_buffer(
      body.size(), const_cast<char*>(body.data()), MHD_RESPMEM_MUST_COPY);
  if (response == nullptr) return MHD_NO;
  MHD_add_response_header(response, MHD_HTTP_HEADER_CONTENT_TYPE, content_type);
  const MHD_Result queued = MHD_queue_response(connection, code, response);
  MHD_destroy_response(response);
  return queued;
}

}  // namespace

// The registry and the credentials the daemon's threads read; Handle is
// libmicrohttpd's request handler, with a Served as its closure.
struct HttpExporter::Served {
  const Registry* registry;
  std::string user;  // empty: no basic auth
  std::string password;

  // Whether the request carries the configured user and password.
  bool Authorized(MHD_Connection* connection) const {
    char* given_password = nullptr;
    char* given_user = MHD_basic_auth_get_username_password(connection, &given_password);
    const bool ok = given_user != nullptr && given_password != nullptr &&
                    SameSecret(given_user, user) && SameSecret(given_password, password);
    MHD_free(given_user);
    MHD_free(given_password);
    return ok;
  }

  // Every request is answered on its first call (a body, if any, is never
  // read).
  static MHD_Result Handle(void* cls, MHD_Connection* connection, const char* url,
                           const char* method, const char*, const char*, size_t*, void**) {
    const auto& served = *static_cast<const Served*>(cls);
    constexpr char kPlain[] = "text/plain; charset=utf-8";
    if (!served.user.empty() && !served.Authorized(connection)) {
      static const char kBody[] =
          "Unauthorized: give the metrics user and password (basic auth)\n";
      MHD_Response* response = MHD_create_response_from_buffer(
          sizeof(kBody) - 1, const_cast<char*>(kBody), MHD_RESPMEM_PERSISTENT);
      if (response == nullptr) return MHD_NO;
      MHD_add_response_header(response, MHD_HTTP_HEADER_CONTENT_TYPE, kPlain);
      const MHD_Result queued =
          MHD_queue_basic_auth_fail_response(connection, "mla-offload metrics", response);
      MHD_destroy_response(response);
      return queued;
    }
    if (std::strcmp(url, "/metrics") != 0) {
      return Respond(connection, MHD_HTTP_NOT_FOUND, "Not found: metrics are at /metrics\n",
                     kPlain);
    }
    if (std::strcmp(method, "GET") != 0) {
      return Respond(connection, MHD_HTTP_METHOD_NOT_ALLOWED, "Only GET is served\n", kPlain);
    }
    return Respond(connection, MHD_HTTP_OK, served.registry->RenderText(), kTextContentType);
  }
};

// libmicrohttpd's log (cls is the exporter's StartLog): while Start runs,
// the first message (why the daemon did not start: "Failed to bind to port
// 9464: Address already in use") is kept; later ones (a scanner's failed TLS
// handshake) are dropped, so that no client can fill the server's log.
struct HttpExporter::StartLog {
  absl::Mutex mu;
  bool capturing ABSL_GUARDED_BY(mu) = false;
  std::string first ABSL_GUARDED_BY(mu);

  static void Capture(void* cls, const char* format, va_list args) {
    auto& log = *static_cast<StartLog*>(cls);
    absl::MutexLock lock(&log.mu);
    if (!log.capturing || !log.first.empty()) return;
    char text[512];
    std::vsnprintf(text, sizeof(text), format, args);
    log.first = std::string(absl::StripTrailingAsciiWhitespace(text));
  }
};

absl::StatusOr<BasicAuthCredentials> ReadBasicAuthFile(const std::string& path) {
  absl::StatusOr<std::string> text = ReadFile(path, "the metrics basic-auth file");
  if (!text.ok()) return text.status();
  absl::string_view line = *text;
  absl::ConsumeSuffix(&line, "\n");
  absl::ConsumeSuffix(&line, "\r");
  const size_t colon = line.find(':');
  if (colon == absl::string_view::npos || colon == 0 || colon + 1 == line.size() ||
      line.find('\n') != absl::string_view::npos) {
    return absl::InvalidArgumentError(absl::StrCat(
        "the metrics basic-auth file '", path,
        "' must hold one line USER:PASSWORD, both parts non-empty"));
  }
  return BasicAuthCredentials{std::string(line.substr(0, colon)),
                              std::string(line.substr(colon + 1))};
}

HttpExporter::HttpExporter(const Registry* registry)
    : served_(std::make_unique<Served>(Served{registry, "", ""})),
      start_log_(std::make_unique<StartLog>()) {}

HttpExporter::~HttpExporter() { Stop(); }

absl::Status HttpExporter::Start(const HttpExporterOptions& options) {
  absl::StatusOr<ListenAddress> address = ParseListen(options.listen);
  if (!address.ok()) return address.status();
  if (options.threads < 1 || options.max_connections < 1 || options.max_connections_per_ip < 1 ||
      options.idle_timeout < absl::Seconds(1)) {
    return absl::InvalidArgumentError(absl::StrCat(
        "metrics exporter: threads (", options.threads, "), connections (",
        options.max_connections, "), connections per address (", options.max_connections_per_ip,
        ") must be at least 1 and the idle timeout (", absl::FormatDuration(options.idle_timeout),
        ") at least 1 s"));
  }
  if (options.tls_cert_file.empty() != options.tls_key_file.empty()) {
    return absl::InvalidArgumentError(
        "metrics TLS needs both the certificate and the key file; give both or neither");
  }
  if (options.basic_auth_user.find(':') != std::string::npos ||
      (!options.basic_auth_user.empty() && options.basic_auth_password.empty())) {
    return absl::InvalidArgumentError(
        "metrics basic auth: the user must not hold ':' and the password must not be empty");
  }
  const bool tls = !options.tls_cert_file.empty();
  std::string cert, key;
  if (tls) {
    absl::StatusOr<std::string> read = ReadFile(options.tls_cert_file, "the metrics TLS certificate");
    if (!read.ok()) return read.status();
    cert = *std::move(read);
    read = ReadFile(options.tls_key_file, "the metrics TLS key");
    if (!read.ok()) return read.status();
    key = *std::move(read);
  }

  absl::MutexLock lock(&mu_);
  if (daemon_ != nullptr) {
    return absl::FailedPreconditionError(
        absl::StrCat("metrics exporter already serves on port ", port_, "; cannot start it again on ",
                     options.listen));
  }
  served_->user = options.basic_auth_user;
  served_->password = options.basic_auth_password;
  tls_cert_ = std::move(cert);
  tls_key_ = std::move(key);

  unsigned int flags = MHD_USE_EPOLL_INTERNAL_THREAD | MHD_USE_ERROR_LOG;
  if (address->ipv6) flags |= address->any ? MHD_USE_DUAL_STACK : MHD_USE_IPv6;
  if (tls) flags |= MHD_USE_TLS;
  // Without TLS the certificate's entry ends the list.
  MHD_OptionItem items[] = {
      {MHD_OPTION_SOCK_ADDR, 0, &address->storage},
      {MHD_OPTION_THREAD_POOL_SIZE, options.threads, nullptr},
      {MHD_OPTION_CONNECTION_TIMEOUT,
       static_cast<intptr_t>(absl::ToInt64Seconds(options.idle_timeout)), nullptr},
      {MHD_OPTION_CONNECTION_LIMIT, options.max_connections, nullptr},
      {MHD_OPTION_PER_IP_CONNECTION_LIMIT, options.max_connections_per_ip, nullptr},
      {tls ? MHD_OPTION_HTTPS_MEM_CERT : MHD_OPTION_END, 0, const_cast<char*>(tls_cert_.c_str())},
      {MHD_OPTION_HTTPS_MEM_KEY, 0, const_cast<char*>(tls_key_.c_str())},
      {MHD_OPTION_END, 0, nullptr},
  };
  {
    absl::MutexLock log_lock(&start_log_->mu);
    start_log_->capturing = true;
    start_log_->first.clear();
  }
  // The port is the socket address's; libmicrohttpd's messages name this one.
  MHD_Daemon* daemon = MHD_start_daemon(flags, address->port, nullptr, nullptr, &Served::Handle, served_.get(),
                                        MHD_OPTION_EXTERNAL_LOGGER, &StartLog::Capture,
                                        start_log_.get(), MHD_OPTION_ARRAY, items, MHD_OPTION_END);
  std::string failure;
  {
    absl::MutexLock log_lock(&start_log_->mu);
    start_log_->capturing = false;
    failure = start_log_->first;
  }
  if (daemon == nullptr) {
    return absl::UnavailableError(absl::StrCat(
        "cannot serve metrics on ", options.listen, ": ",
        failure.empty() ? "libmicrohttpd did not start (no reason given)" : failure));
  }
  const MHD_DaemonInfo* bound = MHD_get_daemon_info(daemon, MHD_DAEMON_INFO_BIND_PORT);
  if (bound == nullptr || bound->port == 0) {
    MHD_stop_daemon(daemon);
    return absl::UnavailableError(absl::StrCat("cannot serve metrics on ", options.listen,
                                               ": libmicrohttpd reports no port"));
  }
  daemon_ = daemon;
  port_ = bound->port;
  return absl::OkStatus();
}

void HttpExporter::Stop() {
  absl::MutexLock lock(&mu_);
  if (daemon_ == nullptr) return;
  MHD_stop_daemon(daemon_);
  daemon_ = nullptr;
  port_ = 0;
}

int HttpExporter::port() const {
  absl::MutexLock lock(&mu_);
  return port_;
}

}  // namespace mla::metrics

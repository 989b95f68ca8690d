#include "server/metrics/http_exporter.h"

#include <arpa/inet.h>
#include <civetweb.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <atomic>
#include <cstring>
#include <optional>
#include <string>
#include <thread>

#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "absl/time/time.h"

namespace mla::metrics {
namespace {

// civetweb's request handler; cbdata is the Registry.
int HandleRequest(mg_connection* connection, void* cbdata) {
  const mg_request_info* request = mg_get_request_info(connection);
  if (std::strcmp(request->local_uri, "/metrics") != 0) {
    mg_send_http_error(connection, 404, "Not found: metrics are at /metrics\n");
    return 404;
  }
  if (std::strcmp(request->request_method, "GET") != 0) {
    mg_send_http_error(connection, 405, "Only GET is served\n");
    return 405;
  }
  const std::string body = static_cast<const Registry*>(cbdata)->RenderText();
  mg_send_http_ok(connection, kTextContentType,
                  static_cast<long long>(body.size()));
  mg_write(connection, body.data(), body.size());
  return 200;
}

// civetweb gives the cause of a failed start ("cannot bind to ...: Address
// already in use") only to its log callback, on the thread calling mg_start2;
// its error text just says "Failed to setup server ports". Start points this
// at a string for the duration of mg_start2, which keeps the first message.
thread_local std::string* start_failure = nullptr;

int LogMessage(const mg_connection*, const char* message) {
  if (start_failure == nullptr) return 0;  // civetweb's default: drop it
  if (start_failure->empty()) *start_failure = message;
  return 1;
}

// civetweb wants its global state set up once per process, before any server
// starts; mg_start2 would otherwise do it itself, racing with other starts.
void InitCivetwebOnce() {
  [[maybe_unused]] static const unsigned features = mg_init_library(0);
}

// Where a client on this machine reaches a listener on host:port; nullopt
// when host is not a numeric IPv4 address.
std::optional<sockaddr_in> LocalAddress(const std::string& host, int port) {
  sockaddr_in address{};
  address.sin_family = AF_INET;
  address.sin_port = htons(static_cast<uint16_t>(port));
  if (inet_pton(AF_INET, host.c_str(), &address.sin_addr) != 1) {
    return std::nullopt;
  }
  if (address.sin_addr.s_addr == htonl(INADDR_ANY)) {
    address.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  }
  return address;
}

// Connects and hangs up at once.
void Knock(const sockaddr_in& address) {
  const int fd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
  if (fd < 0) return;
  connect(fd, reinterpret_cast<const sockaddr*>(&address), sizeof(address));
  close(fd);
}

}  // namespace

HttpExporter::~HttpExporter() { Stop(); }

absl::Status HttpExporter::Start(absl::string_view host, int port) {
  if (port < 0 || port > 65535) {
    return absl::InvalidArgumentError(
        absl::StrCat("metrics port ", port, " is outside [0, 65535]"));
  }
  const std::string address = absl::StrCat(host, ":", port);
  if (!LocalAddress(std::string(host), port).has_value()) {
    return absl::InvalidArgumentError(
        absl::StrCat("metrics address ", address,
                     ": the host must be a numeric IPv4 "
                     "address such as 0.0.0.0 or 127.0.0.1"));
  }
  absl::MutexLock lock(&mu_);
  if (context_ != nullptr) {
    return absl::FailedPreconditionError(
        absl::StrCat("metrics exporter already serves on port ", port_,
                     "; cannot start it again on ", address));
  }
  InitCivetwebOnce();
  const char* options[] = {
      "listening_ports",
      address.c_str(),
      "num_threads",
      "2",
      // A stalled scraper may hold a worker at most this long.
      "request_timeout_ms",
      "10000",
      nullptr,
  };
  mg_callbacks callbacks{};
  callbacks.log_message = LogMessage;
  mg_init_data init{};
  init.callbacks = &callbacks;
  init.configuration_options = options;
  char error_text[256] = "";
  mg_error_data error{};
  error.text = error_text;
  error.text_buffer_size = sizeof(error_text);
  std::string failure;
  start_failure = &failure;
  mg_context* context = mg_start2(&init, &error);
  start_failure = nullptr;
  if (context == nullptr) {
    return absl::UnavailableError(
        absl::StrCat("cannot serve metrics on ", address, ": ",
                     failure.empty() ? error_text : failure));
  }
  // One handler for every path, so that only /metrics itself is served.
  mg_set_request_handler(context, "/", HandleRequest,
                         const_cast<Registry*>(registry_));
  mg_server_port bound{};
  if (mg_get_server_ports(context, 1, &bound) != 1) {
    mg_stop(context);
    return absl::UnavailableError(absl::StrCat(
        "cannot serve metrics on ", address, ": civetweb reports no port"));
  }
  context_ = context;
  host_ = std::string(host);
  port_ = bound.port;
  return absl::OkStatus();
}

void HttpExporter::Stop() {
  absl::MutexLock lock(&mu_);
  if (context_ == nullptr) return;
  // civetweb's listener thread looks at its stop flag only between polls of
  // 2 s (SOCKET_TIMEOUT_QUANTUM in Debian's build), so mg_stop alone takes up
  // to 2 s. A connection wakes the poll; once the flag is set, civetweb no
  // longer accepts it and it is reset with the listening socket. Knock until
  // mg_stop returns, since when the flag gets set is not observable.
  const sockaddr_in address = *LocalAddress(host_, port_);
  std::atomic<bool> stopped{false};
  std::thread knocker([&address, &stopped] {
    while (!stopped.load()) {
      Knock(address);
      absl::SleepFor(absl::Milliseconds(1));
    }
  });
  mg_stop(context_);
  stopped.store(true);
  knocker.join();
  context_ = nullptr;
  port_ = 0;
}

int HttpExporter::port() const {
  absl::MutexLock lock(&mu_);
  return port_;
}

}  // namespace mla::metrics

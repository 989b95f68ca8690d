// Serves a Registry to Prometheus over HTTP (or HTTPS), with GNU
// libmicrohttpd.
//
// GET /metrics answers 200 with Registry::RenderText() and Content-Type
// kTextContentType; other methods on /metrics answer 405, every other path
// 404. With basic auth configured, a request without the right user and
// password answers 401 (with a WWW-Authenticate challenge) whatever its path.
//
// Slow clients: a fixed pool of `threads` threads serves every connection
// from one event loop each (epoll), so a client that sends half a request
// and stalls holds a connection slot, never a thread: other scrapes are
// answered meanwhile. A connection that sends nothing for `idle_timeout`
// is closed; at most `max_connections` are open at once, and at most
// `max_connections_per_ip` from one address, so one host cannot take every
// slot (beyond them new connections are closed at once).
//
// Ownership: the exporter reads the registry it was constructed with, which
// must outlive it.
//
// Thread safety: Start, Stop and port may be called from any thread.
//
// Errors: Start returns INVALID_ARGUMENT for an address that is not
// HOST:PORT with a numeric host (an IPv4 address, or an IPv6 one in
// brackets) and a port in [0, 65535], for limits below 1, for TLS with only
// one of the certificate and the key, and for a basic-auth user that holds
// ':' or an empty password; NOT_FOUND naming a TLS file that cannot be read;
// FAILED_PRECONDITION when already started; and UNAVAILABLE, naming the
// address and the library's reason, when it cannot listen there (port
// taken, address not local, a certificate or key GnuTLS refuses). Stop
// cannot fail.
#ifndef MLA_OFFLOAD_SERVER_METRICS_HTTP_EXPORTER_H_
#define MLA_OFFLOAD_SERVER_METRICS_HTTP_EXPORTER_H_

#include <memory>
#include <string>

#include "absl/base/thread_annotations.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "server/metrics/registry.h"

struct MHD_Daemon;

namespace mla::metrics {

struct HttpExporterOptions {
  // HOST:PORT: "127.0.0.1:9464", "0.0.0.0:9464" (every IPv4 interface),
  // "[::1]:9464", "[::]:9464" (every interface, IPv4 too). Port 0 picks a
  // free port; port() tells which.
  std::string listen = "127.0.0.1:0";
  int threads = 2;
  absl::Duration idle_timeout = absl::Seconds(10);
  int max_connections = 64;
  int max_connections_per_ip = 16;
  // HTTPS when both are set: PEM files of the certificate (chain) and its
  // private key, read once by Start.
  std::string tls_cert_file;
  std::string tls_key_file;
  // HTTP basic auth when `basic_auth_user` is set: only that user with that
  // password is answered.
  std::string basic_auth_user;
  std::string basic_auth_password;
};

// The user and password of a basic-auth file: one line "USER:PASSWORD" (a
// trailing newline is ignored). INVALID_ARGUMENT naming the file when the
// line has no ':' or an empty part, NOT_FOUND when it cannot be read.
struct BasicAuthCredentials {
  std::string user;
  std::string password;
};
absl::StatusOr<BasicAuthCredentials> ReadBasicAuthFile(const std::string& path);

class HttpExporter {
 public:
  explicit HttpExporter(const Registry* registry);
  // Stops the server if it runs.
  ~HttpExporter();
  HttpExporter(const HttpExporter&) = delete;
  HttpExporter& operator=(const HttpExporter&) = delete;

  // Listens on options.listen and serves until Stop. Start after Stop is
  // allowed.
  absl::Status Start(const HttpExporterOptions& options) ABSL_LOCKS_EXCLUDED(mu_);

  // Closes the listening socket and every connection, and waits for the
  // threads. Does nothing when not started.
  void Stop() ABSL_LOCKS_EXCLUDED(mu_);

  // The port listened on; 0 when not started.
  int port() const ABSL_LOCKS_EXCLUDED(mu_);

 private:
  struct Served;
  struct StartLog;

  mutable absl::Mutex mu_;
  // What the daemon's threads read (libmicrohttpd's closure); written by
  // Start (under mu_) only while no daemon runs.
  const std::unique_ptr<Served> served_;
  const std::unique_ptr<StartLog> start_log_;
  // PEM text that libmicrohttpd reads for as long as the daemon runs.
  std::string tls_cert_ ABSL_GUARDED_BY(mu_);
  std::string tls_key_ ABSL_GUARDED_BY(mu_);
  MHD_Daemon* daemon_ ABSL_GUARDED_BY(mu_) = nullptr;
  int port_ ABSL_GUARDED_BY(mu_) = 0;
};

}  // namespace mla::metrics

#endif  // MLA_OFFLOAD_SERVER_METRICS_HTTP_EXPORTER_H_

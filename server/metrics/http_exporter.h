// Serves a Registry to Prometheus over HTTP, with civetweb.
//
// GET /metrics answers 200 with Registry::RenderText() and Content-Type
// kTextContentType; other methods on /metrics answer 405, every other path
// 404. Two civetweb worker threads serve requests; connections are closed
// after each response.
//
// Ownership: the exporter reads the registry it was constructed with, which
// must outlive it.
//
// Thread safety: Start, Stop and port may be called from any thread.
//
// Errors: Start returns INVALID_ARGUMENT for a host that is not a numeric
// IPv4 address or a port outside [0, 65535],
// FAILED_PRECONDITION when already started, and UNAVAILABLE, naming the
// address and civetweb's reason, when it cannot listen there (port taken,
// address not local). Stop cannot fail.
#ifndef MLA_OFFLOAD_SERVER_METRICS_HTTP_EXPORTER_H_
#define MLA_OFFLOAD_SERVER_METRICS_HTTP_EXPORTER_H_

#include <string>

#include "absl/base/thread_annotations.h"
#include "absl/status/status.h"
#include "absl/strings/string_view.h"
#include "absl/synchronization/mutex.h"
#include "server/metrics/registry.h"

struct mg_context;

namespace mla::metrics {

class HttpExporter {
 public:
  explicit HttpExporter(const Registry* registry) : registry_(registry) {}
  // Stops the server if it runs.
  ~HttpExporter();
  HttpExporter(const HttpExporter&) = delete;
  HttpExporter& operator=(const HttpExporter&) = delete;

  // Listens on host:port and serves until Stop. `host` is a numeric IPv4
  // address: "0.0.0.0" for every interface, "127.0.0.1" for loopback only.
  // Port 0 picks a free port; port() tells which. Start after Stop is
  // allowed.
  absl::Status Start(absl::string_view host, int port) ABSL_LOCKS_EXCLUDED(mu_);

  // Closes the listening socket and waits for requests in progress. Does
  // nothing when not started.
  void Stop() ABSL_LOCKS_EXCLUDED(mu_);

  // The port listened on; 0 when not started.
  int port() const ABSL_LOCKS_EXCLUDED(mu_);

 private:
  const Registry* const registry_;
  mutable absl::Mutex mu_;
  mg_context* context_ ABSL_GUARDED_BY(mu_) = nullptr;
  std::string host_ ABSL_GUARDED_BY(mu_);
  int port_ ABSL_GUARDED_BY(mu_) = 0;
};

}  // namespace mla::metrics

#endif  // MLA_OFFLOAD_SERVER_METRICS_HTTP_EXPORTER_H_

// Who is calling: the tenant a call acts for, from its bearer token or its
// verified client certificate, and whether it is an operator.
//
// Tokens: a call sends the request metadata `authorization: Bearer TOKEN`.
// The tokens file (--auth_tokens_file) holds one line per token,
//   TENANT SHA256_HEX_OF_TOKEN [operator]
// where `#` starts a comment and blank lines are ignored; it holds hashes
// only (`printf %s "$TOKEN" | sha256sum`). A presented token is hashed with
// OpenSSL's SHA-256 and compared with every line's hash in constant time.
// A tenant is 1 to 64 characters of A-Z, a-z, 0-9, ".", "-" and "_"; one
// tenant may have several lines (tokens being rotated); a hash appears once.
//
// Client certificates (mutual TLS, --tls_client_ca_file): the TLS layer has
// verified the certificate against the client CA before any call arrives;
// its subject's common name (CN) is the tenant. A certificate never makes
// an operator: only a token line that says `operator` does.
//
// The rule for a call: a call that sends an authorization header is judged
// by it alone (a wrong token is UNAUTHENTICATED even with a good
// certificate, and so is any token on a server that takes none: a client
// that thinks it sends credentials is told they count for nothing); a call
// without one is the tenant of its verified client
// certificate when client certificates are on; anything else is
// UNAUTHENTICATED, with a message that says what to send and never the
// token. Without tokens and client certificates, authentication is off:
// every call is the one tenant "" (as a server on loopback has always been).
//
// Reloading: the tokens file is read again every `reload_interval` (by a
// thread of the Authenticator) and whenever ReloadNow is called; a changed
// file that parses replaces the tokens at once (calls after that see only
// the new ones; reloads run one at a time, so the file read last is the one
// installed last), a changed file that does not parse keeps the old tokens and
// is logged once with the line that is wrong. Nothing here logs a token or
// a hash.
//
// Thread-safe.
#ifndef MLA_OFFLOAD_SERVER_ACCESS_AUTH_H_
#define MLA_OFFLOAD_SERVER_ACCESS_AUTH_H_

#include <array>
#include <condition_variable>
#include <cstdint>
#include <functional>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <thread>
#include <vector>

#include <grpcpp/server_context.h>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "absl/time/time.h"

namespace mla {

// The caller of one call.
struct Caller {
  std::string tenant;        // "" when authentication is off
  bool is_operator = false;  // may list and close every tenant's sessions
  // What the service holds for the call while it runs (its connection's
  // place, server/access/connection_gate.h); shared by the Caller's copies.
  std::shared_ptr<const void> connection;
};

using Sha256Digest = std::array<uint8_t, 32>;

Sha256Digest Sha256(absl::string_view bytes);

// INVALID_ARGUMENT unless `name` is a tenant name (see above); the message
// starts with `what`.
absl::Status CheckTenantName(absl::string_view name, absl::string_view what);

struct TokenLine {
  std::string tenant;
  Sha256Digest hash;
  bool is_operator = false;
};

// The lines of a tokens file; INVALID_ARGUMENT names the first wrong line
// ("line 3: ...") and what it should be. An empty list is valid (it lets
// no token in).
absl::StatusOr<std::vector<TokenLine>> ParseTokensFile(absl::string_view text);

struct AuthOptions {
  std::string tokens_file;                 // empty: no tokens
  bool client_certificates = false;        // mutual TLS names tenants
  absl::Duration reload_interval = absl::Seconds(10);
  // For tests, to force an interleaving: called by every reload after it
  // has read the tokens file and before it parses and installs it.
  std::function<void()> after_read_for_test;
};

class Authenticator {
 public:
  // Reads the tokens file (a file that is missing or does not parse is the
  // error: the server must not start without the tokens it was given).
  static absl::StatusOr<std::unique_ptr<Authenticator>> Create(const AuthOptions& options);
  ~Authenticator();
  Authenticator(const Authenticator&) = delete;
  Authenticator& operator=(const Authenticator&) = delete;

  // Whether calls must authenticate (tokens or client certificates are on).
  bool enabled() const { return !options_.tokens_file.empty() || options_.client_certificates; }

  // The caller of a call with these credentials: `authorization` is the
  // metadata's value when the call sent one, `certificate_cn` the verified
  // client certificate's common name when it has one.
  absl::StatusOr<Caller> Authenticate(std::optional<absl::string_view> authorization,
                                      std::optional<absl::string_view> certificate_cn) const;
  // The same, from a call's metadata and TLS peer.
  absl::StatusOr<Caller> Authenticate(const grpc::ServerContextBase& context) const;

  // Reads the tokens file again now; the file's error when it changed and
  // does not parse (the old tokens stay), OK otherwise.
  absl::Status ReloadNow();

 private:
  explicit Authenticator(const AuthOptions& options) : options_(options) {}
  void ReloadLoop();

  const AuthOptions options_;
  std::mutex reload_mutex_;  // held by ReloadNow from its read to its install; before mutex_
  mutable std::mutex mutex_;
  std::shared_ptr<const std::vector<TokenLine>> tokens_;  // guarded by mutex_
  std::string last_text_;                                 // guarded by mutex_: the file as last read
  std::condition_variable stop_changed_;
  bool stopping_ = false;  // guarded by mutex_
  std::thread reloader_;
};

}  // namespace mla

#endif  // MLA_OFFLOAD_SERVER_ACCESS_AUTH_H_

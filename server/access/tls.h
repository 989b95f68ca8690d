// TLS on the server's TCP port from PEM files that are reloaded when they
// change (cert-manager and kubelet rotate a Secret's files in place).
//
// The files are checked once at start with OpenSSL (the certificate chain
// and the key parse and belong together; the client CA parses), so that a
// server with a wrong file refuses to start instead of failing every
// handshake. After that gRPC's FileWatcherCertificateProvider reads them
// again every `reload_interval` (at least 1 s): connections made after a
// rotation use the new certificate (and client CA), open ones keep theirs.
// A rotated file that does not parse is logged by gRPC and the last good
// credentials stay.
//
// Mutual TLS: with a client CA, a client must present a certificate that CA
// signed, valid now (expired or not yet valid ones fail the handshake, as
// do certificates of another CA); server/access/auth.h takes the tenant from it.
#ifndef MLA_OFFLOAD_SERVER_ACCESS_TLS_H_
#define MLA_OFFLOAD_SERVER_ACCESS_TLS_H_

#include <memory>
#include <string>

#include <grpcpp/security/server_credentials.h>

#include "absl/status/statusor.h"
#include "absl/time/time.h"

namespace mla {

struct TlsOptions {
  std::string cert_file;       // PEM chain, the server's certificate first; empty: no TLS
  std::string key_file;        // PEM private key of the certificate
  std::string client_ca_file;  // PEM CA certificates; empty: no client certificates asked
  absl::Duration reload_interval = absl::Seconds(10);

  bool enabled() const { return !cert_file.empty(); }
};

// The credentials of `options` (enabled()); INVALID_ARGUMENT naming the
// flag (--tls_cert_file, --tls_key_file, --tls_client_ca_file) and what is
// wrong with its file.
absl::StatusOr<std::shared_ptr<grpc::ServerCredentials>> TlsServerCredentialsFromFiles(
    const TlsOptions& options);

}  // namespace mla

#endif  // MLA_OFFLOAD_SERVER_ACCESS_TLS_H_

#include "server/access/tls.h"

#include <openssl/bio.h>
#include <openssl/pem.h>
#include <openssl/x509.h>

#include <algorithm>
#include <cstdio>

#include <grpcpp/security/tls_certificate_provider.h>
#include <grpcpp/security/tls_credentials_options.h>

#include "absl/strings/str_cat.h"

namespace mla {
namespace {

struct BioCloser {
  void operator()(BIO* bio) const { BIO_free(bio); }
};
struct X509Closer {
  void operator()(X509* x509) const { X509_free(x509); }
};
struct KeyCloser {
  void operator()(EVP_PKEY* key) const { EVP_PKEY_free(key); }
};

absl::StatusOr<std::unique_ptr<BIO, BioCloser>> OpenPem(const char* flag, const std::string& path) {
  std::unique_ptr<BIO, BioCloser> bio(BIO_new_file(path.c_str(), "r"));
  if (bio == nullptr) {
    return absl::InvalidArgumentError(absl::StrCat("--", flag, "=", path, ": cannot read it"));
  }
  return bio;
}

absl::StatusOr<std::unique_ptr<X509, X509Closer>> ReadCertificate(const char* flag,
                                                                  const std::string& path) {
  absl::StatusOr<std::unique_ptr<BIO, BioCloser>> bio = OpenPem(flag, path);
  if (!bio.ok()) return bio.status();
  std::unique_ptr<X509, X509Closer> cert(PEM_read_bio_X509(bio->get(), nullptr, nullptr, nullptr));
  if (cert == nullptr) {
    return absl::InvalidArgumentError(absl::StrCat(
        "--", flag, "=", path, ": holds no PEM certificate (\"-----BEGIN CERTIFICATE-----\")"));
  }
  return cert;
}

}  // namespace

absl::StatusOr<std::shared_ptr<grpc::ServerCredentials>> TlsServerCredentialsFromFiles(
    const TlsOptions& options) {
  if (options.key_file.empty()) {
    return absl::InvalidArgumentError(
        "--tls_cert_file needs --tls_key_file, the private key of its certificate");
  }
  absl::StatusOr<std::unique_ptr<X509, X509Closer>> cert =
      ReadCertificate("tls_cert_file", options.cert_file);
  if (!cert.ok()) return cert.status();
  absl::StatusOr<std::unique_ptr<BIO, BioCloser>> key_bio = OpenPem("tls_key_file", options.key_file);
  if (!key_bio.ok()) return key_bio.status();
  std::unique_ptr<EVP_PKEY, KeyCloser> key(
      PEM_read_bio_PrivateKey(key_bio->get(), nullptr, nullptr, nullptr));
  if (key == nullptr) {
    return absl::InvalidArgumentError(absl::StrCat(
        "--tls_key_file=", options.key_file,
        ": holds no unencrypted PEM private key (\"-----BEGIN PRIVATE KEY-----\")"));
  }
  if (X509_check_private_key(cert->get(), key.get()) != 1) {
    return absl::InvalidArgumentError(absl::StrCat(
        "--tls_key_file=", options.key_file, " is not the key of the certificate in --tls_cert_file=",
        options.cert_file, "; give the pair that was issued together"));
  }
  if (!options.client_ca_file.empty()) {
    absl::StatusOr<std::unique_ptr<X509, X509Closer>> ca =
        ReadCertificate("tls_client_ca_file", options.client_ca_file);
    if (!ca.ok()) return ca.status();
  }
  const unsigned int interval = static_cast<unsigned int>(
      std::max<int64_t>(absl::ToInt64Seconds(options.reload_interval), 1));
  auto provider = std::make_shared<grpc::experimental::FileWatcherCertificateProvider>(
      options.key_file, options.cert_file, options.client_ca_file, interval);
  grpc::experimental::TlsServerCredentialsOptions tls(provider);
  tls.watch_identity_key_cert_pairs();
  if (options.client_ca_file.empty()) {
    tls.set_cert_request_type(GRPC_SSL_DONT_REQUEST_CLIENT_CERTIFICATE);
  } else {
    tls.watch_root_certs();
    tls.set_cert_request_type(GRPC_SSL_REQUEST_AND_REQUIRE_CLIENT_CERTIFICATE_AND_VERIFY);
  }
  std::shared_ptr<grpc::ServerCredentials> credentials =
      grpc::experimental::TlsServerCredentials(tls);
  if (credentials == nullptr) return absl::InternalError("gRPC refused the TLS credentials");
  return credentials;
}

}  // namespace mla

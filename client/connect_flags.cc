#include "client/connect_flags.h"

#include <cstdlib>
#include <fstream>
#include <sstream>
#include <string>

#include "absl/flags/flag.h"
#include "absl/strings/ascii.h"
#include "absl/strings/str_cat.h"

namespace mla::client {

// The type of --token: a string that --help never shows (Abseil prints a
// flag's "currently:" value, so a plain string flag would echo the token).
struct SecretFlag {
  std::string value;
};

bool AbslParseFlag(absl::string_view text, SecretFlag* flag, std::string*) {
  flag->value = std::string(text);
  return true;
}

std::string AbslUnparseFlag(const SecretFlag& flag) {
  return flag.value.empty() ? "" : "(given, not shown)";
}

}  // namespace mla::client

ABSL_FLAG(bool, tls, false, "Connect with TLS (default: plaintext).");
ABSL_FLAG(std::string, tls_ca, "",
          "With --tls: PEM file of the root certificates that sign the server's "
          "certificate (default: the system's roots).");
ABSL_FLAG(std::string, tls_cert, "",
          "With --tls: PEM certificate chain of this client (mutual TLS; the server may take "
          "the tenant from its common name).");
ABSL_FLAG(std::string, tls_key, "", "With --tls: PEM private key of --tls_cert.");
ABSL_FLAG(std::string, tls_server_name, "",
          "With --tls: the name the server's certificate must carry, when it is not the "
          "--target host.");
ABSL_FLAG(std::string, token_file, "",
          "File whose one line is the bearer token to send (authorization: Bearer TOKEN); the "
          "server's --auth_tokens_file names its tenant. Keep it readable by you alone.");
ABSL_FLAG(std::string, token_env, "MLA_OFFLOAD_TOKEN",
          "Without --token_file: the environment variable that holds the bearer token (unset "
          "or empty: none).");
ABSL_FLAG(mla::client::SecretFlag, token, {},
          "The bearer token itself. Other users of this host can read it in the process list: "
          "prefer --token_file or the variable of --token_env.");

namespace mla::client {
namespace {

absl::StatusOr<std::string> ReadFlagFile(const char* flag, const std::string& path) {
  std::ifstream file(path, std::ios::binary);
  if (!file) {
    return absl::InvalidArgumentError(absl::StrCat("--", flag, "=", path, ": cannot read it"));
  }
  std::ostringstream bytes;
  bytes << file.rdbuf();
  return bytes.str();
}

// The token of the flags, "" for none; errors never quote it.
absl::StatusOr<std::string> TokenFromFlags() {
  if (const std::string path = absl::GetFlag(FLAGS_token_file); !path.empty()) {
    absl::StatusOr<std::string> text = ReadFlagFile("token_file", path);
    if (!text.ok()) return text.status();
    const std::string token(absl::StripAsciiWhitespace(*text));
    if (token.empty()) {
      return absl::InvalidArgumentError(absl::StrCat("--token_file=", path, " is empty"));
    }
    return token;
  }
  if (const std::string name = absl::GetFlag(FLAGS_token_env); !name.empty()) {
    if (const char* value = std::getenv(name.c_str()); value != nullptr && *value != '\0') {
      return std::string(absl::StripAsciiWhitespace(value));
    }
  }
  return absl::GetFlag(FLAGS_token).value;
}

}  // namespace

absl::StatusOr<ConnectOptions> ConnectOptionsFromFlags(ConnectOptions options) {
  options.use_tls = absl::GetFlag(FLAGS_tls);
  options.tls_server_name = absl::GetFlag(FLAGS_tls_server_name);
  if (!options.tls_server_name.empty() && !options.use_tls) {
    return absl::InvalidArgumentError("--tls_server_name needs --tls");
  }
  struct PemFlag {
    const char* name;
    std::string path;
    std::string* into;
  };
  for (const PemFlag& pem :
       {PemFlag{"tls_ca", absl::GetFlag(FLAGS_tls_ca), &options.tls_root_certs_pem},
        PemFlag{"tls_cert", absl::GetFlag(FLAGS_tls_cert), &options.tls_client_cert_pem},
        PemFlag{"tls_key", absl::GetFlag(FLAGS_tls_key), &options.tls_client_key_pem}}) {
    if (pem.path.empty()) continue;
    if (!options.use_tls) {
      return absl::InvalidArgumentError(absl::StrCat("--", pem.name, " needs --tls"));
    }
    absl::StatusOr<std::string> bytes = ReadFlagFile(pem.name, pem.path);
    if (!bytes.ok()) return bytes.status();
    *pem.into = *std::move(bytes);
  }
  if (options.tls_client_cert_pem.empty() != options.tls_client_key_pem.empty()) {
    return absl::InvalidArgumentError("mutual TLS needs both --tls_cert and --tls_key");
  }
  absl::StatusOr<std::string> token = TokenFromFlags();
  if (!token.ok()) return token.status();
  options.bearer_token = *std::move(token);
  return options;
}

}  // namespace mla::client

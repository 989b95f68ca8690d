// Certificates and token files for the tests that run the real server with
// TLS and tokens: the certificates made by make_test_certs.sh (openssl) in
// the test's temporary directory, once per test process, and tokens files
// written as the server reads them (hashes only).
#ifndef MLA_OFFLOAD_TESTS_SUPPORT_TEST_CERTS_H_
#define MLA_OFFLOAD_TESTS_SUPPORT_TEST_CERTS_H_

#include <string>
#include <vector>

#include "absl/status/statusor.h"

namespace mla::testing {

// The directory holding make_test_certs.sh's files (ca.pem, server.pem,
// alpha.pem, expired.pem, wrong_ca.pem, ... with their .key), made on the
// first call; the script's output on failure.
absl::StatusOr<std::string> TestCertsDir();

// The file's text, "" when it cannot be read.
std::string ReadText(const std::string& path);

struct TestToken {
  std::string tenant;
  std::string token;
  bool is_operator = false;
};

// The hex SHA-256 of `token`, as the tokens file holds it.
std::string TokenHash(const std::string& token);
// Writes the tokens file of `tokens` to `path`, beside it first and then
// renamed over it (as a rotation in place does).
void WriteTokensFile(const std::string& path, const std::vector<TestToken>& tokens);
// Replaces `to` by a copy of `from`, written beside and renamed over.
void ReplaceFile(const std::string& from, const std::string& to);

}  // namespace mla::testing

#endif  // MLA_OFFLOAD_TESTS_SUPPORT_TEST_CERTS_H_

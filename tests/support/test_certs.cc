#include "tests/support/test_certs.h"

#include <openssl/sha.h>

#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <mutex>
#include <sstream>

#include "absl/strings/escaping.h"
#include "absl/strings/str_cat.h"
#include "client/test_processes.h"

namespace mla::testing {

absl::StatusOr<std::string> TestCertsDir() {
  static std::mutex mutex;
  static absl::StatusOr<std::string>* made = nullptr;
  std::lock_guard<std::mutex> lock(mutex);
  if (made != nullptr) return *made;
  const char* tmp = std::getenv("TEST_TMPDIR");
  const std::string dir = absl::StrCat(tmp != nullptr ? tmp : "/tmp", "/test_certs");
  absl::StatusOr<std::string> script = client::RunfilePath("tests/support/make_test_certs.sh");
  if (!script.ok()) {
    made = new absl::StatusOr<std::string>(script.status());
    return *made;
  }
  absl::StatusOr<client::CommandResult> result = client::RunCommand({"/bin/bash", *script, dir});
  if (!result.ok()) {
    made = new absl::StatusOr<std::string>(result.status());
  } else if (result->exit_code != 0) {
    made = new absl::StatusOr<std::string>(absl::InternalError(
        absl::StrCat("make_test_certs.sh failed: ", result->out, result->err)));
  } else {
    made = new absl::StatusOr<std::string>(dir);
  }
  return *made;
}

std::string ReadText(const std::string& path) {
  std::ifstream file(path, std::ios::binary);
  std::ostringstream text;
  text << file.rdbuf();
  return text.str();
}

std::string TokenHash(const std::string& token) {
  unsigned char digest[SHA256_DIGEST_LENGTH];
  SHA256(reinterpret_cast<const unsigned char*>(token.data()), token.size(), digest);
  return absl::BytesToHexString(absl::string_view(reinterpret_cast<const char*>(digest), sizeof(digest)));
}

namespace {

void WriteAndRename(const std::string& path, const std::string& text) {
  const std::string part = path + ".part";
  std::ofstream(part, std::ios::binary) << text;
  std::rename(part.c_str(), path.c_str());
}

}  // namespace

void WriteTokensFile(const std::string& path, const std::vector<TestToken>& tokens) {
  std::string text = "# TENANT SHA256_HEX_OF_TOKEN [operator]\n";
  for (const TestToken& token : tokens) {
    absl::StrAppend(&text, token.tenant, " ", TokenHash(token.token),
                    token.is_operator ? " operator" : "", "\n");
  }
  WriteAndRename(path, text);
}

void ReplaceFile(const std::string& from, const std::string& to) {
  WriteAndRename(to, ReadText(from));
}

}  // namespace mla::testing

#include "server/access/auth.h"

#include <atomic>
#include <cstdio>
#include <fstream>
#include <memory>
#include <string>
#include <thread>

#include "absl/strings/escaping.h"
#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace mla {
namespace {

using ::testing::HasSubstr;
using ::testing::Not;

std::string HexSha256(const std::string& token) {
  const Sha256Digest digest = Sha256(token);
  return absl::BytesToHexString(
      absl::string_view(reinterpret_cast<const char*>(digest.data()), digest.size()));
}

std::string TempPath(const std::string& name) {
  const char* dir = std::getenv("TEST_TMPDIR");
  return absl::StrCat(dir != nullptr ? dir : "/tmp", "/", name);
}

void WriteFile(const std::string& path, const std::string& text) {
  // Written beside, then renamed over: as cert-manager and kubelet's atomic
  // writer do, and so that a reload never sees half a file.
  const std::string part = path + ".part";
  std::ofstream(part) << text;
  ASSERT_EQ(std::rename(part.c_str(), path.c_str()), 0);
}

TEST(Sha256Test, KnownVector) {
  EXPECT_EQ(HexSha256("abc"), "ba7816bf8f01cfea414140de5dae2223b00361a396177a9cb410ff61f20015ad");
}

TEST(ParseTokensFileTest, LinesCommentsAndOperators) {
  const std::string text = absl::StrCat("# tenants of this server\n\n", "alpha ", HexSha256("a1"),
                                        "\n", "ops\t", HexSha256("o1"), " operator  # on call\n",
                                        "alpha ", HexSha256("a2"), "\r\n");
  absl::StatusOr<std::vector<TokenLine>> lines = ParseTokensFile(text);
  ASSERT_TRUE(lines.ok()) << lines.status();
  ASSERT_EQ(lines->size(), 3u);
  EXPECT_EQ((*lines)[0].tenant, "alpha");
  EXPECT_FALSE((*lines)[0].is_operator);
  EXPECT_EQ((*lines)[1].tenant, "ops");
  EXPECT_TRUE((*lines)[1].is_operator);
  EXPECT_EQ((*lines)[2].hash, Sha256("a2"));
}

TEST(ParseTokensFileTest, WrongLinesAreNamed) {
  const std::string hash = HexSha256("t");
  struct Case {
    std::string text, message;
  };
  for (const Case& c : std::vector<Case>{
           {"alpha\n", "line 1: give TENANT SHA256_HEX_OF_TOKEN"},
           {"# x\nalpha " + hash + " admin\n", "line 2: give TENANT SHA256_HEX_OF_TOKEN"},
           {"alpha secret-token\n", "line 1: the hash has 12 characters"},
           {"alpha " + std::string(64, 'g') + "\n", "line 1: the hash is not hexadecimal"},
           {"al/pha " + hash + "\n", "line 1: a tenant name is made of"},
           {"alpha " + hash + "\nbeta " + hash + "\n", "line 2: this hash is on an earlier line"},
       }) {
    absl::StatusOr<std::vector<TokenLine>> lines = ParseTokensFile(c.text);
    ASSERT_FALSE(lines.ok()) << c.text;
    EXPECT_EQ(lines.status().code(), absl::StatusCode::kInvalidArgument);
    EXPECT_THAT(lines.status().message(), HasSubstr(c.message));
  }
  // The token itself never appears in the error.
  EXPECT_THAT(ParseTokensFile("alpha secret-token\n").status().message(),
              Not(HasSubstr("secret-token")));
}

TEST(AuthenticatorTest, OffIsOneTenant) {
  absl::StatusOr<std::unique_ptr<Authenticator>> auth = Authenticator::Create({});
  ASSERT_TRUE(auth.ok());
  EXPECT_FALSE((*auth)->enabled());
  absl::StatusOr<Caller> caller = (*auth)->Authenticate(std::nullopt, std::nullopt);
  ASSERT_TRUE(caller.ok());
  EXPECT_EQ(caller->tenant, "");
}

TEST(AuthenticatorTest, TokensAndCertificates) {
  const std::string path = TempPath("tokens_and_certificates");
  WriteFile(path, absl::StrCat("alpha ", HexSha256("a-token"), "\nops ", HexSha256("o-token"),
                               " operator\n"));
  AuthOptions options;
  options.tokens_file = path;
  options.client_certificates = true;
  absl::StatusOr<std::unique_ptr<Authenticator>> auth = Authenticator::Create(options);
  ASSERT_TRUE(auth.ok()) << auth.status();
  const Authenticator& a = **auth;

  absl::StatusOr<Caller> caller = a.Authenticate("Bearer a-token", std::nullopt);
  ASSERT_TRUE(caller.ok()) << caller.status();
  EXPECT_EQ(caller->tenant, "alpha");
  EXPECT_FALSE(caller->is_operator);
  caller = a.Authenticate("Bearer o-token", "beta");
  ASSERT_TRUE(caller.ok());
  EXPECT_EQ(caller->tenant, "ops");
  EXPECT_TRUE(caller->is_operator);
  // The certificate's CN, when no token is sent; never an operator.
  caller = a.Authenticate(std::nullopt, "beta");
  ASSERT_TRUE(caller.ok());
  EXPECT_EQ(caller->tenant, "beta");
  EXPECT_FALSE(caller->is_operator);

  struct Refused {
    std::optional<absl::string_view> authorization, cn;
    std::string message;
  };
  for (const Refused& r : std::vector<Refused>{
           {std::nullopt, std::nullopt, "no token: send the metadata"},
           {"Bearer wrong-token", std::nullopt, "not one this server knows"},
           {"Bearer wrong-token", "beta", "not one this server knows"},  // a wrong token is not excused
           {"a-token", std::nullopt, "not \"Bearer TOKEN\""},
           {"Bearer ", std::nullopt, "no token after"},
           {std::nullopt, "be ta", "the client certificate's CN"},
       }) {
    caller = a.Authenticate(r.authorization, r.cn);
    ASSERT_FALSE(caller.ok()) << r.message;
    EXPECT_EQ(caller.status().code(), absl::StatusCode::kUnauthenticated);
    EXPECT_THAT(caller.status().message(), HasSubstr(r.message));
    EXPECT_THAT(caller.status().message(), Not(HasSubstr("wrong-token")));
  }
}

TEST(AuthenticatorTest, AMissingOrBadFileRefusesToStart) {
  AuthOptions options;
  options.tokens_file = TempPath("no_such_tokens");
  absl::StatusOr<std::unique_ptr<Authenticator>> auth = Authenticator::Create(options);
  EXPECT_EQ(auth.status().code(), absl::StatusCode::kNotFound);
  EXPECT_THAT(auth.status().message(), HasSubstr("--auth_tokens_file="));
  options.tokens_file = TempPath("bad_tokens");
  WriteFile(options.tokens_file, "alpha not-a-hash\n");
  auth = Authenticator::Create(options);
  EXPECT_EQ(auth.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(auth.status().message(), HasSubstr("line 1"));
}

TEST(AuthenticatorTest, RotatedFileReplacesTokensAndABadOneKeepsThem) {
  const std::string path = TempPath("rotated_tokens");
  WriteFile(path, absl::StrCat("alpha ", HexSha256("old-token"), "\n"));
  AuthOptions options;
  options.tokens_file = path;
  options.reload_interval = absl::Milliseconds(20);
  absl::StatusOr<std::unique_ptr<Authenticator>> auth = Authenticator::Create(options);
  ASSERT_TRUE(auth.ok()) << auth.status();
  Authenticator& a = **auth;
  ASSERT_TRUE(a.Authenticate("Bearer old-token", std::nullopt).ok());

  WriteFile(path, absl::StrCat("alpha ", HexSha256("new-token"), "\n"));
  // The reload thread picks it up within a few intervals.
  for (int i = 0; i < 200 && !a.Authenticate("Bearer new-token", std::nullopt).ok(); ++i) {
    absl::SleepFor(absl::Milliseconds(10));
  }
  EXPECT_TRUE(a.Authenticate("Bearer new-token", std::nullopt).ok());
  EXPECT_EQ(a.Authenticate("Bearer old-token", std::nullopt).status().code(),
            absl::StatusCode::kUnauthenticated);

  WriteFile(path, "alpha 1234\n");
  const absl::Status bad = a.ReloadNow();
  // The reload thread may have read it first; then ReloadNow saw no change.
  if (!bad.ok()) EXPECT_THAT(bad.message(), HasSubstr("keeping the tokens read before"));
  EXPECT_TRUE(a.Authenticate("Bearer new-token", std::nullopt).ok());
}

// Two reloads that overlap: the first has read a file that the second's
// newer one (which revokes old-token) replaced before the first installs
// it. Reloads run one at a time, read to install, so the newer file is the
// one that stays: the revoked token does not come back. (Before, the
// second reload installed the newer tokens and the first then installed
// the older ones over them.)
TEST(AuthenticatorTest, OverlappingReloadsInstallTheNewerFileLast) {
  const std::string path = TempPath("overlapping_tokens");
  WriteFile(path, absl::StrCat("beta ", HexSha256("beta-token"), "\n"));
  std::atomic<bool> first{true};
  std::thread second;
  std::atomic<bool> second_done{false};
  Authenticator* raw = nullptr;
  AuthOptions options;
  options.tokens_file = path;
  options.reload_interval = absl::Hours(1);
  options.after_read_for_test = [&] {
    if (!first.exchange(false)) return;
    // The first reload has read the older file; the newer one replaces it
    // and a second reload starts. It cannot finish while the first holds
    // the reload; give it the time it would need if it could.
    WriteFile(path, absl::StrCat("alpha ", HexSha256("new-token"), "\n"));
    second = std::thread([&] {
      raw->ReloadNow().IgnoreError();
      second_done.store(true);
    });
    for (int i = 0; i < 50 && !second_done.load(); ++i) absl::SleepFor(absl::Milliseconds(10));
  };
  absl::StatusOr<std::unique_ptr<Authenticator>> auth = Authenticator::Create(options);
  ASSERT_TRUE(auth.ok()) << auth.status();
  raw = auth->get();
  WriteFile(path, absl::StrCat("alpha ", HexSha256("old-token"), "\n"));
  EXPECT_TRUE(raw->ReloadNow().ok());
  ASSERT_TRUE(second.joinable());
  second.join();
  EXPECT_TRUE(raw->Authenticate("Bearer new-token", std::nullopt).ok());
  EXPECT_EQ(raw->Authenticate("Bearer old-token", std::nullopt).status().code(),
            absl::StatusCode::kUnauthenticated);
}

}  // namespace
}  // namespace mla

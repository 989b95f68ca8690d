#include "server/access/auth.h"

#include <openssl/crypto.h>
#include <openssl/sha.h>

#include <fstream>
#include <set>
#include <sstream>
#include <utility>

#include <grpc/grpc_security_constants.h>

#include "absl/strings/ascii.h"
#include "absl/strings/escaping.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "absl/strings/strip.h"
#include "server/process/log.h"

namespace mla {
namespace {

constexpr size_t kMaxTenantChars = 64;

absl::StatusOr<std::string> ReadWholeFile(const std::string& path) {
  std::ifstream file(path, std::ios::binary);
  if (!file) {
    return absl::NotFoundError(absl::StrCat("--auth_tokens_file=", path, ": cannot read it"));
  }
  std::ostringstream text;
  text << file.rdbuf();
  return text.str();
}

absl::StatusOr<Sha256Digest> ParseHash(absl::string_view hex) {
  Sha256Digest digest;
  if (hex.size() != 2 * digest.size()) {
    return absl::InvalidArgumentError(absl::StrCat(
        "the hash has ", hex.size(), " characters; give the 64 hex digits of the token's "
        "SHA-256 (printf %s \"$TOKEN\" | sha256sum), never the token itself"));
  }
  for (char c : hex) {
    if (!absl::ascii_isxdigit(static_cast<unsigned char>(c))) {
      return absl::InvalidArgumentError(
          "the hash is not hexadecimal; give the 64 hex digits of the token's SHA-256");
    }
  }
  const std::string bytes = absl::HexStringToBytes(hex);
  std::copy(bytes.begin(), bytes.end(), digest.begin());
  return digest;
}

// The token of an authorization header's value, "Bearer TOKEN".
absl::StatusOr<absl::string_view> BearerToken(absl::string_view authorization) {
  absl::string_view token = authorization;
  if (!absl::ConsumePrefix(&token, "Bearer ") && !absl::ConsumePrefix(&token, "bearer ")) {
    return absl::UnauthenticatedError(
        "the authorization metadata is not \"Bearer TOKEN\"; send the token that way");
  }
  token = absl::StripAsciiWhitespace(token);
  if (token.empty()) {
    return absl::UnauthenticatedError("the authorization metadata has no token after \"Bearer\"");
  }
  return token;
}

}  // namespace

Sha256Digest Sha256(absl::string_view bytes) {
  Sha256Digest digest;
  SHA256(reinterpret_cast<const unsigned char*>(bytes.data()), bytes.size(), digest.data());
  return digest;
}

absl::Status CheckTenantName(absl::string_view name, absl::string_view what) {
  if (name.empty() || name.size() > kMaxTenantChars) {
    return absl::InvalidArgumentError(absl::StrCat(
        what, ": a tenant name has 1 to ", kMaxTenantChars, " characters, this one ", name.size()));
  }
  for (char c : name) {
    if (!absl::ascii_isalnum(static_cast<unsigned char>(c)) && c != '.' && c != '-' && c != '_') {
      return absl::InvalidArgumentError(absl::StrCat(
          what, ": a tenant name is made of A-Z, a-z, 0-9, '.', '-' and '_'"));
    }
  }
  return absl::OkStatus();
}

absl::StatusOr<std::vector<TokenLine>> ParseTokensFile(absl::string_view text) {
  std::vector<TokenLine> lines;
  std::set<Sha256Digest> hashes;
  int number = 0;
  for (absl::string_view line : absl::StrSplit(text, '\n')) {
    ++number;
    const size_t comment = line.find('#');
    if (comment != absl::string_view::npos) line = line.substr(0, comment);
    const std::vector<absl::string_view> fields =
        absl::StrSplit(line, absl::ByAnyChar(" \t\r"), absl::SkipEmpty());
    if (fields.empty()) continue;
    const std::string where = absl::StrCat("line ", number);
    if (fields.size() < 2 || fields.size() > 3 || (fields.size() == 3 && fields[2] != "operator")) {
      return absl::InvalidArgumentError(absl::StrCat(
          where, ": give TENANT SHA256_HEX_OF_TOKEN, and `operator` after it for an operator (",
          fields.size(), " fields here)"));
    }
    TokenLine token;
    if (absl::Status status = CheckTenantName(fields[0], where); !status.ok()) return status;
    token.tenant = std::string(fields[0]);
    absl::StatusOr<Sha256Digest> hash = ParseHash(fields[1]);
    if (!hash.ok()) return absl::InvalidArgumentError(absl::StrCat(where, ": ", hash.status().message()));
    if (!hashes.insert(*hash).second) {
      return absl::InvalidArgumentError(absl::StrCat(
          where, ": this hash is on an earlier line too; a token names one tenant"));
    }
    token.hash = *hash;
    token.is_operator = fields.size() == 3;
    lines.push_back(std::move(token));
  }
  return lines;
}

absl::StatusOr<std::unique_ptr<Authenticator>> Authenticator::Create(const AuthOptions& options) {
  std::unique_ptr<Authenticator> auth(new Authenticator(options));
  auth->tokens_ = std::make_shared<const std::vector<TokenLine>>();
  if (options.tokens_file.empty()) return auth;
  absl::StatusOr<std::string> text = ReadWholeFile(options.tokens_file);
  if (!text.ok()) return text.status();
  absl::StatusOr<std::vector<TokenLine>> tokens = ParseTokensFile(*text);
  if (!tokens.ok()) {
    return absl::InvalidArgumentError(
        absl::StrCat("--auth_tokens_file=", options.tokens_file, ": ", tokens.status().message()));
  }
  auth->tokens_ = std::make_shared<const std::vector<TokenLine>>(*std::move(tokens));
  auth->last_text_ = *std::move(text);
  auth->reloader_ = std::thread([raw = auth.get()] { raw->ReloadLoop(); });
  return auth;
}

Authenticator::~Authenticator() {
  {
    std::lock_guard<std::mutex> lock(mutex_);
    stopping_ = true;
  }
  stop_changed_.notify_all();
  if (reloader_.joinable()) reloader_.join();
}

void Authenticator::ReloadLoop() {
  std::unique_lock<std::mutex> lock(mutex_);
  while (!stop_changed_.wait_for(lock, absl::ToChronoNanoseconds(options_.reload_interval),
                                 [this] { return stopping_; })) {
    lock.unlock();
    ReloadNow().IgnoreError();  // logged there
    lock.lock();
  }
}

absl::Status Authenticator::ReloadNow() {
  if (options_.tokens_file.empty()) return absl::OkStatus();
  // One reload at a time, from the read to the install: otherwise a reload
  // that read an older file could install it over a newer one (and bring
  // back a revoked token).
  std::lock_guard<std::mutex> reloading(reload_mutex_);
  absl::StatusOr<std::string> text = ReadWholeFile(options_.tokens_file);
  if (options_.after_read_for_test) options_.after_read_for_test();
  std::lock_guard<std::mutex> lock(mutex_);
  if (!text.ok()) {
    // Mid-rotation (a rename), or removed: the tokens stay as they were.
    if (!last_text_.empty()) {
      Log(LogLevel::kWarning, absl::StrCat(text.status().message(), "; keeping the tokens read before"));
      last_text_.clear();
    }
    return text.status();
  }
  if (*text == last_text_) return absl::OkStatus();
  last_text_ = *text;
  absl::StatusOr<std::vector<TokenLine>> tokens = ParseTokensFile(*text);
  if (!tokens.ok()) {
    const absl::Status status = absl::InvalidArgumentError(absl::StrCat(
        "--auth_tokens_file=", options_.tokens_file, " changed and does not parse: ",
        tokens.status().message(), "; keeping the tokens read before"));
    Log(LogLevel::kWarning, status.message());
    return status;
  }
  Log(LogLevel::kInfo, absl::StrCat("--auth_tokens_file=", options_.tokens_file, ": reloaded, ",
                                    tokens->size(), " token", tokens->size() == 1 ? "" : "s"));
  tokens_ = std::make_shared<const std::vector<TokenLine>>(*std::move(tokens));
  return absl::OkStatus();
}

absl::StatusOr<Caller> Authenticator::Authenticate(
    std::optional<absl::string_view> authorization,
    std::optional<absl::string_view> certificate_cn) const {
  if (!enabled()) return Caller{};
  if (authorization.has_value()) {
    if (options_.tokens_file.empty()) {
      return absl::UnauthenticatedError(
          "this server takes no tokens (it names tenants by client certificates); drop the "
          "authorization metadata");
    }
    absl::StatusOr<absl::string_view> token = BearerToken(*authorization);
    if (!token.ok()) return token.status();
    const Sha256Digest digest = Sha256(*token);
    std::shared_ptr<const std::vector<TokenLine>> tokens;
    {
      std::lock_guard<std::mutex> lock(mutex_);
      tokens = tokens_;
    }
    // Every line is compared, whichever matches: the time taken says
    // nothing of which hash (or how much of one) matched.
    const TokenLine* match = nullptr;
    for (const TokenLine& line : *tokens) {
      if (CRYPTO_memcmp(line.hash.data(), digest.data(), digest.size()) == 0) match = &line;
    }
    if (match == nullptr) {
      return absl::UnauthenticatedError(
          "the bearer token is not one this server knows (revoked, rotated, or mistyped); ask "
          "the operator for a current one");
    }
    return Caller{match->tenant, match->is_operator};
  }
  if (options_.client_certificates && certificate_cn.has_value()) {
    if (absl::Status status = CheckTenantName(*certificate_cn, "the client certificate's CN");
        !status.ok()) {
      return absl::UnauthenticatedError(status.message());
    }
    return Caller{std::string(*certificate_cn), false};
  }
  return absl::UnauthenticatedError(
      options_.tokens_file.empty()
          ? "this server names tenants by client certificates: connect with TLS and a client "
            "certificate its client CA signed"
          : "no token: send the metadata \"authorization: Bearer TOKEN\"");
}

absl::StatusOr<Caller> Authenticator::Authenticate(const grpc::ServerContextBase& context) const {
  if (!enabled()) return Caller{};
  std::optional<absl::string_view> authorization;
  const auto& metadata = context.client_metadata();
  if (const auto it = metadata.find("authorization"); it != metadata.end()) {
    authorization = absl::string_view(it->second.data(), it->second.size());
  }
  std::optional<std::string> cn;
  if (const std::shared_ptr<const grpc::AuthContext> auth = context.auth_context();
      auth != nullptr && auth->IsPeerAuthenticated()) {
    const std::vector<grpc::string_ref> names = auth->FindPropertyValues(GRPC_X509_CN_PROPERTY_NAME);
    if (names.size() == 1) cn = std::string(names[0].data(), names[0].size());
  }
  return Authenticate(authorization,
                      cn.has_value() ? std::optional<absl::string_view>(*cn) : std::nullopt);
}

}  // namespace mla

// ConnectOptions' TLS fields (and the tool's --tls flags) against an
// in-process gRPC server with TLS: what the client sends and checks, apart
// from the real server (tests/integration/auth_e2e_test runs that with TLS,
// mutual TLS and tokens). The certificates in testdata/ are self-signed test
// ones (an EC P-256 CA valid until 2126; the server's names are
// mla-offload.test and localhost, not 127.0.0.1, so connecting by address
// needs tls_server_name); other_ca.pem signs nothing here.
#include <fstream>
#include <memory>
#include <sstream>
#include <string>

#include <grpcpp/grpcpp.h>
#include <grpcpp/security/server_credentials.h>

#include "absl/strings/str_cat.h"
#include "client/mla_client.h"
#include "client/test_processes.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "proto/mla_offload.grpc.pb.h"

namespace mla::client {
namespace {

using ::testing::HasSubstr;

std::string TestData(const std::string& name) {
  absl::StatusOr<std::string> path = RunfilePath("client/testdata/" + name);
  EXPECT_TRUE(path.ok()) << path.status();
  std::ifstream file(*path);
  EXPECT_TRUE(file.good()) << *path;
  std::ostringstream bytes;
  bytes << file.rdbuf();
  return bytes.str();
}

class InfoOnlyService final : public pb::MlaOffload::Service {
  grpc::Status GetServerInfo(grpc::ServerContext*, const pb::GetServerInfoRequest*,
                             pb::ServerInfo* info) override {
    info->set_version("tls test server");
    return grpc::Status::OK;
  }
};

class TlsTest : public ::testing::Test {
 protected:
  void Serve(bool require_client_certificate) {
    grpc::SslServerCredentialsOptions ssl(
        require_client_certificate ? GRPC_SSL_REQUEST_AND_REQUIRE_CLIENT_CERTIFICATE_AND_VERIFY
                                   : GRPC_SSL_DONT_REQUEST_CLIENT_CERTIFICATE);
    ssl.pem_root_certs = TestData("ca.pem");
    ssl.pem_key_cert_pairs.push_back({TestData("server.key"), TestData("server.pem")});
    grpc::ServerBuilder builder;
    builder.AddListeningPort("127.0.0.1:0", grpc::SslServerCredentials(ssl), &port_);
    builder.RegisterService(&service_);
    server_ = builder.BuildAndStart();
    ASSERT_NE(server_, nullptr);
    ASSERT_GT(port_, 0);
  }

  void TearDown() override {
    if (server_ != nullptr) server_->Shutdown();
  }

  std::string target() const { return absl::StrCat("127.0.0.1:", port_); }

  ConnectOptions Tls() const {
    ConnectOptions options;
    options.use_tls = true;
    options.tls_root_certs_pem = TestData("ca.pem");
    options.tls_server_name = "mla-offload.test";
    options.call_timeout = absl::Seconds(10);
    return options;
  }

  absl::Status Info(const ConnectOptions& options) {
    absl::StatusOr<std::unique_ptr<Client>> client = Client::Connect(target(), options);
    if (!client.ok()) return client.status();
    absl::StatusOr<pb::ServerInfo> info = (*client)->GetServerInfo();
    if (!info.ok()) return info.status();
    EXPECT_EQ(info->version(), "tls test server");
    return absl::OkStatus();
  }

  InfoOnlyService service_;
  std::unique_ptr<grpc::Server> server_;
  int port_ = 0;
};

TEST_F(TlsTest, ServerTlsConnectsWithTheRightRootsAndName) {
  ASSERT_NO_FATAL_FAILURE(Serve(/*require_client_certificate=*/false));
  EXPECT_TRUE(Info(Tls()).ok()) << Info(Tls());

  ConnectOptions no_name = Tls();
  no_name.tls_server_name.clear();  // 127.0.0.1 is not among the certificate's names
  EXPECT_EQ(Info(no_name).code(), absl::StatusCode::kUnavailable);

  ConnectOptions wrong_roots = Tls();
  wrong_roots.tls_root_certs_pem = TestData("other_ca.pem");
  const absl::Status untrusted = Info(wrong_roots);
  EXPECT_EQ(untrusted.code(), absl::StatusCode::kUnavailable) << untrusted;
  EXPECT_THAT(untrusted.message(), HasSubstr("GetServerInfo on " + target()));

  ConnectOptions plaintext;
  plaintext.call_timeout = absl::Seconds(10);
  EXPECT_EQ(Info(plaintext).code(), absl::StatusCode::kUnavailable);
}

TEST_F(TlsTest, MutualTlsNeedsTheClientCertificate) {
  ASSERT_NO_FATAL_FAILURE(Serve(/*require_client_certificate=*/true));
  EXPECT_EQ(Info(Tls()).code(), absl::StatusCode::kUnavailable)
      << "the server requires a client certificate";
  ConnectOptions mutual = Tls();
  mutual.tls_client_cert_pem = TestData("client.pem");
  mutual.tls_client_key_pem = TestData("client.key");
  const absl::Status status = Info(mutual);
  EXPECT_TRUE(status.ok()) << status;
}

TEST_F(TlsTest, ToolTlsFlags) {
  ASSERT_NO_FATAL_FAILURE(Serve(/*require_client_certificate=*/true));
  absl::StatusOr<std::string> mla = RunfilePath("client/mla");
  ASSERT_TRUE(mla.ok());
  auto path = [](const std::string& name) { return *RunfilePath("client/testdata/" + name); };
  absl::StatusOr<CommandResult> result =
      RunCommand({*mla, "--target=" + target(), "--tls", "--tls_ca=" + path("ca.pem"),
                  "--tls_cert=" + path("client.pem"), "--tls_key=" + path("client.key"),
                  "--tls_server_name=mla-offload.test", "info"});
  ASSERT_TRUE(result.ok()) << result.status();
  EXPECT_EQ(result->exit_code, 0) << result->err;
  EXPECT_THAT(result->out, HasSubstr("server      tls test server at " + target()));

  result = RunCommand({*mla, "--target=" + target(), "--tls", "--tls_ca=" + path("ca.pem"),
                       "--tls_cert=" + path("client.pem"), "info"});
  ASSERT_TRUE(result.ok());
  EXPECT_EQ(result->exit_code, 2);
  EXPECT_THAT(result->err, HasSubstr("mutual TLS needs both --tls_cert and --tls_key"));

  result = RunCommand({*mla, "--target=" + target(), "--tls", "--tls_ca=/no/such/ca.pem", "info"});
  ASSERT_TRUE(result.ok());
  EXPECT_EQ(result->exit_code, 2);
  EXPECT_THAT(result->err, HasSubstr("--tls_ca=/no/such/ca.pem: cannot read it"));
}

}  // namespace
}  // namespace mla::client

#include "server/metrics/http_exporter.h"

#include <arpa/inet.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <sys/time.h>
#include <unistd.h>

#include <cstdio>

#include <string>
#include <vector>

#include "absl/strings/ascii.h"
#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "absl/time/clock.h"
#include "absl/time/time.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "server/metrics/registry.h"

namespace mla::metrics {
namespace {

using ::testing::HasSubstr;

struct HttpResponse {
  int status = 0;
  std::string content_type;
  std::string www_authenticate;
  std::string body;
};

// A minimal HTTP/1.1 client over a loopback TCP socket (IPv4, or IPv6 when
// `ipv6`): one request with Connection: close and `headers` ("Name: value\r\n"
// lines), the response read until the server closes.
absl::StatusOr<HttpResponse> Fetch(int port, absl::string_view method, absl::string_view path,
                                   absl::string_view headers = "", bool ipv6 = false) {
  const int fd = socket(ipv6 ? AF_INET6 : AF_INET, SOCK_STREAM, 0);
  if (fd < 0) return absl::InternalError("socket failed");
  timeval timeout{/*tv_sec=*/5, /*tv_usec=*/0};
  setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &timeout, sizeof(timeout));
  sockaddr_storage storage{};
  socklen_t length;
  if (ipv6) {
    auto* address = reinterpret_cast<sockaddr_in6*>(&storage);
    address->sin6_family = AF_INET6;
    address->sin6_port = htons(port);
    address->sin6_addr = in6addr_loopback;
    length = sizeof(sockaddr_in6);
  } else {
    auto* address = reinterpret_cast<sockaddr_in*>(&storage);
    address->sin_family = AF_INET;
    address->sin_port = htons(port);
    address->sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    length = sizeof(sockaddr_in);
  }
  if (connect(fd, reinterpret_cast<sockaddr*>(&storage), length) != 0) {
    close(fd);
    return absl::UnavailableError(absl::StrCat("connect to port ", port));
  }
  const std::string request = absl::StrCat(method, " ", path,
                                           " HTTP/1.1\r\nHost: localhost\r\nConnection: close\r\n",
                                           headers, "\r\n");
  send(fd, request.data(), request.size(), MSG_NOSIGNAL);
  std::string raw;
  char buffer[4096];
  ssize_t n;
  while ((n = recv(fd, buffer, sizeof(buffer), 0)) > 0) raw.append(buffer, n);
  close(fd);

  const size_t header_end = raw.find("\r\n\r\n");
  if (header_end == std::string::npos) {
    return absl::DataLossError(absl::StrCat("no complete header in: ", raw));
  }
  HttpResponse response;
  response.body = raw.substr(header_end + 4);
  std::vector<std::string> lines =
      absl::StrSplit(raw.substr(0, header_end), "\r\n");
  // "HTTP/1.1 200 OK"
  const std::vector<std::string> status_line = absl::StrSplit(lines[0], ' ');
  if (status_line.size() < 2 ||
      !absl::SimpleAtoi(status_line[1], &response.status)) {
    return absl::DataLossError(absl::StrCat("bad status line: ", lines[0]));
  }
  for (const std::string& line : lines) {
    const std::vector<std::string> field =
        absl::StrSplit(line, absl::MaxSplits(':', 1));
    if (field.size() != 2) continue;
    const std::string value(absl::StripAsciiWhitespace(field[1]));
    if (absl::EqualsIgnoreCase(field[0], "content-type")) response.content_type = value;
    if (absl::EqualsIgnoreCase(field[0], "www-authenticate")) response.www_authenticate = value;
  }
  return response;
}

// A connection to 127.0.0.1:port that has sent `bytes` and then stalls.
int Stall(int port, absl::string_view bytes) {
  const int fd = socket(AF_INET, SOCK_STREAM, 0);
  sockaddr_in address{};
  address.sin_family = AF_INET;
  address.sin_port = htons(port);
  address.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  if (fd < 0 || connect(fd, reinterpret_cast<sockaddr*>(&address), sizeof(address)) != 0) {
    if (fd >= 0) close(fd);
    return -1;
  }
  send(fd, bytes.data(), bytes.size(), MSG_NOSIGNAL);
  return fd;
}

// Whether this machine can listen on and reach ::1 (containers may lack it).
bool HasIpv6Loopback() {
  const int fd = socket(AF_INET6, SOCK_STREAM, 0);
  if (fd < 0) return false;
  sockaddr_in6 address{};
  address.sin6_family = AF_INET6;
  address.sin6_addr = in6addr_loopback;
  const bool ok = bind(fd, reinterpret_cast<sockaddr*>(&address), sizeof(address)) == 0;
  close(fd);
  return ok;
}

// Runs a shell command; its standard output, or why it failed.
absl::StatusOr<std::string> Shell(const std::string& command) {
  FILE* pipe = popen(command.c_str(), "r");
  if (pipe == nullptr) return absl::InternalError(absl::StrCat("popen: ", command));
  std::string out;
  char buffer[4096];
  size_t n;
  while ((n = fread(buffer, 1, sizeof(buffer), pipe)) > 0) out.append(buffer, n);
  const int status = pclose(pipe);
  if (status != 0) {
    return absl::InternalError(absl::StrCat("`", command, "` exited with ", status, ": ", out));
  }
  return out;
}

HttpExporterOptions Listen(absl::string_view listen) {
  HttpExporterOptions options;
  options.listen = std::string(listen);
  return options;
}

class HttpExporterTest : public ::testing::Test {
 protected:
  void SetUp() override {
    (*(*registry_.AddCounter("requests_total", "Requests."))->WithLabels({}))
        ->Increment(3);
  }

  Registry registry_;
};

TEST_F(HttpExporterTest, ServesMetricsAndNotFound) {
  HttpExporter exporter(&registry_);
  ASSERT_TRUE(exporter.Start(Listen("127.0.0.1:0")).ok());
  ASSERT_GT(exporter.port(), 0);

  absl::StatusOr<HttpResponse> metrics =
      Fetch(exporter.port(), "GET", "/metrics");
  ASSERT_TRUE(metrics.ok()) << metrics.status();
  EXPECT_EQ(metrics->status, 200);
  EXPECT_EQ(metrics->content_type, "text/plain; version=0.0.4; charset=utf-8");
  EXPECT_EQ(metrics->body, registry_.RenderText());
  EXPECT_THAT(metrics->body, HasSubstr("requests_total 3\n"));

  for (const char* path : {"/", "/other", "/metrics/x", "/metricsx"}) {
    absl::StatusOr<HttpResponse> other = Fetch(exporter.port(), "GET", path);
    ASSERT_TRUE(other.ok()) << other.status();
    EXPECT_EQ(other->status, 404) << path;
  }
  absl::StatusOr<HttpResponse> post =
      Fetch(exporter.port(), "POST", "/metrics");
  ASSERT_TRUE(post.ok()) << post.status();
  EXPECT_EQ(post->status, 405);
}

TEST_F(HttpExporterTest, EachScrapeSeesCurrentValues) {
  HttpExporter exporter(&registry_);
  ASSERT_TRUE(exporter.Start(Listen("127.0.0.1:0")).ok());
  (*(*registry_.AddCounter("requests_total", "Requests."))->WithLabels({}))
      ->Increment();
  absl::StatusOr<HttpResponse> metrics =
      Fetch(exporter.port(), "GET", "/metrics");
  ASSERT_TRUE(metrics.ok()) << metrics.status();
  EXPECT_THAT(metrics->body, HasSubstr("requests_total 4\n"));
}

TEST_F(HttpExporterTest, StopFreesThePortAndIsIdempotent) {
  HttpExporter exporter(&registry_);
  ASSERT_TRUE(exporter.Start(Listen("127.0.0.1:0")).ok());
  const int port = exporter.port();
  ASSERT_TRUE(Fetch(port, "GET", "/metrics").ok());
  const absl::Time before_stop = absl::Now();
  exporter.Stop();
  EXPECT_LT(absl::Now() - before_stop, absl::Seconds(1));
  EXPECT_EQ(exporter.port(), 0);
  EXPECT_FALSE(Fetch(port, "GET", "/metrics").ok());
  exporter.Stop();

  // Another exporter can listen on the same port at once.
  HttpExporter second(&registry_);
  ASSERT_TRUE(second.Start(Listen(absl::StrCat("127.0.0.1:", port))).ok());
  EXPECT_EQ(second.port(), port);
  absl::StatusOr<HttpResponse> metrics = Fetch(port, "GET", "/metrics");
  ASSERT_TRUE(metrics.ok()) << metrics.status();
  EXPECT_EQ(metrics->status, 200);
}

TEST_F(HttpExporterTest, TakenPortIsUnavailableNamingTheAddress) {
  HttpExporter first(&registry_);
  ASSERT_TRUE(first.Start(Listen("127.0.0.1:0")).ok());
  HttpExporter second(&registry_);
  const absl::Status status = second.Start(Listen(absl::StrCat("127.0.0.1:", first.port())));
  EXPECT_EQ(status.code(), absl::StatusCode::kUnavailable);
  EXPECT_THAT(status.message(),
              HasSubstr(absl::StrCat("127.0.0.1:", first.port())));
  EXPECT_THAT(status.message(), HasSubstr("Address already in use"));
  EXPECT_EQ(second.port(), 0);
}

TEST_F(HttpExporterTest, BadAddressOrSecondStartFails) {
  HttpExporter exporter(&registry_);
  for (const char* listen : {"127.0.0.1:70000", "localhost:0", "127.0.0.1", "::1:0", "[::1:0",
                             "[127.0.0.1]:0", "127.0.0.1:x"}) {
    const absl::Status status = exporter.Start(Listen(listen));
    EXPECT_EQ(status.code(), absl::StatusCode::kInvalidArgument) << listen;
    EXPECT_THAT(status.message(), HasSubstr("give HOST:PORT")) << listen;
  }
  HttpExporterOptions half_tls = Listen("127.0.0.1:0");
  half_tls.tls_cert_file = "/nonexistent/cert.pem";
  EXPECT_EQ(exporter.Start(half_tls).code(), absl::StatusCode::kInvalidArgument);
  HttpExporterOptions missing_tls = half_tls;
  missing_tls.tls_key_file = "/nonexistent/key.pem";
  const absl::Status missing = exporter.Start(missing_tls);
  EXPECT_EQ(missing.code(), absl::StatusCode::kNotFound);
  EXPECT_THAT(missing.message(), HasSubstr("/nonexistent/cert.pem"));
  HttpExporterOptions no_threads = Listen("127.0.0.1:0");
  no_threads.threads = 0;
  EXPECT_EQ(exporter.Start(no_threads).code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(exporter.port(), 0);
  ASSERT_TRUE(exporter.Start(Listen("127.0.0.1:0")).ok());
  EXPECT_EQ(exporter.Start(Listen("127.0.0.1:0")).code(), absl::StatusCode::kFailedPrecondition);
}

// Scrapers that send half a request and stall (more of them than threads)
// hold connections, not threads: another scrape is answered at once, long
// before the stalled ones time out.
TEST_F(HttpExporterTest, SlowScrapersDoNotBlockAnotherScrape) {
  HttpExporterOptions options = Listen("127.0.0.1:0");
  options.threads = 2;
  options.idle_timeout = absl::Seconds(60);
  HttpExporter exporter(&registry_);
  ASSERT_TRUE(exporter.Start(options).ok());
  std::vector<int> stalled;
  for (int i = 0; i < 8; ++i) {
    const int fd = Stall(exporter.port(), i % 2 == 0 ? "GET /metr" : "GET /metrics HTTP/1.1\r\nHo");
    ASSERT_GE(fd, 0);
    stalled.push_back(fd);
  }
  for (int round = 0; round < 3; ++round) {
    const absl::Time start = absl::Now();
    absl::StatusOr<HttpResponse> metrics = Fetch(exporter.port(), "GET", "/metrics");
    const absl::Duration took = absl::Now() - start;
    ASSERT_TRUE(metrics.ok()) << metrics.status();
    EXPECT_EQ(metrics->status, 200);
    // Far below the stalled clients' 60 s: they hold up nothing.
    EXPECT_LT(took, absl::Seconds(5)) << "a scrape beside 8 stalled clients";
  }
  for (int fd : stalled) close(fd);
}

// A connection that stalls is closed after the idle timeout, so that it
// gives its slot back.
TEST_F(HttpExporterTest, StalledConnectionIsClosedAfterTheIdleTimeout) {
  HttpExporterOptions options = Listen("127.0.0.1:0");
  options.idle_timeout = absl::Seconds(1);
  HttpExporter exporter(&registry_);
  ASSERT_TRUE(exporter.Start(options).ok());
  const int fd = Stall(exporter.port(), "GET /metr");
  ASSERT_GE(fd, 0);
  timeval timeout{/*tv_sec=*/10, /*tv_usec=*/0};
  setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &timeout, sizeof(timeout));
  const absl::Time start = absl::Now();
  char byte;
  EXPECT_LE(recv(fd, &byte, 1, 0), 0) << "the server closes the connection";
  EXPECT_LT(absl::Now() - start, absl::Seconds(5));
  close(fd);
}

// Past the limit per address, a new connection is closed without an answer;
// one that went frees its slot.
TEST_F(HttpExporterTest, ConnectionsPerAddressAreLimited) {
  HttpExporterOptions options = Listen("127.0.0.1:0");
  options.max_connections_per_ip = 2;
  options.idle_timeout = absl::Seconds(60);
  HttpExporter exporter(&registry_);
  ASSERT_TRUE(exporter.Start(options).ok());
  const int first = Stall(exporter.port(), "GET /metr");
  const int second = Stall(exporter.port(), "GET /metr");
  ASSERT_GE(first, 0);
  ASSERT_GE(second, 0);
  EXPECT_FALSE(Fetch(exporter.port(), "GET", "/metrics").ok()) << "a third connection";
  close(first);
  absl::StatusOr<HttpResponse> metrics;
  // The server sees the close on its next poll: up to 10 s on a busy machine.
  for (int attempt = 0; attempt < 500; ++attempt) {
    metrics = Fetch(exporter.port(), "GET", "/metrics");
    if (metrics.ok()) break;
    absl::SleepFor(absl::Milliseconds(20));
  }
  ASSERT_TRUE(metrics.ok()) << metrics.status();
  EXPECT_EQ(metrics->status, 200);
  close(second);
}

TEST_F(HttpExporterTest, ServesOnIpv6Loopback) {
  if (!HasIpv6Loopback()) GTEST_SKIP() << "this machine has no IPv6 loopback";
  HttpExporter exporter(&registry_);
  const absl::Status started = exporter.Start(Listen("[::1]:0"));
  ASSERT_TRUE(started.ok()) << started;
  absl::StatusOr<HttpResponse> metrics =
      Fetch(exporter.port(), "GET", "/metrics", "", /*ipv6=*/true);
  ASSERT_TRUE(metrics.ok()) << metrics.status();
  EXPECT_EQ(metrics->status, 200);
  EXPECT_THAT(metrics->body, HasSubstr("requests_total 3\n"));
  // ::1 only: not on IPv4.
  EXPECT_FALSE(Fetch(exporter.port(), "GET", "/metrics").ok());
}

// [::] serves IPv6 and IPv4 clients.
TEST_F(HttpExporterTest, EveryInterfaceServesBothFamilies) {
  if (!HasIpv6Loopback()) GTEST_SKIP() << "this machine has no IPv6 loopback";
  HttpExporter exporter(&registry_);
  ASSERT_TRUE(exporter.Start(Listen("[::]:0")).ok());
  for (bool ipv6 : {true, false}) {
    absl::StatusOr<HttpResponse> metrics = Fetch(exporter.port(), "GET", "/metrics", "", ipv6);
    ASSERT_TRUE(metrics.ok()) << metrics.status() << (ipv6 ? " over IPv6" : " over IPv4");
    EXPECT_EQ(metrics->status, 200);
  }
}

TEST_F(HttpExporterTest, BasicAuthRefusesAWrongPasswordAndTakesTheRightOne) {
  HttpExporterOptions options = Listen("127.0.0.1:0");
  options.basic_auth_user = "prometheus";
  options.basic_auth_password = "s3cret";
  HttpExporter exporter(&registry_);
  ASSERT_TRUE(exporter.Start(options).ok());
  // "prometheus:s3cret", "prometheus:wrong", "other:s3cret", "prometheus:s3cre"
  const struct {
    const char* header;
    int status;
  } cases[] = {
      {"", 401},
      {"Authorization: Basic cHJvbWV0aGV1czp3cm9uZw==\r\n", 401},
      {"Authorization: Basic b3RoZXI6czNjcmV0\r\n", 401},
      {"Authorization: Basic cHJvbWV0aGV1czpzM2NyZQ==\r\n", 401},
      {"Authorization: Basic cHJvbWV0aGV1czpzM2NyZXQ=\r\n", 200},
  };
  for (const auto& c : cases) {
    absl::StatusOr<HttpResponse> response = Fetch(exporter.port(), "GET", "/metrics", c.header);
    ASSERT_TRUE(response.ok()) << response.status();
    EXPECT_EQ(response->status, c.status) << c.header;
    if (c.status == 401) {
      EXPECT_THAT(response->www_authenticate, HasSubstr("Basic")) << c.header;
      EXPECT_THAT(response->body, ::testing::Not(HasSubstr("requests_total"))) << c.header;
    } else {
      EXPECT_THAT(response->body, HasSubstr("requests_total 3\n"));
    }
  }
}

TEST(BasicAuthFileTest, ReadsOneLineAndRefusesOthers) {
  const std::string dir = ::testing::TempDir();
  const auto write = [&dir](const std::string& name, const std::string& text) {
    const std::string path = dir + "/" + name;
    FILE* file = std::fopen(path.c_str(), "w");
    std::fputs(text.c_str(), file);
    std::fclose(file);
    return path;
  };
  absl::StatusOr<BasicAuthCredentials> good = ReadBasicAuthFile(write("good", "scraper:pa:ss\n"));
  ASSERT_TRUE(good.ok()) << good.status();
  EXPECT_EQ(good->user, "scraper");
  EXPECT_EQ(good->password, "pa:ss");
  for (const char* bad : {"scraper\n", ":pass\n", "scraper:\n", "a:b\nc:d\n"}) {
    const absl::StatusOr<BasicAuthCredentials> read = ReadBasicAuthFile(write("bad", bad));
    EXPECT_EQ(read.status().code(), absl::StatusCode::kInvalidArgument) << bad;
    EXPECT_THAT(read.status().message(), HasSubstr("USER:PASSWORD"));
  }
  EXPECT_EQ(ReadBasicAuthFile(dir + "/none").status().code(), absl::StatusCode::kNotFound);
}

// HTTPS with a certificate made here: curl checks it against itself as the
// CA and scrapes; plain HTTP on that port gets no metrics.
TEST_F(HttpExporterTest, ServesOverTls) {
  const std::string dir = ::testing::TempDir();
  const std::string cert = dir + "/metrics_cert.pem", key = dir + "/metrics_key.pem";
  absl::StatusOr<std::string> made = Shell(absl::StrCat(
      "openssl req -x509 -newkey rsa:2048 -nodes -days 1 -subj /CN=127.0.0.1 "
      "-addext subjectAltName=IP:127.0.0.1 -keyout ", key, " -out ", cert, " 2>&1"));
  ASSERT_TRUE(made.ok()) << made.status();
  HttpExporterOptions options = Listen("127.0.0.1:0");
  options.tls_cert_file = cert;
  options.tls_key_file = key;
  options.basic_auth_user = "prometheus";
  options.basic_auth_password = "s3cret";
  HttpExporter exporter(&registry_);
  const absl::Status started = exporter.Start(options);
  ASSERT_TRUE(started.ok()) << started;
  const std::string url = absl::StrCat("https://127.0.0.1:", exporter.port(), "/metrics");
  absl::StatusOr<std::string> body = Shell(absl::StrCat(
      "curl --silent --show-error --fail --max-time 10 --cacert ", cert,
      " --user prometheus:s3cret ", url, " 2>&1"));
  ASSERT_TRUE(body.ok()) << body.status();
  EXPECT_EQ(*body, registry_.RenderText());
  absl::StatusOr<std::string> wrong = Shell(absl::StrCat(
      "curl --silent --output /dev/null --write-out %{http_code} --max-time 10 --cacert ", cert,
      " --user prometheus:wrong ", url));
  ASSERT_TRUE(wrong.ok()) << wrong.status();
  EXPECT_EQ(*wrong, "401");
  absl::StatusOr<HttpResponse> plain = Fetch(exporter.port(), "GET", "/metrics");
  EXPECT_TRUE(!plain.ok() || plain->status != 200);
  if (plain.ok()) {
    EXPECT_THAT(plain->body, ::testing::Not(HasSubstr("requests_total")));
  }
}

}  // namespace
}  // namespace mla::metrics

#include "server/metrics/http_exporter.h"

#include <arpa/inet.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <sys/time.h>
#include <unistd.h>

#include <string>

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
  std::string body;
};

// A minimal HTTP/1.1 client over a loopback TCP socket: one request with
// Connection: close, the response read until the server closes.
absl::StatusOr<HttpResponse> Fetch(int port, absl::string_view method,
                                   absl::string_view path) {
  const int fd = socket(AF_INET, SOCK_STREAM, 0);
  if (fd < 0) return absl::InternalError("socket failed");
  timeval timeout{/*tv_sec=*/5, /*tv_usec=*/0};
  setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &timeout, sizeof(timeout));
  sockaddr_in address{};
  address.sin_family = AF_INET;
  address.sin_port = htons(port);
  address.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  if (connect(fd, reinterpret_cast<sockaddr*>(&address), sizeof(address)) !=
      0) {
    close(fd);
    return absl::UnavailableError(absl::StrCat("connect to port ", port));
  }
  const std::string request =
      absl::StrCat(method, " ", path,
                   " HTTP/1.1\r\nHost: 127.0.0.1\r\nConnection: close\r\n\r\n");
  send(fd, request.data(), request.size(), 0);
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
    if (field.size() == 2 && absl::EqualsIgnoreCase(field[0], "content-type")) {
      response.content_type = std::string(absl::StripAsciiWhitespace(field[1]));
    }
  }
  return response;
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
  ASSERT_TRUE(exporter.Start("127.0.0.1", 0).ok());
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
  ASSERT_TRUE(exporter.Start("127.0.0.1", 0).ok());
  (*(*registry_.AddCounter("requests_total", "Requests."))->WithLabels({}))
      ->Increment();
  absl::StatusOr<HttpResponse> metrics =
      Fetch(exporter.port(), "GET", "/metrics");
  ASSERT_TRUE(metrics.ok()) << metrics.status();
  EXPECT_THAT(metrics->body, HasSubstr("requests_total 4\n"));
}

TEST_F(HttpExporterTest, StopFreesThePortAndIsIdempotent) {
  HttpExporter exporter(&registry_);
  ASSERT_TRUE(exporter.Start("127.0.0.1", 0).ok());
  const int port = exporter.port();
  ASSERT_TRUE(Fetch(port, "GET", "/metrics").ok());
  const absl::Time before_stop = absl::Now();
  exporter.Stop();
  // civetweb alone would take up to 2 s (see Stop).
  EXPECT_LT(absl::Now() - before_stop, absl::Seconds(1));
  EXPECT_EQ(exporter.port(), 0);
  EXPECT_FALSE(Fetch(port, "GET", "/metrics").ok());
  exporter.Stop();

  // Another exporter can listen on the same port at once.
  HttpExporter second(&registry_);
  ASSERT_TRUE(second.Start("127.0.0.1", port).ok());
  EXPECT_EQ(second.port(), port);
  absl::StatusOr<HttpResponse> metrics = Fetch(port, "GET", "/metrics");
  ASSERT_TRUE(metrics.ok()) << metrics.status();
  EXPECT_EQ(metrics->status, 200);
}

TEST_F(HttpExporterTest, TakenPortIsUnavailableNamingTheAddress) {
  HttpExporter first(&registry_);
  ASSERT_TRUE(first.Start("127.0.0.1", 0).ok());
  HttpExporter second(&registry_);
  const absl::Status status = second.Start("127.0.0.1", first.port());
  EXPECT_EQ(status.code(), absl::StatusCode::kUnavailable);
  EXPECT_THAT(status.message(),
              HasSubstr(absl::StrCat("127.0.0.1:", first.port())));
  EXPECT_EQ(second.port(), 0);
}

TEST_F(HttpExporterTest, BadAddressOrSecondStartFails) {
  HttpExporter exporter(&registry_);
  EXPECT_EQ(exporter.Start("127.0.0.1", 70000).code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(exporter.Start("localhost", 0).code(),
            absl::StatusCode::kInvalidArgument);
  ASSERT_TRUE(exporter.Start("127.0.0.1", 0).ok());
  EXPECT_EQ(exporter.Start("127.0.0.1", 0).code(),
            absl::StatusCode::kFailedPrecondition);
}

}  // namespace
}  // namespace mla::metrics

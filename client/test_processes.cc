#include "client/test_processes.h"

#include <fcntl.h>
#include <poll.h>
#include <signal.h>
#include <spawn.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cerrno>
#include <chrono>
#include <cstdlib>
#include <cstring>
#include <regex>

#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"

extern char** environ;

namespace mla::client {
namespace {

// posix_spawn of `args` with stdout (and stderr, when err_fd >= 0) redirected.
absl::StatusOr<pid_t> Spawn(const std::vector<std::string>& args, int out_fd, int err_fd) {
  std::vector<std::string> copy = args;
  std::vector<char*> argv;
  for (std::string& arg : copy) argv.push_back(arg.data());
  argv.push_back(nullptr);
  posix_spawn_file_actions_t actions;
  posix_spawn_file_actions_init(&actions);
  posix_spawn_file_actions_adddup2(&actions, out_fd, STDOUT_FILENO);
  if (err_fd >= 0) posix_spawn_file_actions_adddup2(&actions, err_fd, STDERR_FILENO);
  pid_t pid = 0;
  const int rc = posix_spawn(&pid, copy[0].c_str(), &actions, nullptr, argv.data(), environ);
  posix_spawn_file_actions_destroy(&actions);
  if (rc != 0) return absl::InternalError(absl::StrCat("posix_spawn ", copy[0], ": ", strerror(rc)));
  return pid;
}

}  // namespace

absl::StatusOr<std::string> RunfilePath(absl::string_view path) {
  const char* srcdir = std::getenv("TEST_SRCDIR");
  const char* workspace = std::getenv("TEST_WORKSPACE");
  if (srcdir == nullptr || workspace == nullptr) {
    return absl::FailedPreconditionError("TEST_SRCDIR/TEST_WORKSPACE unset: run under bazel test");
  }
  return absl::StrCat(srcdir, "/", workspace, "/", path);
}

absl::StatusOr<std::string> ServerBinary() {
  if (const char* override_binary = std::getenv("MLA_OFFLOAD_SERVER")) return override_binary;
  return RunfilePath("server/mla_offload_server");
}

absl::StatusOr<std::unique_ptr<TestServer>> TestServer::Start(
    const std::vector<std::string>& flags) {
  absl::StatusOr<std::string> binary = ServerBinary();
  if (!binary.ok()) return binary.status();
  std::vector<std::string> args = {*binary,          "--listen=127.0.0.1:0", "--metrics_listen=",
                                   "--kv_cache_gb=0.05", "--max_position=8192", "--cpu_threads=2",
                                   "--drain_seconds=3"};
  args.insert(args.end(), flags.begin(), flags.end());
  int fds[2];
  if (pipe2(fds, O_CLOEXEC) != 0) return absl::InternalError("pipe2 failed");
  // stdout and stderr (the log lines) in one pipe, in the order written.
  absl::StatusOr<pid_t> pid = Spawn(args, fds[1], fds[1]);
  close(fds[1]);
  if (!pid.ok()) {
    close(fds[0]);
    return pid.status();
  }
  std::unique_ptr<TestServer> server(new TestServer(*pid, fds[0]));
  const std::optional<std::string> line = server->WaitForLine("serving on", absl::Seconds(60));
  // On loopback (IPv4 or IPv6), or on every interface (reached through
  // loopback).
  static const std::regex kServing(R"(serving on (127\.0\.0\.1|0\.0\.0\.0|\[::1?\]):(\d+) )");
  std::smatch match;
  if (!line.has_value() || !std::regex_search(*line, match, kServing)) {
    return absl::InternalError(
        absl::StrCat("the server did not start; its output:\n", server->Output()));
  }
  const std::string host = match[1];
  server->host_ = host == "[::]" ? "[::1]" : host == "0.0.0.0" ? "127.0.0.1" : host;
  server->port_ = std::stoi(match[2]);
  static const std::regex kMetrics(R"(metrics on port (\d+))");
  if (std::regex_search(*line, match, kMetrics)) server->metrics_port_ = std::stoi(match[1]);
  return server;
}

TestServer::TestServer(pid_t pid, int fd) : pid_(pid), fd_(fd), reader_([this] { ReadOutput(); }) {}

TestServer::~TestServer() {
  Stop();
  reader_.join();
  close(fd_);
}

std::string TestServer::target() const { return absl::StrCat(host_, ":", port_); }

void TestServer::Signal(int signal) { kill(pid_, signal); }

std::optional<int> TestServer::WaitExit(absl::Duration timeout) {
  const absl::Time deadline = absl::Now() + timeout;
  while (!exit_status_.has_value()) {
    int status = 0;
    if (waitpid(pid_, &status, WNOHANG) == pid_) {
      exit_status_ = status;
    } else if (absl::Now() >= deadline) {
      break;
    } else {
      absl::SleepFor(absl::Milliseconds(10));
    }
  }
  return exit_status_;
}

bool TestServer::Stop() {
  if (WaitExit(absl::ZeroDuration()).has_value()) return false;
  Signal(SIGTERM);
  if (WaitExit(absl::Seconds(8)).has_value()) return true;
  Signal(SIGKILL);
  WaitExit(absl::InfiniteDuration());
  return false;
}

std::string TestServer::Output() const {
  std::lock_guard<std::mutex> lock(mutex_);
  return output_;
}

std::optional<std::string> TestServer::WaitForLine(absl::string_view text,
                                                   absl::Duration timeout) {
  std::unique_lock<std::mutex> lock(mutex_);
  const auto deadline = std::chrono::steady_clock::now() + absl::ToChronoNanoseconds(timeout);
  while (true) {
    size_t start = 0;
    for (size_t end; (end = output_.find('\n', start)) != std::string::npos; start = end + 1) {
      std::string line = output_.substr(start, end - start);
      if (line.find(std::string(text)) != std::string::npos) return line;
    }
    if (eof_ || changed_.wait_until(lock, deadline) == std::cv_status::timeout) {
      return std::nullopt;
    }
  }
}

void TestServer::ReadOutput() {
  char buffer[4096];
  while (true) {
    const ssize_t got = read(fd_, buffer, sizeof(buffer));
    if (got < 0 && errno == EINTR) continue;
    std::lock_guard<std::mutex> lock(mutex_);
    if (got <= 0) {
      eof_ = true;
      changed_.notify_all();
      return;
    }
    output_.append(buffer, got);
    changed_.notify_all();
  }
}

absl::StatusOr<CommandResult> RunCommand(const std::vector<std::string>& argv,
                                         absl::Duration timeout) {
  int out[2], err[2];
  if (pipe2(out, O_CLOEXEC) != 0) return absl::InternalError("pipe2 failed");
  if (pipe2(err, O_CLOEXEC) != 0) {
    close(out[0]);
    close(out[1]);
    return absl::InternalError("pipe2 failed");
  }
  absl::StatusOr<pid_t> pid = Spawn(argv, out[1], err[1]);
  close(out[1]);
  close(err[1]);
  if (!pid.ok()) {
    close(out[0]);
    close(err[0]);
    return pid.status();
  }
  CommandResult result;
  const absl::Time deadline = absl::Now() + timeout;
  pollfd fds[2] = {{out[0], POLLIN, 0}, {err[0], POLLIN, 0}};
  int open_fds = 2;
  bool timed_out = false;
  while (open_fds > 0) {
    const int wait_ms = static_cast<int>(
        std::max<int64_t>(0, absl::ToInt64Milliseconds(deadline - absl::Now())));
    const int ready = poll(fds, 2, wait_ms);
    if (ready < 0 && errno == EINTR) continue;
    if (ready <= 0) {
      timed_out = true;
      break;
    }
    for (int i = 0; i < 2; ++i) {
      if (fds[i].fd < 0 || fds[i].revents == 0) continue;
      char buffer[4096];
      const ssize_t got = read(fds[i].fd, buffer, sizeof(buffer));
      if (got > 0) {
        (i == 0 ? result.out : result.err).append(buffer, got);
      } else if (got == 0 || errno != EINTR) {
        close(fds[i].fd);
        fds[i].fd = -1;
        --open_fds;
      }
    }
  }
  for (const pollfd& fd : fds) {
    if (fd.fd >= 0) close(fd.fd);
  }
  if (timed_out) kill(*pid, SIGKILL);
  int status = 0;
  waitpid(*pid, &status, 0);
  if (timed_out) {
    return absl::DeadlineExceededError(absl::StrCat(argv[0], " ran longer than ",
                                                    absl::FormatDuration(timeout),
                                                    "; its output:\n", result.out, result.err));
  }
  result.exit_code = WIFEXITED(status) ? WEXITSTATUS(status) : -1;
  return result;
}

}  // namespace mla::client

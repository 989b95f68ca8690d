// Child processes for the client tests: the real mla_offload_server (from
// the test's runfiles, or $MLA_OFFLOAD_SERVER) on a free loopback port, and
// one-shot runs of a binary with its output and exit status (the CLI).
//
// A TestServer is stopped when destroyed: SIGTERM, then SIGKILL if it has
// not exited within 8 s. Failures are absl::Status values with the child's
// output, so a test can print why a server did not start.
#ifndef MLA_OFFLOAD_CLIENT_TEST_PROCESSES_H_
#define MLA_OFFLOAD_CLIENT_TEST_PROCESSES_H_

#include <sys/types.h>

#include <condition_variable>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <thread>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "absl/time/time.h"

namespace mla::client {

// A path inside the test's runfiles, e.g. "server/mla_offload_server".
absl::StatusOr<std::string> RunfilePath(absl::string_view path);

// The server binary: $MLA_OFFLOAD_SERVER, else the one in the runfiles.
absl::StatusOr<std::string> ServerBinary();

class TestServer {
 public:
  // Starts the server on 127.0.0.1:0 with a small CPU-backend configuration,
  // then `flags` (a later flag overrides an earlier one), and waits for its
  // "serving on" line.
  static absl::StatusOr<std::unique_ptr<TestServer>> Start(
      const std::vector<std::string>& flags = {});
  ~TestServer();

  int port() const { return port_; }
  // The /metrics port when the server was started with one (0 otherwise).
  int metrics_port() const { return metrics_port_; }
  std::string target() const;  // "127.0.0.1:PORT", or "[::1]:PORT" on IPv6
  pid_t pid() const { return pid_; }

  void Signal(int signal);
  // The wait status once the process has exited within `timeout`.
  std::optional<int> WaitExit(absl::Duration timeout);
  // Stops it (SIGTERM, then SIGKILL after 8 s) and waits. False when it
  // took the SIGKILL (it did not stop on SIGTERM) or had already exited.
  bool Stop();
  // Everything it wrote so far, stdout and stderr interleaved.
  std::string Output() const;
  // The first line of stdout containing `text`, waiting up to `timeout`.
  std::optional<std::string> WaitForLine(absl::string_view text, absl::Duration timeout);

 private:
  TestServer(pid_t pid, int fd);
  void ReadOutput();

  const pid_t pid_;
  const int fd_;
  int port_ = 0;
  int metrics_port_ = 0;
  std::string host_;
  std::optional<int> exit_status_;
  mutable std::mutex mutex_;
  std::condition_variable changed_;
  std::string output_;
  bool eof_ = false;
  std::thread reader_;
};

struct CommandResult {
  int exit_code = -1;  // -1 when killed by a signal
  std::string out;     // stdout
  std::string err;     // stderr
};

// Runs `argv` (argv[0] is the binary's path) to completion, at most
// `timeout` (then it is killed and the result is DeadlineExceeded).
absl::StatusOr<CommandResult> RunCommand(const std::vector<std::string>& argv,
                                         absl::Duration timeout = absl::Seconds(60));

}  // namespace mla::client

#endif  // MLA_OFFLOAD_CLIENT_TEST_PROCESSES_H_

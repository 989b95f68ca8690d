// The server's log lines on stderr: "2026-12-02T01:46:33.123456Z W what",
// a UTC timestamp, a level (I info, W warning) and the text, one write a
// line, from any thread. (Debian 12's Abseil, 20220623, has no absl/log;
// these few functions stand in for it.)
//
// RefusalLog keeps refused requests from flooding the log: the first
// refusal of a (method, code) is logged at once, later ones of the same pair
// within `window` only counted, and the next one after the window is logged
// with that count. Thread-safe.
#ifndef MLA_OFFLOAD_SERVER_PROCESS_LOG_H_
#define MLA_OFFLOAD_SERVER_PROCESS_LOG_H_

#include <cstdint>
#include <functional>
#include <map>
#include <mutex>
#include <string>
#include <utility>

#include "absl/status/status.h"
#include "absl/strings/string_view.h"
#include "absl/time/time.h"

namespace mla {

enum class LogLevel { kInfo, kWarning };

// The line as Log writes it (without the newline).
std::string FormatLogLine(absl::Time when, LogLevel level, absl::string_view text);
void Log(LogLevel level, absl::string_view text);

class RefusalLog {
 public:
  // `write` takes each line (default: Log at warning level); `clock` the time.
  explicit RefusalLog(absl::Duration window = absl::Seconds(10),
                      std::function<void(absl::string_view)> write = nullptr,
                      std::function<absl::Time()> clock = nullptr);

  // A request of `method` refused with `status` (OK is not a refusal:
  // ignored).
  void Note(absl::string_view method, const absl::Status& status);

 private:
  struct Seen {
    absl::Time logged;
    int64_t since = 0;  // refusals counted, not logged, since
  };

  const absl::Duration window_;
  const std::function<void(absl::string_view)> write_;
  const std::function<absl::Time()> clock_;
  std::mutex mutex_;
  std::map<std::pair<std::string, absl::StatusCode>, Seen> seen_;
};

}  // namespace mla

#endif  // MLA_OFFLOAD_SERVER_PROCESS_LOG_H_

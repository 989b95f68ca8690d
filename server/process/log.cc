#include "server/process/log.h"

#include <cstdio>

#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"

namespace mla {
namespace {

// Error messages may quote client text; keep a line a line.
std::string OneLine(absl::string_view text) {
  std::string line(text.substr(0, 2000));
  for (char& c : line) {
    if (c == '\n' || c == '\r') c = ' ';
  }
  return line;
}

}  // namespace

std::string FormatLogLine(absl::Time when, LogLevel level, absl::string_view text) {
  return absl::StrCat(absl::FormatTime("%Y-%m-%dT%H:%M:%E6SZ", when, absl::UTCTimeZone()), " ",
                      level == LogLevel::kInfo ? "I" : "W", " ", OneLine(text));
}

void Log(LogLevel level, absl::string_view text) {
  const std::string line = FormatLogLine(absl::Now(), level, text) + "\n";
  std::fwrite(line.data(), 1, line.size(), stderr);
}

RefusalLog::RefusalLog(absl::Duration window, std::function<void(absl::string_view)> write,
                       std::function<absl::Time()> clock)
    : window_(window),
      write_(write ? std::move(write)
                   : [](absl::string_view line) { Log(LogLevel::kWarning, line); }),
      clock_(clock ? std::move(clock) : [] { return absl::Now(); }) {}

void RefusalLog::Note(absl::string_view method, const absl::Status& status) {
  if (status.ok()) return;
  const absl::Time now = clock_();
  int64_t since = 0;
  {
    std::lock_guard<std::mutex> lock(mutex_);
    auto [it, first] = seen_.try_emplace({std::string(method), status.code()});
    Seen& seen = it->second;
    if (!first && now - seen.logged < window_) {
      ++seen.since;
      return;
    }
    since = seen.since;
    seen = {now, 0};
  }
  write_(absl::StrCat("refused ", method, ": ", absl::StatusCodeToString(status.code()), ": ",
                      status.message(),
                      since > 0 ? absl::StrCat(" (and ", since, " more ", method, " ",
                                               absl::StatusCodeToString(status.code()),
                                               " since the last line)")
                                : ""));
}

}  // namespace mla

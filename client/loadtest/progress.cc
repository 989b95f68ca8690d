#include "client/loadtest/progress.h"

#include <algorithm>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "client/loadtest/report.h"

namespace mla::loadtest {

std::string FormatProgress(const ProgressSnapshot& s) {
  std::string phase;
  if (s.warming_up) {
    phase = absl::StrFormat("warm-up %.1f s", s.elapsed_s);
  } else if (s.planned_s > 0) {
    phase = absl::StrFormat("measure %.1f/%.1f s", s.window_s, s.planned_s);
  } else {
    phase = absl::StrFormat("measure %.1f s", s.window_s);
  }
  std::string latency = "p50 - p99 -";
  if (s.recent_p50_ns > 0 || s.recent_p99_ns > 0) {
    latency = absl::StrCat("p50 ", FormatDuration(s.recent_p50_ns), " p99 ",
                           FormatDuration(s.recent_p99_ns));
  }
  return absl::StrFormat(
      "%s: %s | %d layer steps (%.1f/s = %.2f decode steps/s) | %s | in flight %d | errors %d",
      s.phase, phase, s.layer_steps, s.recent_rate, s.recent_rate / std::max(1, s.layers), latency,
      s.in_flight, s.errors);
}

ProgressDisplay::ProgressDisplay(std::FILE* out, bool tty, double tty_interval_s,
                                 double plain_interval_s)
    : out_(out), tty_(tty), interval_s_(tty ? tty_interval_s : plain_interval_s) {}

void ProgressDisplay::Update(const ProgressSnapshot& snapshot, double now_s) {
  if (printed_ && now_s - last_print_s_ < interval_s_) return;
  const std::string line = FormatProgress(snapshot);
  if (tty_) {
    // Pad with spaces over the end of a longer previous line.
    const size_t pad = last_width_ > line.size() ? last_width_ - line.size() : 0;
    std::fprintf(out_, "\r%s%s", line.c_str(), std::string(pad, ' ').c_str());
    last_width_ = line.size();
  } else {
    std::fprintf(out_, "%s\n", line.c_str());
  }
  std::fflush(out_);
  printed_ = true;
  last_print_s_ = now_s;
}

void ProgressDisplay::Finish() {
  if (tty_ && printed_) {
    std::fprintf(out_, "\n");
    std::fflush(out_);
  }
  printed_ = false;
  last_width_ = 0;
}

}  // namespace mla::loadtest

// The one-line progress display of a running load test, on stderr.
//
// On a terminal the line is rewritten in place ("\r", padded over the
// previous one) at most every `tty_interval_s`; elsewhere (a log file, CI) a
// plain line is printed every `plain_interval_s` so logs stay readable.
// Finish() ends the line on a terminal. The caller samples its counters and
// calls Update() as often as it likes; the display decides what to print.
//
// Not thread-safe: one monitoring thread calls it.
#ifndef MLA_OFFLOAD_CLIENT_LOADTEST_PROGRESS_H_
#define MLA_OFFLOAD_CLIENT_LOADTEST_PROGRESS_H_

#include <cstdint>
#include <cstdio>
#include <string>

namespace mla::loadtest {

// What the run has done so far, sampled by the caller.
struct ProgressSnapshot {
  std::string phase = "attend";  // "attend" or "echo"
  double elapsed_s = 0;          // since the load began
  bool warming_up = false;
  double window_s = 0;        // measured so far (after warm-up)
  double planned_s = 0;       // measured window planned; 0 when unknown
  int64_t layer_steps = 0;    // answered OK in the measured window
  int64_t errors = 0;         // failed in the measured window
  int64_t in_flight = 0;      // sent, not yet answered
  double recent_rate = 0;     // layer steps/s answered since the previous snapshot (warm-up too)
  int64_t recent_p50_ns = 0;  // of the answers since the previous snapshot (warm-up too)
  int64_t recent_p99_ns = 0;
  int layers = 1;  // to show decode steps/s
};

// "attend: measure 3.2/10.0 s | 1234 layer steps (246.8/s = 61.7 decode steps/s) |
// p50 1.23 ms p99 4.56 ms | in flight 8 | errors 0"
std::string FormatProgress(const ProgressSnapshot& snapshot);

class ProgressDisplay {
 public:
  ProgressDisplay(std::FILE* out, bool tty, double tty_interval_s = 0.25,
                  double plain_interval_s = 5.0);

  // Prints the snapshot if its interval has passed since the last print
  // (the first call always prints); `now_s` is any monotonic clock.
  void Update(const ProgressSnapshot& snapshot, double now_s);
  // Ends the display: a newline after a terminal line; nothing otherwise.
  void Finish();

 private:
  std::FILE* out_;
  bool tty_;
  double interval_s_;
  double last_print_s_ = 0;
  bool printed_ = false;
  size_t last_width_ = 0;
};

}  // namespace mla::loadtest

#endif  // MLA_OFFLOAD_CLIENT_LOADTEST_PROGRESS_H_

// The server's one clock: monotonic, so that a wall-clock step (NTP, an
// operator's `date`) can neither expire every session at once nor keep idle
// ones alive. Every absl::Time the engine and the scheduler see (arrivals,
// last use, expiry sweeps) comes from a Clock; only differences between two
// of its readings mean anything.
#ifndef MLA_OFFLOAD_SERVER_PROCESS_CLOCK_H_
#define MLA_OFFLOAD_SERVER_PROCESS_CLOCK_H_

#include <chrono>
#include <functional>

#include "absl/time/time.h"

namespace mla {

using Clock = std::function<absl::Time()>;

// std::chrono::steady_clock as an absl::Time (its epoch is arbitrary).
inline absl::Time MonotonicNow() {
  return absl::UnixEpoch() + absl::FromChrono(std::chrono::steady_clock::now().time_since_epoch());
}

}  // namespace mla

#endif  // MLA_OFFLOAD_SERVER_PROCESS_CLOCK_H_

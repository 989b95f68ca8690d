// MoveInto: the tool's one-line form of "take the value of a StatusOr or
// return its error", for code that fills a struct from many fallible reads.
#ifndef MLA_OFFLOAD_KERNELS_TOOL_MOVE_INTO_H_
#define MLA_OFFLOAD_KERNELS_TOOL_MOVE_INTO_H_

#include <utility>

#include "absl/status/status.h"
#include "absl/status/statusor.h"

namespace mla {

// Moves a successful result into `target` (anything assignable from T, e.g.
// std::optional<T>); otherwise leaves it and returns the error.
template <typename T, typename Target>
absl::Status MoveInto(absl::StatusOr<T> result, Target& target) {
  if (!result.ok()) return result.status();
  target = *std::move(result);
  return absl::OkStatus();
}

}  // namespace mla

#endif  // MLA_OFFLOAD_KERNELS_TOOL_MOVE_INTO_H_

// Head padding policy (spec section 6).
//
// A rank sends H = h_total / TP query heads. Kernels exist for the head counts
// in kSupportedHeadCounts; a rank's H runs at the smallest supported count
// Hp >= H (H < 8 runs at 8). The padding heads are zero queries with -inf
// sinks, produced inside the prologue, and are dropped before output leaves.
#ifndef MLA_OFFLOAD_KERNELS_HEAD_PADDING_H_
#define MLA_OFFLOAD_KERNELS_HEAD_PADDING_H_

#include <string>

#include "absl/status/statusor.h"

namespace mla {

inline constexpr int kSupportedHeadCounts[] = {8, 16, 32, 64, 128};
inline constexpr int kMaxHeads = 128;

// "8, 16, 32, 64, 128", for messages.
std::string SupportedHeadCountsText();

// Hp for H query heads; InvalidArgument for H < 1 or H > 128.
absl::StatusOr<int> PaddedHeadCount(int num_heads);

}  // namespace mla

#endif  // MLA_OFFLOAD_KERNELS_HEAD_PADDING_H_

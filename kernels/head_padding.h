// Head padding policy (spec section 6).
//
// A rank sends H = h_total / TP query heads. Kernels run every multiple of
// kHeadCountStep from kHeadCountStep to kMaxHeads natively; a rank's H runs
// at Hp = H rounded up to that step (H < 8 runs at 8), so 24, 40 or 96 heads
// are not padded to a power of two. The padding heads (at most 7) are zero
// queries with -inf sinks, produced inside the prologue, and are dropped
// before output leaves.
#ifndef MLA_OFFLOAD_KERNELS_HEAD_PADDING_H_
#define MLA_OFFLOAD_KERNELS_HEAD_PADDING_H_

#include <array>
#include <string>

#include "absl/status/statusor.h"

namespace mla {

inline constexpr int kHeadCountStep = 8;
inline constexpr int kMaxHeads = 128;

// 8, 16, 24, ..., 128: the head counts the kernels run.
inline constexpr std::array<int, kMaxHeads / kHeadCountStep> kSupportedHeadCounts = [] {
  std::array<int, kMaxHeads / kHeadCountStep> counts{};
  for (int i = 0; i < static_cast<int>(counts.size()); ++i) counts[i] = kHeadCountStep * (i + 1);
  return counts;
}();

// Whether Hp is a kernel head count (a multiple of 8 from 8 to 128).
constexpr bool IsSupportedHeadCount(int padded_heads) {
  return padded_heads >= kHeadCountStep && padded_heads <= kMaxHeads &&
         padded_heads % kHeadCountStep == 0;
}

// "every multiple of 8 from 8 to 128", for messages.
std::string SupportedHeadCountsText();

// Hp for H query heads; InvalidArgument for H < 1 or H > 128.
absl::StatusOr<int> PaddedHeadCount(int num_heads);

}  // namespace mla

#endif  // MLA_OFFLOAD_KERNELS_HEAD_PADDING_H_

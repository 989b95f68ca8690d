#include "kernels/head_padding.h"

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"

namespace mla {

std::string SupportedHeadCountsText() {
  return absl::StrCat("every multiple of ", kHeadCountStep, " from ", kHeadCountStep, " to ",
                      kMaxHeads);
}

absl::StatusOr<int> PaddedHeadCount(int num_heads) {
  if (num_heads >= 1 && num_heads <= kMaxHeads) {
    return (num_heads + kHeadCountStep - 1) / kHeadCountStep * kHeadCountStep;
  }
  return absl::InvalidArgumentError(absl::StrCat(
      "head count ", num_heads, " is not supported: a rank may send 1 to ", kMaxHeads,
      " query heads, which run at the count rounded up to a multiple of ", kHeadCountStep,
      " (the kernels run ", SupportedHeadCountsText(), ")"));
}

}  // namespace mla

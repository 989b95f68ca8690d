#include "kernels/head_padding.h"

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"

namespace mla {

std::string SupportedHeadCountsText() { return absl::StrJoin(kSupportedHeadCounts, ", "); }

absl::StatusOr<int> PaddedHeadCount(int num_heads) {
  if (num_heads >= 1) {
    for (int supported : kSupportedHeadCounts) {
      if (num_heads <= supported) return supported;
    }
  }
  return absl::InvalidArgumentError(absl::StrCat(
      "head count ", num_heads, " is not supported: a rank may send 1 to ", kMaxHeads,
      " query heads, which run at the next of the supported counts {",
      SupportedHeadCountsText(), "}"));
}

}  // namespace mla

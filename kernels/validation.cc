#include "kernels/validation.h"

#include <vector>

#include "absl/container/flat_hash_set.h"
#include "absl/strings/str_cat.h"

namespace mla {

absl::Status CheckInsertSlots(absl::string_view name, const int32_t* slots, int64_t count,
                              int64_t pool_slots) {
  absl::flat_hash_set<int32_t> seen;
  for (int64_t i = 0; i < count; ++i) {
    const int32_t slot = slots[i];
    if (slot == -1) continue;
    if (slot < 0 || slot >= pool_slots) {
      return absl::InvalidArgumentError(absl::StrCat(name, "[", i, "] = ", slot,
                                                     " is outside the pool's slots [0, ",
                                                     pool_slots, ") and is not -1"));
    }
    if (!seen.insert(slot).second) {
      return absl::InvalidArgumentError(
          absl::StrCat(name, "[", i, "] = ", slot, " writes a slot already written in this batch"));
    }
  }
  return absl::OkStatus();
}

absl::Status CheckPositions(absl::string_view name, const int32_t* positions, int64_t count,
                            int64_t num_positions) {
  for (int64_t i = 0; i < count; ++i) {
    if (positions[i] < 0 || positions[i] >= num_positions) {
      return absl::InvalidArgumentError(absl::StrCat(name, "[", i, "] = ", positions[i],
                                                     " is outside the positions [0, ",
                                                     num_positions, ") of the RoPE table"));
    }
  }
  return absl::OkStatus();
}

absl::Status CheckKeyIndices(absl::string_view name, const int32_t* indices,
                             const int32_t* lengths, int64_t num_tokens, int width,
                             int64_t pool_slots) {
  for (int64_t t = 0; t < num_tokens; ++t) {
    const int32_t length = lengths == nullptr ? width : lengths[t];
    if (length < 0 || length > width) {
      return absl::InvalidArgumentError(absl::StrCat(name, " length of token ", t, " = ", length,
                                                     " is outside [0, ", width, "]"));
    }
    const int32_t* row = indices + t * width;
    for (int32_t k = 0; k < length; ++k) {
      if (row[k] != -1 && (row[k] < 0 || row[k] >= pool_slots)) {
        return absl::InvalidArgumentError(absl::StrCat(name, "[", t, "][", k, "] = ", row[k],
                                                       " is outside the pool's slots [0, ",
                                                       pool_slots, ") and is not -1"));
      }
    }
  }
  return absl::OkStatus();
}

}  // namespace mla

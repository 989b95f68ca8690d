#include "kernels/key_lists.h"

#include <algorithm>
#include <cstdint>

#include "kernels/geometry.h"

namespace mla {
namespace {

inline int32_t SlotOf(const int32_t* table, int32_t row) {
  return table[row / kBlockTokens] * kBlockTokens + row % kBlockTokens;
}

}  // namespace

absl::Status BuildKeyListsOnHost(const KeyListBuildParams& params) {
  if (absl::Status status = CheckKeyListBuildParams(params); !status.ok()) return status;
  for (int64_t i = 0; i < params.num_table_writes; ++i) {
    const int32_t at = params.table_write_at[i];
    if (at >= 0 && at < params.num_pages) params.pages[at] = params.table_write_page[i];
  }
  const int32_t ring_rows = params.swa_ring_pages * kBlockTokens;
  const int width = params.extra_width;
  for (int64_t t = 0; t < params.num_tokens; ++t) {
    const int32_t p = params.positions[t];
    const int32_t* swa = params.pages + params.swa_table[t];
    const int32_t first = std::max(0, p - kSwaWindow + 1);
    int32_t* main = params.main_indices + t * kSwaWindow;
    params.main_lengths[t] = p - first + 1;
    for (int k = 0; k < kSwaWindow; ++k) {
      const int32_t w = first + k;
      main[k] = w <= p ? SlotOf(swa, w % ring_rows) : -1;
    }
    const int32_t rule = params.extra_rule[t];
    const int32_t* compressed = params.pages + params.compressed_table[t];
    int32_t* extra = params.extra_indices + t * width;
    const int32_t length = rule > 0 ? rule : rule < 0 ? (p + 1) / -rule : 0;
    params.extra_lengths[t] = length;
    for (int k = 0; k < width; ++k) {
      int32_t slot = -1;
      if (k < length) {
        const int32_t row = rule > 0 ? extra[k] : k;
        if (row >= 0) slot = SlotOf(compressed, row);
      }
      extra[k] = slot;
    }
  }
  return absl::OkStatus();
}

}  // namespace mla

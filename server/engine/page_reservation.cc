#include "server/engine/page_reservation.h"

#include <algorithm>

#include "absl/status/statusor.h"

namespace mla {

void PageReservation::Need(LayerKv& layer, int64_t rows) {
  const int64_t missing =
      std::max<int64_t>(0, PagesFor(rows) - static_cast<int64_t>(layer.compressed_blocks.size()));
  if (missing > 0) wants_.push_back({&layer, missing, 0});
}

int64_t PageReservation::missing() const {
  int64_t total = 0;
  for (const Want& want : wants_) total += want.missing;
  return total;
}

absl::Status PageReservation::Take(KvBlockPool& pool) {
  const int64_t total = missing();
  if (total == 0) return absl::OkStatus();
  absl::StatusOr<std::vector<int32_t>> pages = pool.Allocate(total);
  if (!pages.ok()) return pages.status();
  auto page = pages->begin();
  for (Want& want : wants_) {
    for (; want.taken < want.missing; ++want.taken) {
      want.layer->compressed_blocks.push_back(*page++);
    }
  }
  return absl::OkStatus();
}

void PageReservation::ReturnPages(KvBlockPool& pool) {
  std::vector<int32_t> pages;
  for (Want& want : wants_) {
    for (; want.taken > 0; --want.taken) {
      pages.push_back(want.layer->compressed_blocks.back());
      want.layer->compressed_blocks.pop_back();
    }
  }
  pool.Free(pages);
}

}  // namespace mla

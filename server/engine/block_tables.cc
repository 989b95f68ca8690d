#include "server/engine/block_tables.h"

#include <algorithm>
#include <limits>
#include <utility>

#include "absl/strings/str_cat.h"

namespace mla {

absl::StatusOr<BlockTables> BlockTables::Create(ComputeBackend& backend, int64_t pool_blocks) {
  if (pool_blocks < 0 ||
      pool_blocks > std::numeric_limits<int32_t>::max() / kEntriesPerBlock) {
    return absl::InvalidArgumentError(
        absl::StrCat("page tables for a pool of ", pool_blocks, " blocks: at most ",
                     std::numeric_limits<int32_t>::max() / kEntriesPerBlock, " blocks"));
  }
  const int64_t entries = std::max<int64_t>(1, kEntriesPerBlock * pool_blocks);
  absl::StatusOr<DeviceBuffer> space = backend.Allocate(entries * 4);
  if (!space.ok()) return space.status();
  const std::vector<int32_t> zeros(entries, 0);
  if (absl::Status status = backend.CopyToDevice(space->data(), zeros.data(), entries * 4);
      !status.ok()) {
    return status;
  }
  return BlockTables(*std::move(space), entries);
}

bool BlockTables::MustPlace(const LayerKv& layer, int32_t entries) const {
  return layer.table.generation != generation_ || layer.table.capacity < entries;
}

absl::StatusOr<TableWrites> BlockTables::Prepare(int64_t launch,
                                                 const std::vector<TableUse>& uses) {
  // The most entries each layer must hold (several ranks may name one), in
  // the order the launch first names them.
  absl::flat_hash_map<LayerKv*, int32_t> most;
  std::vector<LayerKv*> order;
  for (const TableUse& use : uses) {
    const int64_t pages = kSwaRingBlocks + static_cast<int64_t>(use.layer->compressed_blocks.size());
    if (use.entries < kSwaRingBlocks || use.entries > pages) {
      return absl::InternalError(absl::StrCat("a page table of ", use.entries,
                                              " entries for a layer of ", pages, " pages"));
    }
    auto [it, first] = most.try_emplace(use.layer, use.entries);
    if (first) order.push_back(use.layer);
    it->second = std::max(it->second, use.entries);
  }
  int64_t wanted = 0;
  for (LayerKv* layer : order) {
    if (MustPlace(*layer, most[layer])) wanted += RangeFor(most[layer]);
  }
  if (next_free_ + wanted > num_pages_) {
    // Every range forgotten: the launch's tables all go to fresh ones. They
    // fit: each holds at most twice the blocks of its layer.
    int64_t all = 0;
    for (LayerKv* layer : order) all += RangeFor(most[layer]);
    if (all > num_pages_) {
      return absl::InternalError(absl::StrCat("the page tables of one launch need ", all,
                                              " entries; the table space holds ", num_pages_));
    }
    ++generation_;
    next_free_ = 0;
  }
  TableWrites writes;
  std::vector<Written>& written = unsettled_[launch];
  for (LayerKv* layer : order) {
    TablePlacement& table = layer->table;
    const int32_t entries = most[layer];
    if (MustPlace(*layer, entries)) {
      table = {generation_, static_cast<int32_t>(next_free_),
               static_cast<int32_t>(RangeFor(entries)), 0};
      next_free_ += RangeFor(entries);
    }
    for (int32_t i = table.confirmed; i < entries; ++i) {
      writes.at.push_back(table.at + i);
      writes.page.push_back(i < kSwaRingBlocks ? layer->swa_blocks[i]
                                               : layer->compressed_blocks[i - kSwaRingBlocks]);
    }
    writes.starts[layer] = table.at;
    written.push_back({layer, generation_, table.at, entries});
  }
  return writes;
}

void BlockTables::Settle(int64_t launch, bool succeeded) {
  const auto it = unsettled_.find(launch);
  if (it == unsettled_.end()) return;
  for (const Written& w : succeeded ? it->second : std::vector<Written>()) {
    TablePlacement& table = w.layer->table;
    if (table.generation == w.generation && table.at == w.at) {
      const int32_t pages =
          kSwaRingBlocks + static_cast<int32_t>(w.layer->compressed_blocks.size());
      table.confirmed = std::min(std::max(table.confirmed, w.entries), pages);
    }
  }
  unsettled_.erase(it);
}

}  // namespace mla

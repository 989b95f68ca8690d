// The sessions' page tables kept in backend memory between launches
// (KeyListBuildParams::pages), so that a launch sends only the entries that
// changed since the tables were last known good: a new page now and then,
// not every session's whole table every step.
//
// A session layer's table is its kSwaRingBlocks SWA pages, then its
// compressed pages; it sits at the range of the table space that the
// layer's TablePlacement (server/engine/session.h) names. Ranges are handed out
// from the front of the space, twice the entries asked, so that a growing
// table moves rarely; one that outgrows its range moves to a new one and is
// written there in full. When the space is spent, every range is forgotten
// at once (a new generation) and each table is written in full by the next
// launch that uses it. The space holds kEntriesPerBlock entries a pool
// block: a launch's ranges (at most two entries a block the session layers
// hold) always fit a fresh generation.
//
// What a launch writes is trusted by later launches only once it has
// succeeded (Settle): until then a later launch over the same table writes
// those entries again (the same values), and a launch that failed, whose
// pages went back, leaves nothing trusted. The device writes run in the
// backend's order, after the kernels of the launches before.
//
// What the caller guarantees (the engine does): no launch names a layer
// while a launch that added pages to it runs unsettled (such messages wait
// for the running batch), and only a failed launch's own pages leave a
// layer again (PageReservation::ReturnPages); a confirmed entry is never
// past the layer's pages (Settle clamps it). Prepare and Settle are the
// engine thread's; the layers named must live until their launch is
// settled (sessions are closed only when no batch runs). Not thread-safe.
#ifndef MLA_OFFLOAD_SERVER_ENGINE_BLOCK_TABLES_H_
#define MLA_OFFLOAD_SERVER_ENGINE_BLOCK_TABLES_H_

#include <cstdint>
#include <map>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "absl/status/statusor.h"
#include "kernels/backend.h"
#include "server/engine/session.h"

namespace mla {

// One launch's use of a session layer's table: the first `entries` of it
// must hold the layer's pages.
struct TableUse {
  LayerKv* layer = nullptr;
  int32_t entries = 0;
};

// What a launch sends for the tables: the entries to set
// (KeyListBuildParams' table writes), and where each layer's table starts.
struct TableWrites {
  std::vector<int32_t> at;
  std::vector<int32_t> page;
  absl::flat_hash_map<const LayerKv*, int32_t> starts;
};

class BlockTables {
 public:
  static constexpr int64_t kEntriesPerBlock = 4;

  // Table space for a pool of `pool_blocks` blocks in `backend`'s memory,
  // every entry 0 (a block of the pool, whatever reads it).
  static absl::StatusOr<BlockTables> Create(ComputeBackend& backend, int64_t pool_blocks);

  int32_t* pages() const { return space_.as<int32_t>(); }
  int64_t num_pages() const { return num_pages_; }
  // Generations begun so far (1 at the start): each one after the first
  // rewrites every table the launches after it use.
  int64_t generation() const { return generation_; }

  // Launch `launch`'s tables: places those that have no range of this
  // generation or outgrew theirs, and gives the writes the launch must make
  // (the entries not yet trusted) with the layers' pages as they are now.
  // Internal when a table names more entries than its layer has pages
  // (the caller's bug), with nothing placed.
  absl::StatusOr<TableWrites> Prepare(int64_t launch, const std::vector<TableUse>& uses);
  // Launch `launch` (prepared) succeeded or not: what it wrote is trusted,
  // or forgotten.
  void Settle(int64_t launch, bool succeeded);

 private:
  // What a launch writes into one layer's range, trusted once it succeeded.
  struct Written {
    LayerKv* layer;
    int64_t generation;
    int32_t at;
    int32_t entries;
  };

  BlockTables(DeviceBuffer space, int64_t num_pages)
      : space_(std::move(space)), num_pages_(num_pages) {}
  // The entries of a fresh range for a table of `entries`.
  static int64_t RangeFor(int32_t entries) { return int64_t{2} * entries; }
  // Whether `layer` must move to a new range to hold `entries`.
  bool MustPlace(const LayerKv& layer, int32_t entries) const;

  DeviceBuffer space_;
  int64_t num_pages_ = 0;
  int64_t generation_ = 1;
  int64_t next_free_ = 0;  // ranges of this generation end before it
  std::map<int64_t, std::vector<Written>> unsettled_;  // by launch
};

}  // namespace mla

#endif  // MLA_OFFLOAD_SERVER_ENGINE_BLOCK_TABLES_H_

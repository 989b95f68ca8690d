#include "server/engine/block_tables.h"

#include <cstdint>
#include <random>
#include <vector>

#include "absl/strings/str_cat.h"
#include "gtest/gtest.h"
#include "kernels/cpu_backend.h"

namespace mla {
namespace {

// A layer with its ring and `compressed` compressed pages, numbered from
// `first`.
LayerKv Layer(int32_t first, int compressed) {
  LayerKv layer;
  for (int i = 0; i < kSwaRingBlocks; ++i) layer.swa_blocks.push_back(first + i);
  for (int i = 0; i < compressed; ++i) layer.compressed_blocks.push_back(first + 100 + i);
  return layer;
}

int32_t Entries(const LayerKv& layer) {
  return kSwaRingBlocks + static_cast<int32_t>(layer.compressed_blocks.size());
}

// What the device does with a launch's writes (the CPU backend's memory is
// the host's).
void Apply(const BlockTables& tables, const TableWrites& writes) {
  for (size_t i = 0; i < writes.at.size(); ++i) {
    ASSERT_GE(writes.at[i], 0);
    ASSERT_LT(writes.at[i], tables.num_pages());
    tables.pages()[writes.at[i]] = writes.page[i];
  }
}

// The table a launch's tokens read for `layer`: its first `entries` entries.
std::vector<int32_t> TableOf(const BlockTables& tables, const TableWrites& writes,
                             const LayerKv& layer, int32_t entries) {
  const int32_t at = writes.starts.at(&layer);
  return {tables.pages() + at, tables.pages() + at + entries};
}

std::vector<int32_t> PagesOf(const LayerKv& layer, int32_t entries) {
  std::vector<int32_t> pages = layer.swa_blocks;
  pages.insert(pages.end(), layer.compressed_blocks.begin(), layer.compressed_blocks.end());
  pages.resize(entries);
  return pages;
}

BlockTables NewTables(CpuBackend& backend, int64_t blocks) {
  absl::StatusOr<BlockTables> tables = BlockTables::Create(backend, blocks);
  EXPECT_TRUE(tables.ok()) << tables.status();
  return *std::move(tables);
}

// A layer's first launch writes its whole table; once that launch has
// succeeded, the next writes only what is new.
TEST(BlockTablesTest, OnlyWhatChangedIsWrittenAgain) {
  CpuBackend backend(1);
  BlockTables tables = NewTables(backend, 100);
  EXPECT_EQ(tables.num_pages(), 400);
  LayerKv layer = Layer(10, 2);
  absl::StatusOr<TableWrites> first = tables.Prepare(0, {{&layer, 6}});
  ASSERT_TRUE(first.ok()) << first.status();
  EXPECT_EQ(first->at.size(), 6u);
  Apply(tables, *first);
  EXPECT_EQ(TableOf(tables, *first, layer, 6), PagesOf(layer, 6));
  tables.Settle(0, true);
  absl::StatusOr<TableWrites> same = tables.Prepare(1, {{&layer, 6}});
  ASSERT_TRUE(same.ok());
  EXPECT_TRUE(same->at.empty());
  EXPECT_EQ(same->starts.at(&layer), first->starts.at(&layer));
  tables.Settle(1, true);
  layer.compressed_blocks.push_back(555);
  absl::StatusOr<TableWrites> grown = tables.Prepare(2, {{&layer, 7}});
  ASSERT_TRUE(grown.ok());
  ASSERT_EQ(grown->at.size(), 1u);
  EXPECT_EQ(grown->page[0], 555);
  Apply(tables, *grown);
  EXPECT_EQ(TableOf(tables, *grown, layer, 7), PagesOf(layer, 7));
}

// Until a launch has succeeded, what it wrote is not trusted: the next one
// writes it again, and after a failure as well.
TEST(BlockTablesTest, UnsettledAndFailedWritesAreWrittenAgain) {
  CpuBackend backend(1);
  BlockTables tables = NewTables(backend, 100);
  LayerKv layer = Layer(10, 1);
  absl::StatusOr<TableWrites> first = tables.Prepare(0, {{&layer, 5}});
  ASSERT_TRUE(first.ok());
  absl::StatusOr<TableWrites> while_running = tables.Prepare(1, {{&layer, 5}});
  ASSERT_TRUE(while_running.ok());
  EXPECT_EQ(while_running->at, first->at);
  tables.Settle(0, false);
  tables.Settle(1, false);
  absl::StatusOr<TableWrites> after_failures = tables.Prepare(2, {{&layer, 5}});
  ASSERT_TRUE(after_failures.ok());
  EXPECT_EQ(after_failures->at, first->at);
}

// A table that outgrows its range moves to a new one, written in full; an
// older launch settled late trusts nothing of the new range.
TEST(BlockTablesTest, AGrownTableMovesAndIsWrittenInFull) {
  CpuBackend backend(1);
  BlockTables tables = NewTables(backend, 100);
  LayerKv layer = Layer(10, 0);
  absl::StatusOr<TableWrites> small = tables.Prepare(0, {{&layer, 4}});  // a range of 8
  ASSERT_TRUE(small.ok());
  for (int i = 0; i < 5; ++i) layer.compressed_blocks.push_back(200 + i);
  absl::StatusOr<TableWrites> large = tables.Prepare(1, {{&layer, 9}});
  ASSERT_TRUE(large.ok());
  EXPECT_NE(large->starts.at(&layer), small->starts.at(&layer));
  EXPECT_EQ(large->at.size(), 9u);
  tables.Settle(0, true);
  EXPECT_EQ(layer.table.confirmed, 0) << "the old range's launch confirmed the new range";
  tables.Settle(1, true);
  EXPECT_EQ(layer.table.confirmed, 9);
}

// Several uses of one layer in a launch (ranks of one session) place it once,
// for the most entries any of them needs.
TEST(BlockTablesTest, OneLayerNamedTwiceIsPlacedOnce) {
  CpuBackend backend(1);
  BlockTables tables = NewTables(backend, 100);
  LayerKv layer = Layer(10, 3);
  absl::StatusOr<TableWrites> writes = tables.Prepare(0, {{&layer, 5}, {&layer, 7}, {&layer, 4}});
  ASSERT_TRUE(writes.ok());
  EXPECT_EQ(writes->at.size(), 7u);
  EXPECT_EQ(writes->starts.size(), 1u);
  EXPECT_GE(layer.table.capacity, 7);
}

// More entries than the layer has pages is the caller's bug: Internal, and
// nothing placed.
TEST(BlockTablesTest, MoreEntriesThanPagesIsAnError) {
  CpuBackend backend(1);
  BlockTables tables = NewTables(backend, 100);
  LayerKv layer = Layer(10, 1);
  for (int32_t entries : {6, 3}) {
    absl::StatusOr<TableWrites> writes = tables.Prepare(0, {{&layer, entries}});
    EXPECT_EQ(writes.status().code(), absl::StatusCode::kInternal) << entries;
    EXPECT_EQ(layer.table.generation, -1) << entries;
  }
}

TEST(BlockTablesTest, APoolTooLargeForTheTableSpaceIsRefused) {
  CpuBackend backend(1);
  EXPECT_EQ(BlockTables::Create(backend, int64_t{1} << 30).status().code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(BlockTables::Create(backend, -1).status().code(), absl::StatusCode::kInvalidArgument);
}

// Random launches, two at a time as the engine runs them, over layers that
// grow, lose pages again when their launch fails, and are replaced by new
// ones, in a space small enough to run out again and again. The engine's rule holds: a launch waits for the
// one before when that one adds pages to a layer it uses. A failed launch's
// writes may or may not have reached the device. After each launch's writes
// the tables its tokens read hold exactly their layers' pages.
TEST(BlockTablesTest, RandomLaunchesAlwaysReadTheirLayersPages) {
  CpuBackend backend(1);
  constexpr int kLayers = 6;
  constexpr int64_t kBlocks = 40;  // 24 in rings, up to 16 compressed
  BlockTables tables = NewTables(backend, kBlocks);
  std::vector<LayerKv> layers;
  for (int i = 0; i < kLayers; ++i) layers.push_back(Layer(i * 1000, 0));
  std::mt19937 rng(1234);
  int64_t compressed = 0;
  struct Launch {
    int64_t number;
    std::vector<int> grown;  // layers it added a page to (given back if it fails)
    bool fails;
  };
  std::vector<Launch> running;
  const auto settle_oldest = [&] {
    const Launch done = running.front();
    running.erase(running.begin());
    if (done.fails) {
      for (int g : done.grown) {
        layers[g].compressed_blocks.pop_back();
        --compressed;
      }
    }
    tables.Settle(done.number, !done.fails);
  };
  for (int64_t number = 0; number < 3000; ++number) {
    if (number % 10 == 0) {
      // A session closed and another made in its place (the engine closes
      // one only when no batch runs): a new layer at the same address.
      while (!running.empty()) settle_oldest();
      const int i = static_cast<int>(rng() % kLayers);
      compressed -= static_cast<int64_t>(layers[i].compressed_blocks.size());
      layers[i] = Layer(static_cast<int32_t>(number) * 1000, 0);
    }
    Launch launch{number, {}, rng() % 8 == 0};
    std::vector<TableUse> uses;
    for (int i = 0; i < kLayers; ++i) {
      if (rng() % 2 != 0) continue;
      LayerKv& layer = layers[i];
      bool blocked = false;
      for (const Launch& other : running) {
        for (int g : other.grown) blocked |= g == i;
      }
      if (blocked) continue;
      if (rng() % 3 == 0 && compressed < kBlocks - kLayers * kSwaRingBlocks) {
        layer.compressed_blocks.push_back(static_cast<int32_t>(rng() % 100000));
        ++compressed;
        launch.grown.push_back(i);
      }
      uses.push_back({&layer, Entries(layer) - static_cast<int32_t>(rng() % 2 == 0 &&
                                                                     Entries(layer) > 4)});
    }
    absl::StatusOr<TableWrites> writes = tables.Prepare(number, uses);
    ASSERT_TRUE(writes.ok()) << writes.status() << " launch " << number;
    if (!launch.fails || rng() % 2 == 0) Apply(tables, *writes);
    if (!launch.fails) {
      for (const TableUse& use : uses) {
        ASSERT_EQ(TableOf(tables, *writes, *use.layer, use.entries),
                  PagesOf(*use.layer, use.entries))
            << "launch " << number << ", generation " << tables.generation();
      }
    }
    running.push_back(launch);
    if (running.size() == 2) settle_oldest();
  }
  EXPECT_GT(tables.generation(), 10) << "the space ran out too rarely to test it";
}

}  // namespace
}  // namespace mla

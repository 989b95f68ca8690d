// Tests of the paged KV pool (server/engine/kv_pool.h) in the memory of a
// backend that runs no kernel: sizes it refuses, all-or-nothing allocation,
// and the order in which blocks are handed out and reused.
#include "server/engine/kv_pool.h"

#include <algorithm>
#include <cstdint>
#include <limits>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/str_cat.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "kernels/cache_format.h"
#include "kernels/geometry.h"
#include "server/engine/testing/expect_error.h"
#include "server/engine/testing/memory_only_backend.h"

namespace mla {
namespace {

using engine_testing::ExpectError;
using engine_testing::MemoryOnlyBackend;
using engine_testing::NewPool;
using ::testing::ElementsAre;
using ::testing::UnorderedElementsAre;

// A negative block count is the caller's bug, not a request for none: an
// error, and the pool as it was.
TEST(KvBlockPoolTest, NegativeCountsAreErrors) {
  MemoryOnlyBackend backend;
  KvBlockPool pool = NewPool(backend, 8);
  absl::StatusOr<std::vector<int32_t>> taken = pool.Allocate(3);
  ASSERT_TRUE(taken.ok()) << taken.status();
  for (int64_t count : {int64_t{-1}, std::numeric_limits<int64_t>::min()}) {
    ExpectError(pool.Allocate(count).status(), absl::StatusCode::kInternal, "KV pool",
                absl::StrCat("Allocate(", count, ")"));
    EXPECT_EQ(pool.used_blocks(), 3) << count;
  }
  absl::StatusOr<std::vector<int32_t>> rest = pool.Allocate(5);
  ASSERT_TRUE(rest.ok()) << rest.status();
  std::vector<int32_t> all = *taken;
  all.insert(all.end(), rest->begin(), rest->end());
  std::sort(all.begin(), all.end());
  EXPECT_THAT(all, ElementsAre(0, 1, 2, 3, 4, 5, 6, 7));
  EXPECT_EQ(pool.Allocate(1).status().code(), absl::StatusCode::kResourceExhausted);
}

// Slots are int32 (block * 64 + offset): a pool of no blocks, or of more
// than 2^31 slots, is refused before any memory is taken.
TEST(KvBlockPoolTest, SizesOutsideTheSlotSpaceAreRefused) {
  MemoryOnlyBackend backend;
  const int64_t most = (int64_t{1} << 31) / kBlockTokens;
  for (int64_t blocks : {int64_t{0}, int64_t{-1}, most + 1}) {
    ExpectError(KvBlockPool::Create(backend, blocks).status(), absl::StatusCode::kInvalidArgument,
                absl::StrCat("a KV pool needs between 1 and ", most, " blocks"),
                absl::StrCat(blocks, " blocks"));
  }
  KvBlockPool pool = NewPool(backend, 3);
  EXPECT_EQ(pool.total_blocks(), 3);
  EXPECT_EQ(pool.free_blocks(), 3);
  EXPECT_EQ(pool.view().num_blocks, 3);
  EXPECT_EQ(pool.view().bytes(), 3 * kBlockBytes);
  ASSERT_NE(pool.view().base, nullptr);
  EXPECT_TRUE(std::all_of(pool.view().base, pool.view().base + pool.view().bytes(),
                          [](uint8_t byte) { return byte == 0; }))
      << "a new pool is zero-filled";
}

// More blocks than are free: RESOURCE_EXHAUSTED naming how many were asked
// for and how many are free, and none taken. Freed blocks are handed out
// again before blocks never used.
TEST(KvBlockPoolTest, AllocationIsAllOrNothingAndReusesFreedBlocksFirst) {
  MemoryOnlyBackend backend;
  KvBlockPool pool = NewPool(backend, 6);
  absl::StatusOr<std::vector<int32_t>> first = pool.Allocate(4);
  ASSERT_TRUE(first.ok()) << first.status();
  EXPECT_THAT(*first, UnorderedElementsAre(0, 1, 2, 3));
  ExpectError(pool.Allocate(3).status(), absl::StatusCode::kResourceExhausted,
              "KV cache full: 3 blocks of 64 tokens needed, 2 of 6 free", "3 of 2 free");
  EXPECT_EQ(pool.free_blocks(), 2);
  EXPECT_EQ(pool.used_blocks(), 4);
  pool.Free({1, 3});
  EXPECT_EQ(pool.free_blocks(), 4);
  absl::StatusOr<std::vector<int32_t>> again = pool.Allocate(2);
  ASSERT_TRUE(again.ok()) << again.status();
  EXPECT_THAT(*again, UnorderedElementsAre(1, 3));
  absl::StatusOr<std::vector<int32_t>> none = pool.Allocate(0);
  ASSERT_TRUE(none.ok()) << none.status();
  EXPECT_TRUE(none->empty());
  absl::StatusOr<std::vector<int32_t>> rest = pool.Allocate(2);
  ASSERT_TRUE(rest.ok()) << rest.status();
  EXPECT_THAT(*rest, UnorderedElementsAre(4, 5));
  EXPECT_EQ(pool.free_blocks(), 0);
}

}  // namespace
}  // namespace mla

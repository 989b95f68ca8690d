// Tests of the compressed pages a request adds (server/engine/page_reservation.h),
// over a pool in the memory of a backend that runs no kernel: what Need
// counts, Take's all or nothing, and ReturnPages leaving the layers and the
// pool as they were.
#include "server/engine/page_reservation.h"

#include <cstdint>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "server/engine/kv_pool.h"
#include "server/engine/session.h"
#include "server/engine/testing/expect_error.h"
#include "server/engine/testing/memory_only_backend.h"

namespace mla {
namespace {

using engine_testing::ExpectError;
using engine_testing::MemoryOnlyBackend;
using engine_testing::NewPool;
using ::testing::ElementsAre;
using ::testing::IsEmpty;

// A layer whose compressed pages are `pages`.
LayerKv Layer(std::vector<int32_t> pages) {
  LayerKv layer;
  layer.compressed_blocks = std::move(pages);
  return layer;
}

// Need counts the pages each layer misses for its rows (64 a page), none for
// a layer that has them; Take takes them in one allocation and attaches
// them at the end of each layer, in the order of the Needs.
TEST(PageReservationTest, TakesWhatEveryLayerMissesAtOnce) {
  MemoryOnlyBackend backend;
  KvBlockPool pool = NewPool(backend, 10);
  absl::StatusOr<std::vector<int32_t>> held = pool.Allocate(3);
  ASSERT_TRUE(held.ok());
  LayerKv empty = Layer({});
  LayerKv full = Layer({(*held)[0], (*held)[1]});
  LayerKv short_one = Layer({(*held)[2]});
  PageReservation pages;
  pages.Need(empty, 65);      // 2 pages
  pages.Need(full, 128);      // has both
  pages.Need(short_one, 65);  // 1 more
  EXPECT_EQ(pages.missing(), 3);
  ASSERT_TRUE(pages.Take(pool).ok());
  EXPECT_EQ(pool.used_blocks(), 6);
  EXPECT_EQ(empty.compressed_blocks.size(), 2u);
  EXPECT_THAT(full.compressed_blocks, ElementsAre((*held)[0], (*held)[1]));
  ASSERT_EQ(short_one.compressed_blocks.size(), 2u);
  EXPECT_EQ(short_one.compressed_blocks[0], (*held)[2]) << "taken pages go at the end";
  std::vector<int32_t> taken = empty.compressed_blocks;
  taken.push_back(short_one.compressed_blocks[1]);
  for (int32_t page : taken) {
    for (int32_t other : *held) EXPECT_NE(page, other) << "a held page was handed out again";
  }
}

// A reservation the pool cannot fill takes nothing: RESOURCE_EXHAUSTED, the
// layers and the pool as they were (a message whose second segment needs
// the last page too fails whole).
TEST(PageReservationTest, APoolTooSmallTakesNone) {
  MemoryOnlyBackend backend;
  KvBlockPool pool = NewPool(backend, 1);
  LayerKv first = Layer({});
  LayerKv second = Layer({});
  PageReservation pages;
  pages.Need(first, 1);
  pages.Need(second, 1);
  ExpectError(pages.Take(pool), absl::StatusCode::kResourceExhausted, "KV cache full",
              "two pages, one free");
  EXPECT_THAT(first.compressed_blocks, IsEmpty());
  EXPECT_THAT(second.compressed_blocks, IsEmpty());
  EXPECT_EQ(pool.free_blocks(), 1);
  pages.ReturnPages(pool);  // after a failed Take: nothing to give back
  EXPECT_EQ(pool.free_blocks(), 1);
}

// A launch that failed: ReturnPages detaches exactly the pages Take
// attached and frees them, so the layers and the pool are as before.
TEST(PageReservationTest, ReturnPagesLeavesLayersAndPoolAsBefore) {
  MemoryOnlyBackend backend;
  KvBlockPool pool = NewPool(backend, 8);
  absl::StatusOr<std::vector<int32_t>> held = pool.Allocate(1);
  ASSERT_TRUE(held.ok());
  LayerKv grown = Layer(*held);
  LayerKv fresh = Layer({});
  PageReservation pages;
  pages.Need(grown, 64 * 3);
  pages.Need(fresh, 10);
  ASSERT_TRUE(pages.Take(pool).ok());
  EXPECT_EQ(pool.used_blocks(), 4);
  pages.ReturnPages(pool);
  EXPECT_EQ(grown.compressed_blocks, *held);
  EXPECT_THAT(fresh.compressed_blocks, IsEmpty());
  EXPECT_EQ(pool.used_blocks(), 1);
  pages.ReturnPages(pool);  // once given back, nothing is left to give
  EXPECT_EQ(pool.used_blocks(), 1);
  EXPECT_EQ(grown.compressed_blocks, *held);
}

// Rows the layers' pages already hold need nothing: Take takes no page,
// however full the pool.
TEST(PageReservationTest, NothingMissingTakesNothing) {
  MemoryOnlyBackend backend;
  KvBlockPool pool = NewPool(backend, 2);
  absl::StatusOr<std::vector<int32_t>> held = pool.Allocate(2);
  ASSERT_TRUE(held.ok());
  LayerKv layer = Layer(*held);
  PageReservation pages;
  pages.Need(layer, 128);
  EXPECT_EQ(pages.missing(), 0);
  EXPECT_TRUE(pages.Take(pool).ok());
  EXPECT_EQ(layer.compressed_blocks, *held);
  pages.ReturnPages(pool);
  EXPECT_EQ(layer.compressed_blocks, *held);
  EXPECT_EQ(pool.free_blocks(), 0);
}

}  // namespace
}  // namespace mla

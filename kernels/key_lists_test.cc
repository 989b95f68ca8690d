#include "kernels/key_lists.h"

#include <chrono>
#include <thread>
#include <vector>

#include "gtest/gtest.h"
#include "kernels/cpu_backend.h"
#include "kernels/geometry.h"

namespace mla {
namespace {

constexpr int kWidth = 8;

// Four tokens of one batch over two page tables: an SWA ring of 4 pages
// (10..13) with a compressed table (20, 21), and a second SWA ring (30..33).
struct Batch {
  std::vector<int32_t> positions = {5, 300, 383, 2};
  std::vector<int32_t> pages = {10, 11, 12, 13, 20, 21, 30, 31, 32, 33};
  std::vector<int32_t> swa_table = {0, 0, 0, 6};
  std::vector<int32_t> compressed_table = {4, 4, 4, 10};
  // C4A with 3 top-k rows; C4A with 2; C128A; SWA-only.
  std::vector<int32_t> extra_rule = {3, 2, -128, 0};
  std::vector<int32_t> main_indices = std::vector<int32_t>(4 * kSwaWindow, 77);
  std::vector<int32_t> main_lengths = std::vector<int32_t>(4, 77);
  std::vector<int32_t> extra_indices = {5, -1, 70, 99, 99, 99, 99, 99,   // rows 5, pad, 70
                                        64, 0, 99, 99, 99, 99, 99, 99,   // rows 64, 0
                                        99, 99, 99, 99, 99, 99, 99, 99,  // C128A: written
                                        99, 99, 99, 99, 99, 99, 99, 99};
  std::vector<int32_t> extra_lengths = std::vector<int32_t>(4, 77);

  KeyListBuildParams params() {
    KeyListBuildParams p;
    p.num_tokens = 4;
    p.positions = positions.data();
    p.pages = pages.data();
    p.num_pages = static_cast<int64_t>(pages.size());
    p.swa_ring_pages = 4;
    p.swa_table = swa_table.data();
    p.compressed_table = compressed_table.data();
    p.extra_rule = extra_rule.data();
    p.main_indices = main_indices.data();
    p.main_lengths = main_lengths.data();
    p.extra_width = kWidth;
    p.extra_indices = extra_indices.data();
    p.extra_lengths = extra_lengths.data();
    return p;
  }
  const int32_t* main(int t) const { return main_indices.data() + t * kSwaWindow; }
  std::vector<int32_t> extra(int t) const {
    return {extra_indices.begin() + t * kWidth, extra_indices.begin() + (t + 1) * kWidth};
  }
};

void ExpectBuilt(const Batch& b) {
  // Position 5: rows 0..5 of the ring's first page, then -1.
  EXPECT_EQ(b.main_lengths[0], 6);
  for (int k = 0; k < kSwaWindow; ++k) EXPECT_EQ(b.main(0)[k], k <= 5 ? 10 * 64 + k : -1) << k;
  // Position 300: positions 173..300; 173..255 sit at ring rows 173..255
  // (pages 12 and 13), 256..300 at ring rows 0..44 (page 10).
  EXPECT_EQ(b.main_lengths[1], kSwaWindow);
  EXPECT_EQ(b.main(1)[0], 12 * 64 + 45);
  EXPECT_EQ(b.main(1)[255 - 173], 13 * 64 + 63);
  EXPECT_EQ(b.main(1)[256 - 173], 10 * 64 + 0);
  EXPECT_EQ(b.main(1)[kSwaWindow - 1], 10 * 64 + 44);
  EXPECT_EQ(b.main(3)[2], 30 * 64 + 2);
  EXPECT_EQ(b.main(3)[3], -1);
  // Top-k rows to slots (-1 stays), the rest -1; C128A: rows 0..2 visible
  // at position 383; SWA-only: none.
  EXPECT_EQ(b.extra(0), (std::vector<int32_t>{20 * 64 + 5, -1, 21 * 64 + 6, -1, -1, -1, -1, -1}));
  EXPECT_EQ(b.extra(1), (std::vector<int32_t>{21 * 64 + 0, 20 * 64 + 0, -1, -1, -1, -1, -1, -1}));
  EXPECT_EQ(b.extra(2),
            (std::vector<int32_t>{20 * 64, 20 * 64 + 1, 20 * 64 + 2, -1, -1, -1, -1, -1}));
  EXPECT_EQ(b.extra(3), std::vector<int32_t>(kWidth, -1));
  EXPECT_EQ(b.extra_lengths, (std::vector<int32_t>{3, 2, 3, 0}));
}

TEST(KeyListsTest, ListsFromPageTables) {
  Batch b;
  ASSERT_TRUE(BuildKeyListsOnHost(b.params()).ok());
  ExpectBuilt(b);
}

// The CPU backend builds them the same way (ComputeBackend's default).
TEST(KeyListsTest, TheCpuBackendBuildsTheSame) {
  Batch b;
  CpuBackend backend(1);
  ASSERT_TRUE(backend.BuildKeyLists(b.params()).ok());
  ExpectBuilt(b);
}

// Table writes set their entries before the lists read the tables; a write
// outside the tables is skipped.
TEST(KeyListsTest, TableWritesComeFirst) {
  Batch b;
  const std::vector<int32_t> pages = b.pages;
  b.pages[1] = 50;  // stale: the SWA ring's second page
  b.pages[5] = 51;  // stale: the compressed table's second page
  const std::vector<int32_t> at = {5, -1, 1, 10};
  const std::vector<int32_t> page = {21, 7, 11, 7};
  KeyListBuildParams p = b.params();
  p.num_table_writes = 4;
  p.table_write_at = at.data();
  p.table_write_page = page.data();
  ASSERT_TRUE(BuildKeyListsOnHost(p).ok());
  EXPECT_EQ(b.pages, pages);
  ExpectBuilt(b);
}

// A bad structure is InvalidArgument, with nothing written.
TEST(KeyListsTest, BadStructureWritesNothing) {
  const std::vector<int32_t> at = {0};
  for (int bad = 0; bad < 7; ++bad) {
    Batch b;
    KeyListBuildParams p = b.params();
    p.table_write_at = at.data();
    p.table_write_page = at.data();
    if (bad == 0) p.extra_width = -1;
    if (bad == 1) p.swa_ring_pages = 1;  // 64 rows cannot hold a window of 128
    if (bad == 2) p.pages = nullptr;
    if (bad == 3) p.num_tokens = -1;
    if (bad == 4) p.num_table_writes = -1;
    if (bad == 5) p.num_pages = -1;
    if (bad == 6) {
      p.num_table_writes = 1;
      p.table_write_page = nullptr;
    }
    EXPECT_EQ(BuildKeyListsOnHost(p).code(), absl::StatusCode::kInvalidArgument) << bad;
    EXPECT_EQ(b.main_lengths, std::vector<int32_t>(4, 77)) << bad;
    EXPECT_EQ(b.extra_indices[3], 99) << bad;
    EXPECT_EQ(b.pages[0], 10) << bad;
  }
}

// A backend whose work is done when it returns marks the host's clock.
TEST(KeyListsTest, HostMarksMeasureTheTimeBetweenThem) {
  CpuBackend backend(1);
  EXPECT_EQ(backend.MarkedMicros(0, 1), 0) << "marks not set";
  ASSERT_TRUE(backend.Mark(0).ok());
  std::this_thread::sleep_for(std::chrono::milliseconds(3));
  ASSERT_TRUE(backend.Mark(1).ok());
  EXPECT_GE(backend.MarkedMicros(0, 1), 3000);
  EXPECT_LT(backend.MarkedMicros(0, 1), 3e6);
  EXPECT_EQ(backend.Mark(ComputeBackend::kMaxMarks).code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(backend.MarkedMicros(-1, 1), 0);
  EXPECT_TRUE(backend.WaitForMark(1).ok()) << "the work before it is done";
  EXPECT_EQ(backend.WaitForMark(-1).code(), absl::StatusCode::kInvalidArgument);
}

}  // namespace
}  // namespace mla

// Tests of the rows staged for the pool (server/engine/row_insert.h), on
// host memory alone: where each row's bytes, position and slot land in a
// launch's packed arrays and in the device's copy of them, and rows from
// device memory noted for the device to copy instead.
#include "server/engine/row_insert.h"

#include <cstdint>
#include <optional>
#include <vector>

#include "gtest/gtest.h"
#include "kernels/backend.h"
#include "kernels/cache_format.h"
#include "kernels/geometry.h"
#include "proto/views.h"
#include "server/engine/device_copies.h"
#include "server/engine/packed_arrays.h"
#include "server/engine/session.h"
#include "server/engine/testing/memory_only_backend.h"
#include "server/engine/testing/rows.h"

namespace mla {
namespace {

using engine_testing::MemoryOnlyBackend;
using engine_testing::Rows;
using engine_testing::Tensor;

constexpr int64_t kRows = 7;

// A layer whose ring and pages are out of order, so that a slot computed
// from the wrong block shows.
LayerKv Layer() {
  LayerKv layer;
  layer.swa_blocks = {7, 3, 9, 1};
  layer.compressed_blocks = {4, 11};
  return layer;
}

// The staged arrays as the prologue reads them from the device's copy.
struct Staged {
  std::vector<int32_t> positions, slots;
  std::vector<uint16_t> rows;
};

Staged Read(const KvInsertParams& params) {
  Staged staged;
  staged.positions.assign(params.positions, params.positions + params.num_rows);
  staged.slots.assign(params.slots, params.slots + params.num_rows);
  staged.rows.assign(params.rows, params.rows + params.num_rows * kHeadDim);
  return staged;
}

std::vector<uint16_t> RowsOf(const std::vector<uint16_t>& rows, int64_t from, int64_t count) {
  return {rows.begin() + from * kHeadDim, rows.begin() + (from + count) * kHeadDim};
}

// SWA rows at their ring slots and positions, compressed rows at their
// pages' slots and at position row * ratio, their bytes copied across the
// pieces of the request's tensors; indices no row was added at keep their
// fill (position 0, slot -1: written nowhere, zero bytes). The device's
// copy of the packed arrays holds the same where Params points.
TEST(RowInsertTest, RowsLandAtTheirSlotsAndPositions) {
  PackedArrays packed;
  packed.Reserve<int32_t>(3, 0);  // an array of another stage before the rows
  RowInsert insert(packed, kRows);
  std::vector<uint8_t> host(packed.bytes(), 0xee);
  packed.UseMemory(host.data());
  insert.Open(packed);

  const LayerKv layer = Layer();
  const std::vector<uint16_t> swa = Rows(1, 5);
  const std::vector<uint16_t> compressed = Rows(2, 2);
  const std::optional<wire::TensorView> swa_kv = Tensor(wire::DType::kBf16, {5, kHeadDim}, swa, 11);
  const std::optional<wire::TensorView> compressed_kv =
      Tensor(wire::DType::kBf16, {2, kHeadDim}, compressed, 12);
  ASSERT_GT(swa_kv->pieces.size(), 1u) << "the rows should cross pieces";
  // Positions 254..256 (the ring wraps at 256) from rows 2..4 of swa_kv.
  insert.AddSwa(1, swa_kv, 2, layer, 254, 3);
  // C4A rows 63 and 64 (a second page) at positions 252 and 256.
  insert.AddCompressed(4, compressed_kv, 0, layer, 63, 2, 4);
  // A tensor the request lacks adds no rows.
  insert.AddCompressed(6, std::nullopt, 0, layer, 65, 0, 4);

  std::vector<uint8_t> device(host);  // the upload
  const CachePoolView pool{nullptr, 12};
  const KvInsertParams params = insert.Params(device.data(), pool);
  EXPECT_EQ(params.num_rows, kRows);
  EXPECT_EQ(params.pool.num_blocks, 12);
  const Staged staged = Read(params);
  EXPECT_EQ(staged.positions, (std::vector<int32_t>{0, 254, 255, 256, 252, 256, 0}));
  EXPECT_EQ(staged.slots, (std::vector<int32_t>{-1, 1 * 64 + 62, 1 * 64 + 63, 7 * 64 + 0,
                                                4 * 64 + 63, 11 * 64 + 0, -1}));
  EXPECT_EQ(RowsOf(staged.rows, 1, 3), RowsOf(swa, 2, 3));
  EXPECT_EQ(RowsOf(staged.rows, 4, 2), compressed);
  for (int64_t unused : {0, 6}) {
    EXPECT_EQ(RowsOf(staged.rows, unused, 1), std::vector<uint16_t>(kHeadDim, 0)) << unused;
  }
}

// Rows in device memory (a CUDA IPC region) are not read by the host: the
// staging keeps its fill there, and the copy noted for the device puts
// them at their index once the staging is uploaded.
TEST(RowInsertTest, RowsInDeviceMemoryAreCopiedOnTheDevice) {
  PackedArrays packed;
  DeviceCopies device_copies;
  RowInsert insert(packed, 3, &device_copies);
  std::vector<uint8_t> host(packed.bytes());
  packed.UseMemory(host.data());
  insert.Open(packed);

  const LayerKv layer = Layer();
  const std::vector<uint16_t> region = Rows(3, 4);
  std::optional<wire::TensorView> kv = wire::MakeTensorView(
      wire::DType::kBf16, {4, kHeadDim}, region.data(), region.size() * 2, nullptr);
  kv->device = true;
  insert.AddSwa(1, kv, 1, layer, 10, 2);

  std::vector<uint8_t> device(host);
  const KvInsertParams params = insert.Params(device.data(), CachePoolView{nullptr, 12});
  EXPECT_EQ(RowsOf(Read(params).rows, 1, 2), std::vector<uint16_t>(2 * kHeadDim, 0))
      << "the host staged rows it may not read";
  MemoryOnlyBackend backend;
  ASSERT_TRUE(device_copies.Queue(backend, device.data()).ok());
  const Staged staged = Read(params);
  EXPECT_EQ(RowsOf(staged.rows, 1, 2), RowsOf(region, 1, 2));
  EXPECT_EQ(RowsOf(staged.rows, 0, 1), std::vector<uint16_t>(kHeadDim, 0));
  EXPECT_EQ(staged.positions, (std::vector<int32_t>{0, 10, 11}));
  EXPECT_EQ(staged.slots, (std::vector<int32_t>{-1, 7 * 64 + 10, 7 * 64 + 11}));
}

}  // namespace
}  // namespace mla

#include "server/engine/row_insert.h"

#include "kernels/geometry.h"

namespace mla {

RowInsert::RowInsert(PackedArrays& packed, int64_t rows, DeviceCopies* device_copies)
    : positions_place_(packed.Reserve<int32_t>(rows, 0)),
      slots_place_(packed.Reserve<int32_t>(rows, -1)),
      rows_place_(packed.Reserve<uint8_t>(rows * kRowBytes, 0)),
      device_copies_(device_copies) {}

void RowInsert::Open(PackedArrays& packed) {
  positions_ = packed.Array(positions_place_);
  slots_ = packed.Array(slots_place_);
  rows_ = packed.Array(rows_place_);
}

void RowInsert::CopyRows(int64_t at, const std::optional<wire::TensorView>& src, int64_t src_row,
                         int32_t count) {
  if (count == 0) return;
  const int64_t bytes = int64_t{count} * kRowBytes;
  if (src->device) {
    // One piece (a region's bytes), not empty: it holds these rows.
    device_copies_->Add(rows_place_.at + at * kRowBytes,
                        src->pieces.front().data() + src_row * kRowBytes, bytes);
    return;
  }
  src->CopyRange(src_row * kRowBytes, bytes, rows_.data() + at * kRowBytes);
}

void RowInsert::AddSwa(int64_t at, const std::optional<wire::TensorView>& src, int64_t src_row,
                       const LayerKv& layer, int32_t first_position, int32_t count) {
  CopyRows(at, src, src_row, count);
  for (int32_t i = 0; i < count; ++i) {
    positions_[at + i] = first_position + i;
    slots_[at + i] = layer.SwaSlot(first_position + i);
  }
}

void RowInsert::AddCompressed(int64_t at, const std::optional<wire::TensorView>& src,
                              int64_t src_row, const LayerKv& layer, int32_t first_row,
                              int32_t count, int ratio) {
  CopyRows(at, src, src_row, count);
  for (int32_t i = 0; i < count; ++i) {
    positions_[at + i] = (first_row + i) * ratio;
    slots_[at + i] = layer.CompressedSlot(first_row + i);
  }
}

KvInsertParams RowInsert::Params(uint8_t* device, CachePoolView pool) const {
  return {positions_place_.count,
          reinterpret_cast<const uint16_t*>(PackedArrays::In(device, rows_place_)),
          PackedArrays::In(device, positions_place_), PackedArrays::In(device, slots_place_),
          pool};
}

}  // namespace mla

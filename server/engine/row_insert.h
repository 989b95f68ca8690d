// Rows bound for the KV pool in one prologue (spec section 4: each row is
// rotated at its position, rounded to bf16, quantised and written at its
// slot): their bf16 bytes, RoPE positions and global slots, as three arrays
// of a launch's PackedArrays. The one way the server stages rows for the
// pool: an Attend launch stages its messages' new compressed rows with it,
// an AppendKV its SWA and compressed rows.
//
// Construct before the PackedArrays get their memory (it reserves the
// arrays), Open() after, then add the rows at the indices the caller
// assigns, each of 0..rows()-1 once. The RowInsert points into the
// PackedArrays, which must outlive it; the rows are copied out of the
// request's tensors when added (a tensor the request lacks may add no rows),
// or, from a tensor in device memory, noted in `device_copies` (which must
// outlive the RowInsert) for the device to copy after the upload.
// Adds to disjoint indices may run on several threads at once.
#ifndef MLA_OFFLOAD_SERVER_ENGINE_ROW_INSERT_H_
#define MLA_OFFLOAD_SERVER_ENGINE_ROW_INSERT_H_

#include <cstdint>
#include <optional>

#include "absl/types/span.h"
#include "kernels/backend.h"
#include "kernels/cache_format.h"
#include "proto/views.h"
#include "server/engine/device_copies.h"
#include "server/engine/packed_arrays.h"
#include "server/engine/requests.h"
#include "server/engine/session.h"

namespace mla {

class RowInsert {
 public:
  // Reserves room for `rows` rows in `packed`; rows from device memory go
  // to `device_copies` (null: none may come from there).
  RowInsert(PackedArrays& packed, int64_t rows, DeviceCopies* device_copies = nullptr);
  // Takes the arrays from `packed`, once it is allocated.
  void Open(PackedArrays& packed);

  // Rows src_row.. of `src` ([*, 512] bf16) are the SWA rows of positions
  // first_position.. of `layer`; they go to indices at..at+count-1.
  void AddSwa(int64_t at, const std::optional<wire::TensorView>& src, int64_t src_row,
              const LayerKv& layer, int32_t first_position, int32_t count);
  // Rows src_row.. of `src` are compressed rows first_row.. of `layer`, whose
  // compress ratio is `ratio` (row j sits at position j * ratio).
  void AddCompressed(int64_t at, const std::optional<wire::TensorView>& src, int64_t src_row,
                     const LayerKv& layer, int32_t first_row, int32_t count, int ratio);

  // The prologue's view of the rows in `device`, the device's copy of the
  // PackedArrays.
  KvInsertParams Params(uint8_t* device, CachePoolView pool) const;

 private:
  // Copies `count` rows of `src` from row `src_row` on to index `at`.
  void CopyRows(int64_t at, const std::optional<wire::TensorView>& src, int64_t src_row,
                int32_t count);

  PackedArrays::Place<int32_t> positions_place_;
  PackedArrays::Place<int32_t> slots_place_;
  PackedArrays::Place<uint8_t> rows_place_;
  DeviceCopies* device_copies_;
  absl::Span<int32_t> positions_;
  absl::Span<int32_t> slots_;
  absl::Span<uint8_t> rows_;
};

}  // namespace mla

#endif  // MLA_OFFLOAD_SERVER_ENGINE_ROW_INSERT_H_

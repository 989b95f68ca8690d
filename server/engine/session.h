// One session: the KV cache of one sequence for every attention layer of one
// model, and what the server needs to attend over it.
//
// Per layer a session holds a ring of SWA rows (the row of position p sits at
// ring index p % kSwaRingRows) and, for C4A/C128A layers,
// pages of compressed rows (row j at page j / 64, offset j % 64). Positions
// below next_position have their SWA row inserted; compressed rows below
// compressed_rows exist. A Session is plain data owned by the engine thread.
#ifndef MLA_OFFLOAD_SERVER_ENGINE_SESSION_H_
#define MLA_OFFLOAD_SERVER_ENGINE_SESSION_H_

#include <cstdint>
#include <string>
#include <vector>

#include "absl/time/time.h"
#include "kernels/geometry.h"
#include "kernels/model_profile.h"

namespace mla {

// The SWA ring holds 256 rows (4 blocks): a message may carry up to
// kMaxSegmentTokens consecutive positions of one session, and its first token
// still needs the 127 rows before it after the last token's row is written.
inline constexpr int kSwaRingBlocks = 4;
inline constexpr int kSwaRingRows = kSwaRingBlocks * kBlockTokens;   // 256
inline constexpr int kMaxSegmentTokens = kSwaRingRows - kSwaWindow + 1;  // 129

// Where a layer's page table sits in the launcher's table space in backend
// memory (server/engine/block_tables.h): `capacity` entries from `at`, of which the
// first `confirmed` are known to hold the layer's pages; valid only in
// `generation` of the space.
struct TablePlacement {
  int64_t generation = -1;
  int32_t at = 0;
  int32_t capacity = 0;
  int32_t confirmed = 0;
};

struct LayerKv {
  int32_t next_position = 0;
  int32_t compressed_rows = 0;
  std::vector<int32_t> swa_blocks;         // kSwaRingBlocks
  std::vector<int32_t> compressed_blocks;  // ceil(compressed_rows / 64) or more
  TablePlacement table;

  // Global slot of the SWA row of `position` (one of the last 256 written).
  int32_t SwaSlot(int32_t position) const {
    const int32_t ring = position % kSwaRingRows;
    return swa_blocks[ring / kBlockTokens] * kBlockTokens + ring % kBlockTokens;
  }
  // Global slot of compressed row `row`; its page must exist.
  int32_t CompressedSlot(int32_t row) const {
    return compressed_blocks[row / kBlockTokens] * kBlockTokens + row % kBlockTokens;
  }
};

struct Session {
  std::string id;
  const ModelProfile* profile = nullptr;
  int num_heads = 0;     // H each rank sends
  int padded_heads = 0;  // Hp the kernels run at
  // Sink logits, [layers, sink_heads] row-major; empty = no sinks. sink_heads
  // is h_total (whole model: ranks pick their slice by head offset) or H (one
  // slice shared by every rank).
  std::vector<float> sinks;
  int sink_heads = 0;
  absl::Duration idle_ttl;
  absl::Time last_used;
  std::vector<LayerKv> layers;

  // Sink of head `h` (0..H-1) of a rank whose first head is `head_offset`.
  float Sink(int layer, int head_offset, int h) const;
  // Blocks the session holds, all layers.
  int64_t blocks() const;
  // The lowest next position over the layers: every layer has at least it.
  int32_t next_position() const;
  // All blocks, for freeing.
  std::vector<int32_t> AllBlocks() const;
};

// Compressed pages needed to hold `rows` rows.
inline int64_t PagesFor(int64_t rows) { return (rows + kBlockTokens - 1) / kBlockTokens; }

}  // namespace mla

#endif  // MLA_OFFLOAD_SERVER_ENGINE_SESSION_H_

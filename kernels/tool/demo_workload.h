// A random decode step of one V4 layer, shaped as a server sees it, for the
// kernel tool's demo.
//
// `batch` sequences each decode one new token at a position drawn from the
// last quarter of [0, context). Each sequence owns a ring of kSwaWindow SWA
// slots and, in a C4A/C128A layer, one slot per compressed row j < (p+1)/r
// (r the compress ratio); blocks are handed out in a random order, as a paged
// allocator would. The history (the sequence's earlier SWA rows and all its
// compressed rows) is inserted before the step; the step's prologue inserts
// the new token's SWA row. Keys: the last kSwaWindow positions (main list,
// -1 where the position would be negative) plus, in a C4A layer, top-k
// compressed rows chosen at random (the indexer's min((p+1)/4, top-k) valid
// entries, -1 padded), or in a C128A layer every compressed row. Values are
// random normals (spec section 7: never zeros), rounded to bf16.
#ifndef MLA_OFFLOAD_KERNELS_TOOL_DEMO_WORKLOAD_H_
#define MLA_OFFLOAD_KERNELS_TOOL_DEMO_WORKLOAD_H_

#include <cstdint>
#include <vector>

#include "kernels/tool/layer_config.h"
#include "kernels/tool/staging.h"

namespace mla {

struct WorkloadShape {
  LayerConfig layer;
  int num_heads = 0;  // H per rank
  int64_t batch = 0;
  int64_t context = 0;
  uint64_t seed = 0;
};

// Rows of one insert, owned.
struct OwnedInsert {
  std::vector<uint16_t> rows;      // [R, 512] bf16
  std::vector<int32_t> positions;  // [R]
  std::vector<int32_t> slots;      // [R]

  HostInsert view() const { return {rows, positions, slots}; }
};

struct DemoWorkload {
  WorkloadShape shape;
  int64_t swa_blocks = 0;
  int64_t compressed_blocks = 0;
  int64_t rope_rows = 0;  // positions [0, rope_rows) cover every row

  // Inserted before the step.
  OwnedInsert history_swa;
  OwnedInsert history_compressed;

  // The step's prologue.
  std::vector<uint16_t> q;         // [N, H, 512]
  std::vector<int32_t> positions;  // [N]
  OwnedInsert new_swa;             // one row per token

  // The step's decode.
  std::vector<float> sinks;  // [H]
  int main_width = 0;
  std::vector<int32_t> main_indices;   // [N, main_width]
  int extra_width = 0;                 // 0 in SWA-only layers
  std::vector<int32_t> extra_indices;  // [N, extra_width]
  std::vector<int32_t> extra_lengths;  // [N]
  int64_t keys_read = 0;               // valid key entries over all tokens

  HostPrologue HistoryPrologue() const;
  HostPrologue StepPrologue() const;
  // `q_out` is the step prologue's output.
  HostDecode StepDecode(absl::Span<const uint16_t> q_out, int padded_heads, bool derotate) const;
};

DemoWorkload MakeDemoWorkload(const WorkloadShape& shape);

}  // namespace mla

#endif  // MLA_OFFLOAD_KERNELS_TOOL_DEMO_WORKLOAD_H_

// The random-row gather ceiling of the decode benchmark: how fast one GPU
// reads MODEL1 cache rows (576 data bytes and the 8 scale bytes, at random
// slots of a pool) when nothing else is done with them, and how that rate
// depends on how many rows are in flight an SM and from how many warps.
#ifndef MLA_OFFLOAD_KERNELS_BENCH_GATHER_CEILING_H_
#define MLA_OFFLOAD_KERNELS_BENCH_GATHER_CEILING_H_

#include <cuda_runtime_api.h>

#include <cstdint>

namespace mla {

// How a gather is spread over the GPU: CTAs an SM (the grid is that many per
// SM), threads a CTA, rows a warp requests before using any (4, 8 or 16), and
// dynamic shared memory a CTA holds without using it (it takes its share of
// the SM's L1, as a decode CTA's shared memory does). Rows in flight an SM:
// ctas_per_sm * threads / 32 * rows_per_warp.
struct GatherShape {
  int ctas_per_sm = 8;
  int threads = 256;
  int rows_per_warp = 4;
  int smem_bytes = 0;
  // When > 0: the copy engine gathers instead (bulk copies into shared
  // memory, 64 rows a stage, this many stages in flight a group of threads,
  // in bulk_groups independent groups a CTA; threads is bulk_groups times
  // 64, 128 or 256; rows_per_warp and smem_bytes unused).
  int bulk_stages = 0;
  int bulk_groups = 1;
};

// Reads the rows at `slots[0..rows)` of the paged pool (MODEL1 blocks of 64
// tokens), a warp a row (lanes 0..31 the first 512 data bytes, lanes 0..3
// the other 64, lane 4 the scales), and folds them into one value written to
// *sink only if it matches a pattern (so the reads cannot be dropped).
// Enqueued on `stream`. The ceiling is the default shape: every SM full of
// warps. cudaErrorInvalidValue for a rows_per_warp other than 4, 8 or 16
// (without bulk_stages), or for threads and bulk_groups that do not fit.
cudaError_t LaunchGatherRows(const uint8_t* pool, const int32_t* slots, int64_t rows,
                             uint32_t* sink, int num_sms, const GatherShape& shape,
                             cudaStream_t stream);

}  // namespace mla

#endif  // MLA_OFFLOAD_KERNELS_BENCH_GATHER_CEILING_H_

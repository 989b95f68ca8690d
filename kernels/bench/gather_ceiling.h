// The random-row gather ceiling of the decode benchmark: how fast one GPU
// reads MODEL1 cache rows (576 data bytes and the 8 scale bytes, at random
// slots of a pool) when nothing else is done with them.
#ifndef MLA_OFFLOAD_KERNELS_BENCH_GATHER_CEILING_H_
#define MLA_OFFLOAD_KERNELS_BENCH_GATHER_CEILING_H_

#include <cuda_runtime_api.h>

#include <cstdint>

namespace mla {

// Reads the rows at `slots[0..rows)` of the paged pool (MODEL1 blocks of 64
// tokens) with every SM full of warps, four rows in flight a warp, and folds
// them into one value written to *sink only if it matches a pattern (so the
// reads cannot be dropped). Enqueued on `stream`.
cudaError_t LaunchGatherRows(const uint8_t* pool, const int32_t* slots, int64_t rows,
                             uint32_t* sink, int num_sms, cudaStream_t stream);

}  // namespace mla

#endif  // MLA_OFFLOAD_KERNELS_BENCH_GATHER_CEILING_H_

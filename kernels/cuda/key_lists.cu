// The key lists of a decode batch built on the GPU (KeyListBuildParams in
// kernels/backend.h; kernels/key_lists.cc is the host's version and the
// reference). The table writes first, in a kernel of their own; then one
// CTA a token, each thread writing entries of its main and extra rows. A
// C4A token's extra row holds top-k rows on entry: each entry is read and
// rewritten by the same thread. The pages and rows are the caller's
// contract (the server built the tables from its sessions and checked the
// top-k). Integer work only: the lists are bit-identical to the host's.
#include <cstdint>

#include "kernels/cuda/kernels.h"
#include "kernels/geometry.h"

namespace mla {
namespace cuda {
namespace {

constexpr int kThreads = 128;

__device__ __forceinline__ int32_t SlotOf(const int32_t* table, int32_t row) {
  return table[row / kBlockTokens] * kBlockTokens + row % kBlockTokens;
}

__global__ void __launch_bounds__(kThreads) KeyListKernel(KeyListBuildParams params) {
  const int64_t t = blockIdx.x;
  const int32_t p = params.positions[t];
  const int32_t first = p - kSwaWindow + 1 > 0 ? p - kSwaWindow + 1 : 0;
  const int32_t ring_rows = params.swa_ring_pages * kBlockTokens;
  const int32_t* swa = params.pages + params.swa_table[t];
  int32_t* main = params.main_indices + t * kSwaWindow;
  for (int k = threadIdx.x; k < kSwaWindow; k += kThreads) {
    const int32_t w = first + k;
    main[k] = w <= p ? SlotOf(swa, w % ring_rows) : -1;
  }
  const int32_t rule = params.extra_rule[t];
  const int32_t length = rule > 0 ? rule : rule < 0 ? (p + 1) / -rule : 0;
  const int32_t* compressed = params.pages + params.compressed_table[t];
  int32_t* extra = params.extra_indices + t * params.extra_width;
  for (int k = threadIdx.x; k < params.extra_width; k += kThreads) {
    int32_t slot = -1;
    if (k < length) {
      const int32_t row = rule > 0 ? extra[k] : k;
      if (row >= 0) slot = SlotOf(compressed, row);
    }
    extra[k] = slot;
  }
  if (threadIdx.x == 0) {
    params.main_lengths[t] = p - first + 1;
    params.extra_lengths[t] = length;
  }
}

// The table writes, one a thread, before the lists read the tables.
__global__ void __launch_bounds__(kThreads) TableWriteKernel(KeyListBuildParams params) {
  const int64_t i = int64_t{blockIdx.x} * kThreads + threadIdx.x;
  if (i >= params.num_table_writes) return;
  const int32_t at = params.table_write_at[i];
  if (at >= 0 && at < params.num_pages) params.pages[at] = params.table_write_page[i];
}

}  // namespace

cudaError_t LaunchKeyLists(const KeyListBuildParams& params, cudaStream_t stream) {
  if (params.num_table_writes > 0) {
    const int64_t blocks = (params.num_table_writes + kThreads - 1) / kThreads;
    TableWriteKernel<<<static_cast<unsigned>(blocks), kThreads, 0, stream>>>(params);
    if (cudaError_t error = cudaGetLastError(); error != cudaSuccess) return error;
  }
  if (params.num_tokens == 0) return cudaSuccess;
  KeyListKernel<<<static_cast<unsigned>(params.num_tokens), kThreads, 0, stream>>>(params);
  return cudaGetLastError();
}

}  // namespace cuda
}  // namespace mla

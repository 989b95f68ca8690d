#include "kernels/bench/gather_ceiling.h"

#include "kernels/geometry.h"

namespace mla {
namespace {

constexpr int kPieces = kTokenDataBytes / 16;  // 36 16-byte pieces of row data

template <int kRowsInFlight>
__global__ void GatherRowsKernel(const uint8_t* pool, const int32_t* slots, int64_t rows,
                                 uint32_t* sink) {
  const int lane = threadIdx.x & 31;
  const int64_t warp = (static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x) >> 5;
  const int64_t warps = (static_cast<int64_t>(gridDim.x) * blockDim.x) >> 5;
  uint32_t folded = 0;
  for (int64_t first = warp * kRowsInFlight; first < rows; first += warps * kRowsInFlight) {
    uint4 low[kRowsInFlight], high[kRowsInFlight];
#pragma unroll
    for (int k = 0; k < kRowsInFlight; ++k) {
      low[k] = high[k] = make_uint4(0, 0, 0, 0);
      if (first + k >= rows) continue;
      const int32_t slot = __ldg(slots + first + k);
      const uint8_t* block = pool + static_cast<int64_t>(slot / kBlockTokens) * kBlockBytes;
      const uint4* data = reinterpret_cast<const uint4*>(block + (slot % kBlockTokens) * kTokenDataBytes);
      low[k] = __ldg(data + lane);  // pieces 0..31
      if (lane < kPieces - 32) {
        high[k] = __ldg(data + 32 + lane);  // pieces 32..35
      } else if (lane == kPieces - 32) {  // the scales
        const uint2 scales = __ldg(reinterpret_cast<const uint2*>(
            block + kBlockTokens * kTokenDataBytes + (slot % kBlockTokens) * kTokenScaleBytes));
        high[k] = make_uint4(scales.x, scales.y, 0, 0);
      }
    }
#pragma unroll
    for (int k = 0; k < kRowsInFlight; ++k) {
      folded ^= low[k].x ^ low[k].y ^ low[k].z ^ low[k].w ^ high[k].x ^ high[k].y ^ high[k].z ^
                high[k].w;
    }
  }
  if (folded == 0x9e3779b9u) *sink = folded;
}

// The same rows copied into shared memory by the copy engine (TMA): a bulk
// copy of a row's 576 data bytes (or of a part of them: `row_threads`
// threads a row) and one of the 16 bytes that hold its 8 scale bytes, 64
// rows a stage, `stages` stages in flight a group, each completing on its own
// mbarrier. A CTA is `groups` groups of 64 * row_threads threads that share
// nothing but the SM: each waits for its own stages in order and syncs on its
// own named barrier, as if it were a CTA of its own. Rows in flight a CTA:
// 64 * stages * groups.
constexpr int kBulkStageRows = 64;
constexpr int kBulkRowBytes = kTokenDataBytes + 16;
constexpr int kBulkStageBytes = kBulkStageRows * kBulkRowBytes;

__device__ __forceinline__ uint32_t SharedAddressOf(const void* pointer) {
  return static_cast<uint32_t>(__cvta_generic_to_shared(pointer));
}
__device__ __forceinline__ void BulkCopy(uint32_t dst, const void* src, uint32_t bytes,
                                         uint32_t bar) {
  asm volatile(
      "cp.async.bulk.shared::cluster.global.mbarrier::complete_tx::bytes [%0], [%1], %2, [%3];\n" ::"r"(dst),
      "l"(src), "r"(bytes), "r"(bar)
      : "memory");
}

// The slot of the row that thread t (of its group) sends in batch `batch`
// (-1: past the end).
__device__ __forceinline__ int32_t BulkSlot(const int32_t* slots, int64_t rows, int64_t batch,
                                            int t, int row_threads) {
  const int64_t row = batch * kBulkStageRows + t / row_threads;
  return row < rows ? __ldg(slots + row) : -1;
}

// `row_threads` threads (1, 2 or 4) send a row of a batch into stage
// `stage`: each a 576 / row_threads-byte part of its data, the first also
// the 16 bytes that hold its scales.
__device__ __forceinline__ void IssueBulkRow(const uint8_t* pool, int32_t slot, int t,
                                             int row_threads, uint32_t stage, uint32_t bar) {
  const int part = t % row_threads;
  const uint32_t bytes = kTokenDataBytes / row_threads;
  const uint32_t expect = slot == -1 ? 0 : bytes + (part == 0 ? 16 : 0);
  asm volatile(
      "{\n.reg .b64 state;\nmbarrier.arrive.expect_tx.shared::cta.b64 state, [%0], %1;\n}\n" ::"r"(bar),
      "r"(expect)
      : "memory");
  if (slot == -1) return;
  const uint8_t* block = pool + static_cast<int64_t>(slot / kBlockTokens) * kBlockBytes;
  const int token = slot % kBlockTokens;
  const uint32_t dst = stage + (t / row_threads) * kBulkRowBytes;
  BulkCopy(dst + part * bytes, block + token * kTokenDataBytes + part * bytes, bytes, bar);
  if (part == 0) {
    BulkCopy(dst + kTokenDataBytes,
             block + kBlockTokens * kTokenDataBytes + (token & ~1) * kTokenScaleBytes, 16, bar);
  }
}

// Threads: groups * 64 * row_threads.
__global__ void GatherRowsBulkKernel(const uint8_t* pool, const int32_t* slots, int64_t rows,
                                     uint32_t* sink, int stages, int groups) {
  extern __shared__ __align__(128) unsigned char smem[];
  const int group_threads = blockDim.x / groups;
  const int group = threadIdx.x / group_threads;
  const int t = threadIdx.x % group_threads;
  const int row_threads = group_threads / kBulkStageRows;
  const int group_bytes = stages * kBulkStageBytes;
  uint64_t* bars = reinterpret_cast<uint64_t*>(smem + groups * group_bytes) + group * stages;
  const uint32_t base = SharedAddressOf(smem) + group * group_bytes;
  if (t < stages) {
    asm volatile("mbarrier.init.shared::cta.b64 [%0], %1;\n" ::"r"(SharedAddressOf(bars + t)),
                 "r"(group_threads)
                 : "memory");
  }
  asm volatile("fence.mbarrier_init.release.cluster;\n" ::: "memory");
  __syncthreads();
  // The group's batches: those of CTA number `me` of `ctas`.
  const int64_t me = static_cast<int64_t>(blockIdx.x) * groups + group;
  const int64_t ctas = static_cast<int64_t>(gridDim.x) * groups;
  const int64_t batches = (rows + kBulkStageRows - 1) / kBulkStageRows;
  for (int s = 0; s < stages; ++s) {
    const int64_t batch = me + s * ctas;
    if (batch < batches) {
      IssueBulkRow(pool, BulkSlot(slots, rows, batch, t, row_threads), t, row_threads,
                   base + s * kBulkStageBytes, SharedAddressOf(bars + s));
    }
  }
  // The slot of the next refill, loaded a stage ahead.
  int32_t next_slot = BulkSlot(slots, rows, me + stages * ctas, t, row_threads);
  uint32_t folded = 0;
  for (int64_t i = 0;; ++i) {
    const int64_t batch = me + i * ctas;
    if (batch >= batches) break;
    const int s = static_cast<int>(i % stages);
    const uint32_t parity = static_cast<uint32_t>((i / stages) & 1);
    const uint32_t bar = SharedAddressOf(bars + s);
    asm volatile(
        "{\n.reg .pred done;\nbulk_wait:\n"
        "mbarrier.try_wait.parity.shared::cta.b64 done, [%0], %1;\n"
        "@!done bra bulk_wait;\n}\n" ::"r"(bar),
        "r"(parity)
        : "memory");
    const uint4 piece = *reinterpret_cast<const uint4*>(
        smem + group * group_bytes + s * kBulkStageBytes + (t / row_threads) * kBulkRowBytes +
        16 * (t % row_threads));
    folded ^= piece.x ^ piece.w;
    // Every read of the stage before the copy engine refills it.
    asm volatile("bar.sync %0, %1;\n" ::"r"(1 + group), "r"(group_threads) : "memory");
    const int64_t next = batch + stages * ctas;
    if (next < batches) {
      asm volatile("fence.proxy.async.shared::cta;\n" ::: "memory");
      IssueBulkRow(pool, next_slot, t, row_threads, base + s * kBulkStageBytes, bar);
      next_slot = BulkSlot(slots, rows, next + ctas, t, row_threads);
    }
  }
  if (folded == 0x9e3779b9u) *sink = folded;
}

template <int kRowsInFlight>
cudaError_t Launch(const uint8_t* pool, const int32_t* slots, int64_t rows, uint32_t* sink,
                   int num_sms, const GatherShape& shape, cudaStream_t stream) {
  const cudaError_t error =
      cudaFuncSetAttribute(GatherRowsKernel<kRowsInFlight>,
                           cudaFuncAttributeMaxDynamicSharedMemorySize, shape.smem_bytes);
  if (error != cudaSuccess) return error;
  GatherRowsKernel<kRowsInFlight><<<num_sms * shape.ctas_per_sm, shape.threads, shape.smem_bytes,
                                    stream>>>(pool, slots, rows, sink);
  return cudaGetLastError();
}

}  // namespace

cudaError_t LaunchGatherRows(const uint8_t* pool, const int32_t* slots, int64_t rows,
                             uint32_t* sink, int num_sms, const GatherShape& shape,
                             cudaStream_t stream) {
  if (shape.bulk_stages > 0) {
    const int groups = shape.bulk_groups;
    const int row_threads = groups > 0 ? shape.threads / groups / kBulkStageRows : 0;
    if (groups < 1 || groups > 4 || shape.threads != groups * kBulkStageRows * row_threads ||
        (row_threads != 1 && row_threads != 2 && row_threads != 4)) {
      return cudaErrorInvalidValue;
    }
    const int smem = groups * shape.bulk_stages * (kBulkStageBytes + 8);
    const cudaError_t error = cudaFuncSetAttribute(
        GatherRowsBulkKernel, cudaFuncAttributeMaxDynamicSharedMemorySize, smem);
    if (error != cudaSuccess) return error;
    GatherRowsBulkKernel<<<num_sms * shape.ctas_per_sm, shape.threads, smem, stream>>>(
        pool, slots, rows, sink, shape.bulk_stages, groups);
    return cudaGetLastError();
  }
  switch (shape.rows_per_warp) {
    case 4:
      return Launch<4>(pool, slots, rows, sink, num_sms, shape, stream);
    case 8:
      return Launch<8>(pool, slots, rows, sink, num_sms, shape, stream);
    case 16:
      return Launch<16>(pool, slots, rows, sink, num_sms, shape, stream);
    default:
      return cudaErrorInvalidValue;
  }
}

}  // namespace mla

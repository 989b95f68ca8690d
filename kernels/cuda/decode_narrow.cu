// Sparse MLA decode (spec section 5) for Hp <= 32 heads with warpgroup MMA,
// the heads as the MMA's N instead of padded to its 64 rows:
//   S^T = K Q^T      M = the chunk's 64 keys, N = Hp, K = 512 dims;
//   O^T += V^T P^T   M = 64 dims (8 tiles), N = Hp, K = the chunk's keys.
// decode_wgmma.cu's kernel pads such Hp to 64 MMA rows, so its consumers do
// the work of 64 heads a chunk whatever Hp is and set the chunk's period
// (RESULTS.md); here S^T and O^T cost Hp / 64 of that and one warpgroup holds
// all of O^T (4 Hp registers a thread).
// The default decode kernel for Hp <= 32 (decode_kernels.h); faster than
// decode_wgmma.cu's padded one at every such shape of the benchmark
// (kernels/bench/RESULTS.md).
//
// One CTA per token (and split of its keys), five warpgroups (three at N = 24 and 32):
//   WG0, the consumer: Q into shared memory at the start; per 64-key chunk
//     S^T from the key tile and Q, the online softmax of each head over the
//     chunk's keys (maxima across the four warps through shared memory), P^T
//     (bf16) into shared memory, O^T = O^T * alpha + V^T P^T with V^T the
//     key tile read MN-major; at the end the output, staged in shared memory
//     and written by a rolled loop.
//   WG1..WG4, two groups of the producers of decode_wgmma.cu's kernel
//     (Produce in wgmma_device.cuh): WG1 and WG2 fill the even chunks into
//     the first key tile, WG3 and WG4 the odd ones into the second, so that
//     two chunks' loads are in flight (eight more warps issuing them than in
//     decode_wgmma.cu: what the gather sweep of RESULTS.md says pays). At
//     N = 24 and 32 WG1 and WG2 fill both tiles (NarrowShape), with the next
//     chunk's rows on their way into a raw chunk in shared memory
//     (ProduceRing), so that two chunks' loads are in flight there too; at
//     N = 8 and 16 both groups do so where a CTA has many chunks
//     (NarrowUsesRing: the kernel's kRing).
//     Their row loads skip L1 (RowCaching::kNoL1), which that kernel's do
//     not.
// WG0's warps meet at named barrier 1 (only WG0 uses it). Numbers are those
// of the other kernels: fp32 scores, the softmax in fp32 with the running sum
// of unrounded probabilities, P rounded to bf16 for the product only.
#include <cuda_runtime.h>

#include <cmath>
#include <cstdint>

#include "kernels/cuda/decode_device.cuh"
#include "kernels/cuda/kernels.h"
#include "kernels/cuda/query_device.cuh"
#include "kernels/cuda/wgmma_device.cuh"
#include "kernels/geometry.h"

namespace mla {
namespace cuda {
namespace {

constexpr int kBarConsumer = 1;  // named barrier of WG0's 128 threads

// Byte offset of element (row, col) of an N-row bf16 tile of 8 x 8 core
// matrices, K-major with the columns as K: the 8 columns 8c .. 8c + 7 of a
// row are 16 contiguous bytes, the N rows of column group c follow each other
// (N x 16 bytes), then the next column group. Q (rows = heads, columns =
// dims) and P^T (rows = heads, columns = keys) as the B operand.
template <int N>
__device__ __forceinline__ uint32_t NarrowOffset(int row, int col) {
  return static_cast<uint32_t>((col >> 3) * (N * 16) + row * 16 + (col & 7) * 2);
}
// Its descriptor: core matrices N x 16 bytes apart along K, 128 bytes apart
// along N; k-step `step` (16 columns) is Advance(d, NarrowStepBytes<N>(step)).
template <int N>
__device__ __forceinline__ uint64_t NarrowTile(uint32_t tile) {
  return MatrixDescriptor(tile, N * 16, 128);
}
template <int N>
__host__ __device__ constexpr uint32_t NarrowStepBytes(int step) {
  return step * 2 * (N * 16);
}

// A producer group's raw chunk in shared memory: 64 rows of the cache's 576
// data bytes and one copy of the 8 scale bytes for each of the row's four
// threads (each reads back only what it copied), padded to 624 bytes so that
// the 8 rows of a warp's 16-byte accesses fall in distinct banks.
constexpr uint32_t kRawRowBytes = 624;
constexpr uint32_t kRawScales = kTokenDataBytes;  // [4 parts][8 bytes] after the data
static_assert(kRawScales + 4 * 8 <= kRawRowBytes && kRawRowBytes % 16 == 0, "raw row");
constexpr uint32_t kRawChunkBytes = kTileRows * kRawRowBytes;

// Shared memory, in bytes from the start; kRingProducers: the producers'
// raw chunks at the end (ProduceRing, NarrowUsesRing), the rest the same
// either way.
template <int N, bool kRingProducers = (N > 16)>
struct NarrowLayout {
  static constexpr uint32_t kKeys = 0;                              // two 64 keys x 512 bf16
  static constexpr uint32_t kQ = kKeys + 2 * kTileBytes;            // N heads x 512 bf16
  static constexpr uint32_t kP = kQ + N * kHeadDim * 2;             // P^T: N heads x 64 keys bf16
  static constexpr uint32_t kMax = kP + N * kTileRows * 2;          // [4 warps][N] fp32
  static constexpr uint32_t kSum = kMax + 4 * N * 4;                // [4 warps][N] fp32, at the end
  static constexpr uint32_t kRowMax = kSum + 4 * N * 4;             // [N] fp32, at the end
  static constexpr uint32_t kRowSum = kRowMax + N * 4;              // [N] fp32, at the end
  static constexpr uint32_t kFactor = kRowSum + N * 4;              // [N] fp32, at the end
  static constexpr uint32_t kValid = kFactor + N * 4;               // [2][64] int
  static constexpr uint32_t kFull = kValid + 2 * kTileRows * 4;     // two mbarriers
  static constexpr uint32_t kEmpty = kFull + 16;                    // two mbarriers
  // The producer groups (NarrowShape) and, with the ring, a raw chunk each
  // (ProduceRing).
  static constexpr int kGroups = N <= 16 ? 2 : 1;
  static constexpr bool kRing = kRingProducers;
  static_assert(kRing || kGroups == 2, "one producer group always takes the ring");
  static constexpr int kRawChunks = kRing ? kGroups : 0;
  static constexpr uint32_t kRaw = kEmpty + 16;
  static constexpr uint32_t kBytes = kRaw + kRawChunks * kRawChunkBytes;
};
static_assert(NarrowLayout<8, true>::kBytes <= 227 * 1024, "shared memory of the narrow CTA");
static_assert(NarrowLayout<16, true>::kBytes <= 227 * 1024, "shared memory of the narrow CTA");
static_assert(NarrowLayout<24>::kBytes <= 227 * 1024, "shared memory of the narrow CTA");
static_assert(NarrowLayout<32>::kBytes <= 227 * 1024, "shared memory of the narrow CTA");

// At the end O^T is staged over the key tiles as N head rows of 512 fp32,
// padded by 16 bytes so that a warp's stores (8 dims x 4 head pairs) fall in
// 32 distinct banks.
constexpr uint32_t kNarrowStagedRowBytes = kHeadDim * 4 + 16;
static_assert(32 * kNarrowStagedRowBytes <= 2 * kTileBytes, "staged output over the key tiles");

// D[64 x N] (+)= A B for N = 8, 16, 24, 32: A 64 x 16 from shared memory
// (K-major, or MN-major with kTransA), B 16 x N from shared memory
// (K-major). Accumulator element i of a thread (warp w, lane l) is row
// 16w + l / 4 + 8 ((i >> 1) & 1), column 8 (i >> 2) + 2 (l % 4) + (i & 1).
template <int N, int kTransA>
struct WgmmaNarrow;
template <int kTransA>
struct WgmmaNarrow<8, kTransA> {
  __device__ __forceinline__ static void Run(float (&d)[4], uint64_t a, uint64_t b,
                                             int accumulate) {
    asm volatile(
        "{\n.reg .pred p;\nsetp.ne.b32 p, %6, 0;\n"
        "wgmma.mma_async.sync.aligned.m64n8k16.f32.bf16.bf16 "
        "{%0, %1, %2, %3}, %4, %5, p, 1, 1, %7, 0;\n}\n"
        : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
        : "l"(a), "l"(b), "r"(accumulate), "n"(kTransA));
  }
};
template <int kTransA>
struct WgmmaNarrow<16, kTransA> {
  __device__ __forceinline__ static void Run(float (&d)[8], uint64_t a, uint64_t b,
                                             int accumulate) {
    asm volatile(
        "{\n.reg .pred p;\nsetp.ne.b32 p, %10, 0;\n"
        "wgmma.mma_async.sync.aligned.m64n16k16.f32.bf16.bf16 "
        "{%0, %1, %2, %3, %4, %5, %6, %7}, %8, %9, p, 1, 1, %11, 0;\n}\n"
        : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3]), "+f"(d[4]), "+f"(d[5]), "+f"(d[6]),
          "+f"(d[7])
        : "l"(a), "l"(b), "r"(accumulate), "n"(kTransA));
  }
};
template <int kTransA>
struct WgmmaNarrow<24, kTransA> {
  __device__ __forceinline__ static void Run(float (&d)[12], uint64_t a, uint64_t b,
                                             int accumulate) {
    asm volatile(
        "{\n.reg .pred p;\nsetp.ne.b32 p, %14, 0;\n"
        "wgmma.mma_async.sync.aligned.m64n24k16.f32.bf16.bf16 "
        "{%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11}, %12, %13, p, 1, 1, %15, 0;\n}\n"
        : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3]), "+f"(d[4]), "+f"(d[5]), "+f"(d[6]),
          "+f"(d[7]), "+f"(d[8]), "+f"(d[9]), "+f"(d[10]), "+f"(d[11])
        : "l"(a), "l"(b), "r"(accumulate), "n"(kTransA));
  }
};
template <int kTransA>
struct WgmmaNarrow<32, kTransA> {
  __device__ __forceinline__ static void Run(float (&d)[16], uint64_t a, uint64_t b,
                                             int accumulate) {
    asm volatile(
        "{\n.reg .pred p;\nsetp.ne.b32 p, %18, 0;\n"
        "wgmma.mma_async.sync.aligned.m64n32k16.f32.bf16.bf16 "
        "{%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15}, %16, %17, p, "
        "1, 1, %19, 0;\n}\n"
        : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3]), "+f"(d[4]), "+f"(d[5]), "+f"(d[6]),
          "+f"(d[7]), "+f"(d[8]), "+f"(d[9]), "+f"(d[10]), "+f"(d[11]), "+f"(d[12]),
          "+f"(d[13]), "+f"(d[14]), "+f"(d[15])
        : "l"(a), "l"(b), "r"(accumulate), "n"(kTransA));
  }
};

__device__ __forceinline__ void ConsumerSync() {
  asm volatile("bar.sync %0, %1;\n" ::"n"(kBarConsumer), "n"(128) : "memory");
}

// Q [N heads][512] into its tile: thread wt copies 16-byte pieces wt,
// wt + 128, ... (piece k: head k / 64, dims 8 (k % 64) ..), all loads in
// flight before the first store.
template <int N>
__device__ __forceinline__ void StoreNarrowQ(const DecodeParams& p, const WgTask& task,
                                             unsigned char* smem, int wt) {
  constexpr int kPieces = N * kHeadDim / 8 / 128;  // a thread's
  const uint4* q = reinterpret_cast<const uint4*>(p.q + task.t * p.padded_heads * kHeadDim);
  uint4 pieces[kPieces];
#pragma unroll
  for (int k = 0; k < kPieces; ++k) pieces[k] = __ldg(q + wt + 128 * k);
#pragma unroll
  for (int k = 0; k < kPieces; ++k) {
    const int piece = wt + 128 * k;
    *reinterpret_cast<uint4*>(smem + NarrowLayout<N>::kQ +
                              NarrowOffset<N>(piece / (kHeadDim / 8), 8 * (piece % (kHeadDim / 8)))) =
        pieces[k];
  }
}

// StoreNarrowQ's tile from the prologue's input instead (FusedQuery): warp w
// makes query rows w, w + 4, .. as the prologue does, all loads in flight
// before the first row is finished.
template <int N>
__device__ __forceinline__ void StoreFusedNarrowQ(const DecodeParams& p, const FusedQuery& fused,
                                                  const WgTask& task, unsigned char* smem,
                                                  int wt) {
  constexpr int kRows = N / 4;
  const int w = wt >> 5;
  const int lane = wt & 31;
  uint4 raw[kRows][2];
#pragma unroll
  for (int k = 0; k < kRows; ++k) {
    LoadQueryRow(fused.q, task.t, w + 4 * k, p.num_heads, lane, raw[k]);
  }
  const float* cos_sin = fused.rope.data + int64_t{__ldg(fused.positions + task.t)} * kRopeDim;
#pragma unroll
  for (int k = 0; k < kRows; ++k) {
    const int h = w + 4 * k;
    uint4 row[2];
    FinishQueryRow(raw[k], h < p.num_heads, cos_sin, fused.rms_norm_eps, lane, row);
    *reinterpret_cast<uint4*>(smem + NarrowLayout<N>::kQ + NarrowOffset<N>(h, 16 * lane)) = row[0];
    *reinterpret_cast<uint4*>(smem + NarrowLayout<N>::kQ + NarrowOffset<N>(h, 16 * lane + 8)) =
        row[1];
  }
}

// WG0: everything but the gathers. Thread (warp w, lane l), g = l / 4,
// tig = l % 4, holds of S^T the keys 16w + g and + 8 and the heads
// 8j + 2 tig and + 1 (j < N / 8); of O^T (8 dim tiles) the dims
// 64 mt + 16w + g and + 8 of the same heads. Per head it keeps the running
// maximum (every thread holding the head computes the same) and its own
// keys' share of the running sum.
template <int N>
__device__ void Consume(const DecodeParams& p, const FusedQuery& fused, const WgTask& task,
                        int splits, const Partials& partials, unsigned char* smem, int wt) {
  using L = NarrowLayout<N>;
  constexpr int kAcc = N / 2;  // accumulator registers of an m64nN tile
  constexpr int kHeadsHeld = N / 4;
  const uint32_t base = SharedAddress(smem);
  const int w = wt >> 5;
  const int lane = wt & 31;
  const int g = lane >> 2;
  const int tig = lane & 3;
  // Head of accumulator element i, and its index among the thread's heads
  // (elements i and i + 2 are the same head, the other key); held head k is
  // that of element element_of(k).
  auto head_of = [&](int i) { return 8 * (i >> 2) + 2 * tig + (i & 1); };
  auto held = [](int i) { return 2 * (i >> 2) + (i & 1); };
  auto element_of = [](int k) { return 4 * (k >> 1) + (k & 1); };

  if (fused.q != nullptr) {
    StoreFusedNarrowQ<N>(p, fused, task, smem, wt);  // while the inserts run
    WaitForPreviousGrid();
  } else {
    WaitForPreviousGrid();  // q is the prologue's
    StoreNarrowQ<N>(p, task, smem, wt);
  }
  FenceForWgmma();
  ConsumerSync();

  float o[8][kAcc];
#pragma unroll
  for (int mt = 0; mt < 8; ++mt) {
#pragma unroll
    for (int i = 0; i < kAcc; ++i) o[mt][i] = 0.0f;
  }
  // In log2 units (scores scaled by log2 e), as decode_wgmma.cu.
  const float scale_log2 = p.softmax_scale * 1.4426950408889634f;
  float row_max[kHeadsHeld];
  float row_sum[kHeadsHeld];  // this thread's keys only until the end
#pragma unroll
  for (int k = 0; k < kHeadsHeld; ++k) {
    row_max[k] = -INFINITY;
    row_sum[k] = 0.0f;
  }
  const uint64_t q_tile = NarrowTile<N>(base + L::kQ);
  const uint64_t p_tile = NarrowTile<N>(base + L::kP);
  float* maxima = reinterpret_cast<float*>(smem + L::kMax);
  for (int chunk = 0; chunk < task.num_chunks; ++chunk) {
    const int buffer = chunk & 1;
    const uint32_t keys = base + L::kKeys + buffer * kTileBytes;
    MbarrierWait(base + L::kFull + 8 * buffer, (chunk >> 1) & 1);

    // S^T = K Q^T (the first step does not read s).
    float s[kAcc];
#pragma unroll
    for (int i = 0; i < kAcc; ++i) s[i] = 0.0f;
    WgmmaFence();
    const uint64_t key_tile = KMajorTile(keys);
#pragma unroll
    for (int step = 0; step < kHeadDim / 16; ++step) {
      WgmmaNarrow<N, 0>::Run(s, Advance(key_tile, KStepBytes(step)),
                             Advance(q_tile, NarrowStepBytes<N>(step)), step > 0);
    }
    WgmmaCommit();
    WgmmaWaitAll();
    PinRegisters(s);

    // The chunk's maximum of each head: the thread's two keys, the warp's
    // eight lanes of a column (lanes 4 apart), then the four warps.
    const int* valid = reinterpret_cast<const int*>(smem + L::kValid) + buffer * kTileRows;
    const bool key_valid[2] = {valid[16 * w + g] != 0, valid[16 * w + g + 8] != 0};
    float chunk_max[kHeadsHeld];
#pragma unroll
    for (int k = 0; k < kHeadsHeld; ++k) chunk_max[k] = -INFINITY;
#pragma unroll
    for (int i = 0; i < kAcc; ++i) {
      s[i] = key_valid[(i >> 1) & 1] ? scale_log2 * s[i] : -INFINITY;
      chunk_max[held(i)] = fmaxf(chunk_max[held(i)], s[i]);
    }
#pragma unroll
    for (int k = 0; k < kHeadsHeld; ++k) {
      chunk_max[k] = fmaxf(chunk_max[k], __shfl_xor_sync(0xffffffffu, chunk_max[k], 4));
      chunk_max[k] = fmaxf(chunk_max[k], __shfl_xor_sync(0xffffffffu, chunk_max[k], 8));
      chunk_max[k] = fmaxf(chunk_max[k], __shfl_xor_sync(0xffffffffu, chunk_max[k], 16));
    }
    // One set of slots: every thread reads this chunk's before the barrier
    // after P^T, and the next chunk's are written after it.
    if (g == 0) {
#pragma unroll
      for (int k = 0; k < kHeadsHeld; ++k) maxima[w * N + head_of(element_of(k))] = chunk_max[k];
    }
    ConsumerSync();  // also: every warp is past the previous chunk's O^T MMAs
    float alpha[kHeadsHeld];
    float subtract[kHeadsHeld];
#pragma unroll
    for (int k = 0; k < kHeadsHeld; ++k) {
      const int h = head_of(element_of(k));
      const float m = fmaxf(fmaxf(maxima[h], maxima[N + h]),
                            fmaxf(maxima[2 * N + h], maxima[3 * N + h]));
      const float new_max = fmaxf(row_max[k], m);
      alpha[k] = new_max == -INFINITY ? 1.0f : Exp2(row_max[k] - new_max);
      row_max[k] = new_max;
      row_sum[k] *= alpha[k];
      // A head with no key yet subtracts 0: its scores are all -inf.
      subtract[k] = new_max == -INFINITY ? 0.0f : new_max;
    }
    // P^T (bf16) into its tile, as the B operand: row = head, column = key.
#pragma unroll
    for (int i = 0; i < kAcc; ++i) {
      const float prob = Exp2(s[i] - subtract[held(i)]);
      row_sum[held(i)] += prob;
      const int key = 16 * w + g + 8 * ((i >> 1) & 1);
      *reinterpret_cast<uint16_t*>(smem + L::kP + NarrowOffset<N>(head_of(i), key)) =
          static_cast<uint16_t>(PackBf16(prob, 0.0f) & 0xffffu);
    }
    FenceForWgmma();
    ConsumerSync();  // all of P^T stored

    // O^T = O^T * alpha + V^T P^T; once the maxima settle most chunks move
    // none of a warp's heads, and the warp skips the multiplications.
    bool moved = false;
#pragma unroll
    for (int k = 0; k < kHeadsHeld; ++k) moved |= alpha[k] != 1.0f;
    if (__any_sync(0xffffffffu, moved)) {
#pragma unroll
      for (int mt = 0; mt < 8; ++mt) {
#pragma unroll
        for (int i = 0; i < kAcc; ++i) o[mt][i] *= alpha[held(i)];
      }
    }
#pragma unroll
    for (int mt = 0; mt < 8; ++mt) PinRegisters(o[mt]);
    WgmmaFence();
    const uint64_t value_tile = ValueTile(keys);
#pragma unroll
    for (int step = 0; step < kTileRows / 16; ++step) {
#pragma unroll
      for (int mt = 0; mt < 8; ++mt) {
        WgmmaNarrow<N, 1>::Run(o[mt], Advance(value_tile, ValueStepBytes(64 * mt, step)),
                               Advance(p_tile, NarrowStepBytes<N>(step)), 1);
      }
    }
    WgmmaCommit();
    WgmmaWaitAll();
#pragma unroll
    for (int mt = 0; mt < 8; ++mt) PinRegisters(o[mt]);
    MbarrierArrive(base + L::kEmpty + 8 * buffer);
  }

  // The rows' final state: sums over the thread's lanes of a column and the
  // four warps, maxima in natural units; lanes 0..3 of warp 0 hold every head.
  float* sums = reinterpret_cast<float*>(smem + L::kSum);
#pragma unroll
  for (int k = 0; k < kHeadsHeld; ++k) {
    row_sum[k] += __shfl_xor_sync(0xffffffffu, row_sum[k], 4);
    row_sum[k] += __shfl_xor_sync(0xffffffffu, row_sum[k], 8);
    row_sum[k] += __shfl_xor_sync(0xffffffffu, row_sum[k], 16);
  }
  if (g == 0) {
#pragma unroll
    for (int k = 0; k < kHeadsHeld; ++k) sums[w * N + head_of(element_of(k))] = row_sum[k];
  }
  ConsumerSync();
  float* final_max = reinterpret_cast<float*>(smem + L::kRowMax);
  float* final_sum = reinterpret_cast<float*>(smem + L::kRowSum);
  if (w == 0 && g == 0) {
#pragma unroll
    for (int k = 0; k < kHeadsHeld; ++k) {
      const int h = head_of(element_of(k));
      final_max[h] = row_max[k] * 0.6931471805599453f;  // ln 2; -inf stays -inf
      final_sum[h] = sums[h] + sums[N + h] + sums[2 * N + h] + sums[3 * N + h];
    }
  }
  ConsumerSync();
  // Thread h < N finishes head h: the factor and lse, or a split's state.
  float* factors = reinterpret_cast<float*>(smem + L::kFactor);
  if (wt < N) {
    if (splits == 1) {
      if (wt < p.num_heads) {
        const RowEnd end = EndOfRow(p, task.t, wt, final_max[wt], final_sum[wt]);
        factors[wt] = end.factor;
        StoreLse(p, task.t, wt, end.lse);
      }
    } else {
      partials.StoreState(Partials::Item(p, task.t, wt, splits, task.split), final_max[wt],
                          final_sum[wt]);
    }
  }
  // O^T staged as [head][dim] fp32 over the key tiles (every producer store
  // into them was waited for; every warp is past its last MMA).
  unsigned char* staged = smem + L::kKeys;
#pragma unroll
  for (int mt = 0; mt < 8; ++mt) {
#pragma unroll
    for (int i = 0; i < kAcc; ++i) {
      const int dim = 64 * mt + 16 * w + g + 8 * ((i >> 1) & 1);
      *reinterpret_cast<float*>(staged + head_of(i) * kNarrowStagedRowBytes + dim * 4) = o[mt][i];
    }
  }
  ConsumerSync();

  // The rows leave 4 dims a thread a step: finished (scaled, sink, de-rotated,
  // bf16 or FP8) or, for a split of the keys, the unnormalised partial.
  constexpr int kQuads = kHeadDim / 4;
  if (splits == 1 && Fp8Output(p)) {
    // A step is one head, warp w its block w (32 lanes x 4 dims): the
    // block's maximum across the warp, then a word of 4 codes a lane.
    static_assert(kQuads == 128 && kOutputQuantBlock == 32 * 4, "a warp a block");
    const float* cos_sin = DerotationOf(p, task.t);
    // Four heads' chains of shuffles side by side.
#pragma unroll 4
    for (int k = wt; k < p.num_heads * kQuads; k += 128) {
      const int h = k / kQuads;
      const int c = k % kQuads;
      const float4 v = *reinterpret_cast<const float4*>(staged + h * kNarrowStagedRowBytes + c * 16);
      const float2 lo = FinishedValues(2 * c, factors[h], cos_sin, v.x, v.y);
      const float2 hi = FinishedValues(2 * c + 1, factors[h], cos_sin, v.z, v.w);
      const float amax = LanesMax<32>(
          fmaxf(fmaxf(fabsf(lo.x), fabsf(lo.y)), fmaxf(fabsf(hi.x), fabsf(hi.y))));
      const int e = BlockScaleExponent(amax);
      const float inv_scale = InverseBlockScale(e);
      reinterpret_cast<uint32_t*>(E4m3Row(p, task.t, h))[c] =
          E4m3Pair(lo.x, lo.y, inv_scale) | E4m3Pair(hi.x, hi.y, inv_scale) << 16;
      if (lane == 0) ScaleBytes(p, task.t, h)[w] = BlockScaleByte(e);
    }
    return;
  }
  if (splits == 1) {
    const float* cos_sin = DerotationOf(p, task.t);
    uint32_t* out = reinterpret_cast<uint32_t*>(p.out + task.t * p.num_heads * kHeadDim);
    const bool aligned = (reinterpret_cast<uintptr_t>(p.out) & 7) == 0;
    for (int k = wt; k < p.num_heads * kQuads; k += 128) {
      const int h = k / kQuads;
      const int c = k % kQuads;
      const float4 v = *reinterpret_cast<const float4*>(staged + h * kNarrowStagedRowBytes + c * 16);
      const uint32_t lo = FinishedPair(2 * c, factors[h], cos_sin, v.x, v.y);
      const uint32_t hi = FinishedPair(2 * c + 1, factors[h], cos_sin, v.z, v.w);
      uint32_t* pair = out + h * (kHeadDim / 2) + 2 * c;
      if (aligned) {
        *reinterpret_cast<uint2*>(pair) = make_uint2(lo, hi);
      } else {  // an output view that is only 4-byte aligned
        pair[0] = lo;
        pair[1] = hi;
      }
    }
    return;
  }
  for (int k = wt; k < N * kQuads; k += 128) {
    const int h = k / kQuads;
    const int c = k % kQuads;
    const float4 v = *reinterpret_cast<const float4*>(staged + h * kNarrowStagedRowBytes + c * 16);
    const int64_t item = Partials::Item(p, task.t, h, splits, task.split);
    partials.Store(item, 2 * c, v.x, v.y);
    partials.Store(item, 2 * c + 1, v.z, v.w);
  }
}


// The narrow kernel's producers: Produce's threads, rows and pieces (a
// quarter row a thread, kGroups groups taking chunks g, g + kGroups, ...),
// with a second chunk in flight. A thread holds chunk c's pieces in
// registers and has chunk c + kGroups on its way into its part of the
// group's raw chunk in shared memory (cp.async, no registers); once chunk c
// is stored into the key tile, it takes c + kGroups from the raw chunk and
// sends for c + 2 kGroups there. So a chunk's loads go out two of the
// group's chunks before it is stored, not one: the narrow kernel's producers
// waited on their row loads (RESULTS.md). A thread reads back only the bytes
// it copied itself, so no barrier guards the raw chunk; it reads them back
// before, in program order, its next copy into the same bytes, whose writes
// count as its own weak writes (and land a global-memory latency later).
// Used at N = 24 and 32 (one group; 32 measured): 0.4-6% faster at every V4 shape of the
// benchmark. With two groups (N = 8, 16) it was faster at V4-Pro b >= 128
// (1.6-6.9%) but slower where a CTA has 10 chunks or fewer (V4-Flash, or a
// split at b = 64: to 10%), so there the kernel is instantiated both ways
// and NarrowUsesRing picks by the chunks a CTA (RESULTS.md).
__device__ __forceinline__ void CopyRowAsync(const DecodeParams& p, const WgTask& task, int chunk,
                                             int r, int32_t slot, int part, uint32_t raw_row) {
  if (slot == -1) return;
  const RowSource source = SourceOf(p, task, chunk, r, slot);
  auto copy16 = [&](int piece) {
    asm volatile("cp.async.cg.shared.global [%0], [%1], 16;\n" ::"r"(raw_row + 16 * piece),
                 "l"(source.data + piece)
                 : "memory");
  };
#pragma unroll
  for (int q = 0; q < 7; ++q) copy16(part + 4 * q);
  copy16(28 + part);
  copy16(32 + part);
  asm volatile("cp.async.ca.shared.global [%0], [%1], 8;\n" ::"r"(raw_row + kRawScales + 8 * part),
               "l"(source.scales)
               : "memory");
}
__device__ __forceinline__ void ReadRawRow(const unsigned char* raw_row, int32_t slot, int part,
                                           RowPieces& row) {
  const uint4 zero = make_uint4(0, 0, 0, 0);
#pragma unroll
  for (int q = 0; q < 9; ++q) row.pieces[q] = zero;
  row.scales = make_uint2(kSkippedRowScales, kSkippedRowScales);
  if (slot == -1) return;
  auto piece = [&](int k) { return *reinterpret_cast<const uint4*>(raw_row + 16 * k); };
#pragma unroll
  for (int q = 0; q < 7; ++q) row.pieces[q] = piece(part + 4 * q);
  row.pieces[7] = piece(28 + part);
  row.pieces[8] = piece(32 + part);
  row.scales = *reinterpret_cast<const uint2*>(raw_row + kRawScales + 8 * part);
}

// The caller passes wt = u % 256 and group = u / 256 (< kGroups).
template <typename Layout, int kGroups>
__device__ void ProduceRing(const DecodeParams& p, const WgTask& task, unsigned char* smem,
                            int wt, int group) {
  static_assert(kGroups == 1 || kGroups == 2, "two tiles: one or two producer groups");
  static_assert(Layout::kRawChunks >= kGroups, "a raw chunk for every producer group");
  const int part = (wt & 31) >> 3;
  const int r = (wt >> 5) * 8 + (wt & 7);
  const uint32_t base = SharedAddress(smem);
  const uint32_t raw_offset = Layout::kRaw + group * kRawChunkBytes + r * kRawRowBytes;
  if (group >= task.num_chunks) return;
  int32_t slot = SlotOf(p, task, group, r);
  int32_t next = SlotOf(p, task, group + kGroups, r);
  int32_t after = SlotOf(p, task, group + 2 * kGroups, r);
  RowPieces row;
  WaitForPreviousGrid();  // the cache rows may be the previous kernel's
  LoadRow<RowCaching::kNoL1>(p, task, group, r, slot, part, row);
  CopyRowAsync(p, task, group + kGroups, r, next, part, base + raw_offset);
  asm volatile("cp.async.commit_group;\n" ::: "memory");
  for (int chunk = group; chunk < task.num_chunks; chunk += kGroups) {
    const int32_t later = SlotOf(p, task, chunk + 3 * kGroups, r);
    FillTile<Layout>(smem, base, chunk, row, r, part, slot);
    if (chunk + kGroups < task.num_chunks) {
      asm volatile("cp.async.wait_all;\n" ::: "memory");
      ReadRawRow(smem + raw_offset, next, part, row);
      CopyRowAsync(p, task, chunk + 2 * kGroups, r, after, part, base + raw_offset);
      asm volatile("cp.async.commit_group;\n" ::: "memory");
    }
    slot = next;
    next = after;
    after = later;
  }
}

// The CTA's shape: WG0 the consumer and one or two groups of two producer
// warpgroups. At N = 32 a second group made it slower (63.5 against
// 62.5 us), and so did a second consumer in its place (RESULTS.md), so
// N = 32 keeps one group and the consumer's 240 registers.
// setmaxnreg: together at most what the launch gave (the cap of
// __launch_bounds__: 3 x 168 or 5 x 96): WG0 holds O^T (4N), S^T (N / 2) and
// the heads' softmax state; a producer a quarter row of loads and its
// addresses (with two groups 64 spill a few bytes, 72 do not; the consumer
// at 192 does not spill at N = 16).
template <int N>
struct NarrowShape {
  static constexpr int kGroups = NarrowLayout<N>::kGroups;
  static constexpr int kThreads = 128 + 256 * kGroups;
  static constexpr int kLaunchRegisters = kGroups == 2 ? 96 : 168;
  static constexpr int kConsumerRegisters = kGroups == 2 ? 192 : 240;
  static constexpr int kProducerRegisters = kGroups == 2 ? 72 : 128;
  static_assert(kConsumerRegisters + 2 * kGroups * kProducerRegisters <=
                    (1 + 2 * kGroups) * kLaunchRegisters,
                "setmaxnreg.inc would wait forever for registers");
};

template <int N, bool kRing>
__global__ void __launch_bounds__(NarrowShape<N>::kThreads, 1)
    DecodeNarrowKernel(const DecodeParams p, const FusedQuery fused, int splits, int split_entries,
                       Partials partials) {
  using L = NarrowLayout<N, kRing>;
  extern __shared__ __align__(1024) unsigned char smem[];
  const WgTask task = MakeTask(p, blockIdx.x, 0, N, blockIdx.y, split_entries);

  AllowNextGrid();
  const int tid = threadIdx.x;
  if (tid == 0) {
    const uint32_t base = SharedAddress(smem);
    for (int b = 0; b < 2; ++b) {
      MbarrierInit(base + L::kFull + 8 * b, 256);   // the threads of a producer group
      MbarrierInit(base + L::kEmpty + 8 * b, 128);  // WG0's
    }
  }
  __syncthreads();
  if (tid < 128) {
    asm volatile("setmaxnreg.inc.sync.aligned.u32 %0;\n" ::"n"(NarrowShape<N>::kConsumerRegisters));
    Consume<N>(p, fused, task, splits, partials, smem, tid);
  } else {
    asm volatile("setmaxnreg.dec.sync.aligned.u32 %0;\n" ::"n"(NarrowShape<N>::kProducerRegisters));
    if constexpr (L::kRing) {
      ProduceRing<L, NarrowShape<N>::kGroups>(p, task, smem, (tid - 128) & 255, (tid - 128) >> 8);
    } else {
      Produce<L, NarrowShape<N>::kGroups, RowCaching::kNoL1>(p, task, smem, (tid - 128) & 255,
                                                             (tid - 128) >> 8);
    }
  }
}

template <int N, bool kRing>
cudaError_t LaunchNarrowWith(const DecodeParams& p, const FusedQuery& fused, int splits,
                             int split_entries, float* partial_o, float* partial_ml,
                             cudaStream_t stream) {
  using L = NarrowLayout<N, kRing>;
  const cudaError_t error =
      PrepareWarpSpecialised<DecodeNarrowKernel<N, kRing>, NarrowShape<N>::kLaunchRegisters>(
          L::kBytes);
  if (error != cudaSuccess) return error;
  const dim3 grid(static_cast<unsigned>(p.num_tokens), splits);
  return LaunchOverlapped(DecodeNarrowKernel<N, kRing>, grid, NarrowShape<N>::kThreads, L::kBytes,
                          stream, 1, p, fused, splits, split_entries,
                          Partials{partial_o, partial_ml});
}

template <int N>
cudaError_t LaunchNarrow(const DecodeParams& p, const FusedQuery& fused, int splits,
                         int split_entries, float* partial_o, float* partial_ml,
                         cudaStream_t stream) {
  if constexpr (N <= 16) {
    if (!NarrowUsesRing(N, split_entries)) {
      return LaunchNarrowWith<N, false>(p, fused, splits, split_entries, partial_o, partial_ml,
                                        stream);
    }
  }
  return LaunchNarrowWith<N, true>(p, fused, splits, split_entries, partial_o, partial_ml, stream);
}

}  // namespace

cudaError_t LaunchDecodeNarrow(const DecodeParams& p, const FusedQuery& fused, int splits,
                               int split_entries, float* partial_o, float* partial_ml,
                               cudaStream_t stream) {
  switch (p.padded_heads) {
    case 8:
      return LaunchNarrow<8>(p, fused, splits, split_entries, partial_o, partial_ml, stream);
    case 16:
      return LaunchNarrow<16>(p, fused, splits, split_entries, partial_o, partial_ml, stream);
    case 24:
      return LaunchNarrow<24>(p, fused, splits, split_entries, partial_o, partial_ml, stream);
    case 32:
      return LaunchNarrow<32>(p, fused, splits, split_entries, partial_o, partial_ml, stream);
    default:
      return cudaErrorInvalidValue;
  }
}

}  // namespace cuda
}  // namespace mla

// Sparse MLA decode (spec section 5) with Hopper's warpgroup MMA (wgmma):
// one CTA per 64 heads of a token (and per split of its keys), keys in
// chunks of 64. Made for Hp = 64 and 128, where it is the default decode
// kernel; a smaller Hp fills the MMA's 64 rows with zero queries whose
// results are dropped, which only MLA_CUDA_DECODE=padded asks for (the
// default runs decode_narrow.cu for those; see decode_kernels.h).
// kernels/bench/RESULTS.md has its figures and limits.
//
// A CTA is four warpgroups with their own jobs, linked through shared memory:
//   WG0, scores: S = Q K^T for the chunk (Q and the key tile both in shared
//     memory), the online softmax of its 64 heads, P (bf16) and the rescale
//     factor alpha of each head into shared memory for WG1; then
//     O[:, 0:256] = O * alpha + P V[:, 0:256] with P from registers.
//   WG1, values: O[:, 256:512] = O * alpha + P V[:, 256:512] with P read from
//     shared memory.
//   WG2 and WG3, producers: gather the chunk's 64 FP8 rows from global
//     memory into registers (a quarter of a row a thread, issued once the
//     thread's row of the previous chunk is stored and that tile announced;
//     the slots read a chunk earlier still), dequantise them to bf16 into
//     one of two key tiles and signal the consumers through an mbarrier; the
//     consumers free a tile through another (Produce, wgmma_device.cuh).
//     Eight warps issue the loads: with the same bytes in flight, a gather
//     runs faster from more warps (RESULTS.md).
// At Hp 72..128 the two CTAs of a token form a cluster (kPair, ProducePair):
// each one's producers gather and dequantise only half of every chunk's
// rows, an eighth of a row a thread, and store them into both CTAs' tiles,
// the other's through distributed shared memory (st.async); FlashMLA calls
// this crossover. It halves the loads and dequantisation a CTA does
// (RESULTS.md: 5-7% faster at H = 128).
// The key tile serves as K (K-major B operand of S = Q K^T) and as V (the
// same bytes as an MN-major B operand of P V): both use the layout of
// TileOffset. Numbers are those of the other kernels: fp32 scores, the
// softmax in fp32 with the running sum of unrounded probabilities, P rounded
// to bf16 for the product only.
#include <cuda_runtime.h>

#include <cmath>
#include <cstdint>

#include "kernels/cuda/decode_device.cuh"
#include "kernels/cuda/kernels.h"
#include "kernels/cuda/wgmma_device.cuh"
#include "kernels/geometry.h"

namespace mla {
namespace cuda {
namespace {

constexpr int kWgThreads = 512;  // four warpgroups: two consumers, two producers

// Shared memory, in bytes from the start.
struct WgLayout {
  static constexpr uint32_t kQ = 0;                             // 64 heads x 512 bf16
  static constexpr uint32_t kKeys = kQ + kTileBytes;            // two 64 keys x 512 bf16
  static constexpr uint32_t kP = kKeys + 2 * kTileBytes;        // 64 heads x 64 keys bf16
  static constexpr uint32_t kAlpha = kP + kTileRows * kTileRows * 2;  // [64] fp32
  static constexpr uint32_t kRowMax = kAlpha + kTileRows * 4;   // [64] fp32, at the end
  static constexpr uint32_t kRowSum = kRowMax + kTileRows * 4;  // [64] fp32, at the end
  static constexpr uint32_t kValid = kRowSum + kTileRows * 4;   // [2][64] int
  static constexpr uint32_t kFull = kValid + 2 * kTileRows * 4;  // two mbarriers
  static constexpr uint32_t kEmpty = kFull + 16;                 // two mbarriers
  // mbarriers between WG0 and WG1 (see below).
  static constexpr uint32_t kPReady = kEmpty + 16;
  static constexpr uint32_t kPFree = kPReady + 8;
  static constexpr uint32_t kStateReady = kPFree + 8;
  static constexpr uint32_t kStaged = kStateReady + 8;
  static constexpr uint32_t kQReady = kStaged + 8;
  static constexpr uint32_t kBytes = kQReady + 8;
};
static_assert(WgLayout::kBytes <= 227 * 1024, "shared memory of the wgmma CTA");

// WG0 and WG1 meet at mbarriers, which compute-sanitizer's racecheck
// follows (it reports hazards across a named barrier that two warpgroups
// share):
//   kQReady: all 256 arrive once their half of Q is stored; WG0 waits.
//   kPReady: WG0's 128 threads arrive once P and alpha of a chunk are
//     stored; WG1 waits (phase = chunk).
//   kPFree: WG1's 128 threads arrive once done reading them; WG0 waits
//     before it stores the next chunk's (phase = chunk - 1).
//   kStateReady: all 256 arrive after their last chunk (WG0 with the final
//     softmax state stored), then wait; the key tiles are free after it.
//   kStaged: all 256 arrive once their output is staged, then wait.

// At the end the output is staged in shared memory (over the key tiles,
// free once both consumers are past their last chunk) as 64 head rows of
// 512 bf16, padded so that a warp's stores (8 heads x 4 lanes) fall in 32
// distinct banks; then it goes out in 16-byte pieces.
constexpr uint32_t kStagedRowBytes = kHeadDim * 2 + 16;
static_assert(kTileRows * kStagedRowBytes <= 2 * kTileBytes, "staged output over the key tiles");
// The FP8 output is staged the same way, 512 e4m3 bytes a row.
constexpr uint32_t kStagedE4m3RowBytes = kHeadDim + 16;

// O *= alpha of its row (element i of o[n] is row row0 + 8 ((i >> 1) & 1)),
// then the fence before the MMAs that accumulate into O (scaled before it,
// not between the MMAs). Once the maxima settle most chunks move none of a
// warp's rows, and the warp skips the multiplications.
__device__ __forceinline__ void RescaleForMma(float (&o)[4][32], const float (&alpha)[2]) {
  if (__any_sync(0xffffffffu, alpha[0] != 1.0f || alpha[1] != 1.0f)) {
#pragma unroll
    for (int n = 0; n < 4; ++n) {
#pragma unroll
      for (int i = 0; i < 32; ++i) o[n][i] *= alpha[(i >> 1) & 1];
    }
  }
#pragma unroll
  for (int n = 0; n < 4; ++n) PinRegisters(o[n]);
  WgmmaFence();
}

// WriteOutput's finished rows as FP8 (spec section 5). A row's block of 128
// dims lies in one consumer's half (n = 2b, 2b + 1 of its o), shared by the
// four lanes of a quad: each lane's maximum, the quad's, then the codes,
// staged and copied out as WriteOutput does. Rows past H are computed (the
// quads of a warp shuffle together) but not stored.
__device__ void WriteE4m3Output(const DecodeParams& p, const WgTask& task, const float (&o)[4][32],
                                int row0, int dim0, const float (&row_max)[2],
                                const float (&row_sum)[2], unsigned char* smem) {
  const int tig = threadIdx.x & 3;
  const float* cos_sin = DerotationOf(p, task.t);
  unsigned char* staged = smem + WgLayout::kKeys;
#pragma unroll
  for (int half = 0; half < 2; ++half) {
    const int h = row0 + 8 * half;
    const bool real = task.h0 + h < p.num_heads;
    const RowEnd end = real ? EndOfRow(p, task.t, task.h0 + h, row_max[half], row_sum[half])
                            : RowEnd{0.0f, INFINITY};
    if (real && dim0 == 0 && tig == 0) StoreLse(p, task.t, task.h0 + h, end.lse);
#pragma unroll
    for (int b = 0; b < 2; ++b) {
      // The values twice (the maximum, then the codes) rather than 32 more
      // registers held.
      float amax = 0.0f;
#pragma unroll
      for (int n = 2 * b; n < 2 * b + 2; ++n) {
#pragma unroll
        for (int i = 0; i < 8; ++i) {
          const int dim = dim0 + 64 * n + 8 * i + 2 * tig;
          const float2 v = FinishedValues(dim / 2, end.factor, cos_sin, o[n][4 * i + 2 * half],
                                          o[n][4 * i + 2 * half + 1]);
          amax = fmaxf(amax, fmaxf(fabsf(v.x), fabsf(v.y)));
        }
      }
      const int e = BlockScaleExponent(LanesMax<4>(amax));
      const float inv_scale = InverseBlockScale(e);
#pragma unroll
      for (int n = 2 * b; n < 2 * b + 2; ++n) {
#pragma unroll
        for (int i = 0; i < 8; ++i) {
          const int dim = dim0 + 64 * n + 8 * i + 2 * tig;
          const float2 v = FinishedValues(dim / 2, end.factor, cos_sin, o[n][4 * i + 2 * half],
                                          o[n][4 * i + 2 * half + 1]);
          *reinterpret_cast<uint16_t*>(staged + h * kStagedE4m3RowBytes + dim) =
              static_cast<uint16_t>(E4m3Pair(v.x, v.y, inv_scale));
        }
      }
      if (real && tig == 0) {
        ScaleBytes(p, task.t, task.h0 + h)[(dim0 + kOutputQuantBlock * b) / kOutputQuantBlock] =
            BlockScaleByte(e);
      }
    }
  }
  MbarrierArrive(SharedAddress(smem) + WgLayout::kStaged);
  MbarrierWait(SharedAddress(smem) + WgLayout::kStaged, 0);
  const int heads = min(kTileRows, p.num_heads - task.h0);
  constexpr int kPieces = kHeadDim / 16;
  for (int k = threadIdx.x; k < heads * kPieces; k += 256) {
    const int h = k / kPieces;
    const int piece = k % kPieces;
    reinterpret_cast<uint4*>(E4m3Row(p, task.t, task.h0 + h))[piece] =
        *reinterpret_cast<const uint4*>(staged + h * kStagedE4m3RowBytes + piece * 16);
  }
}

// Writes this thread's part of O: rows (heads) row0 and row0 + 8, dims
// dim0 + 64 n + 8 i + 2 (lane % 4) and + 1, from accumulator element
// o[n][4 i + 2 half] (+ 1) for row row0 + 8 half. Called by both consumer
// warpgroups (threads 0..255) together. Finished rows are staged in shared
// memory and copied out in whole 16-byte pieces; partial ones (a split of
// the keys) go straight to the scratch rows.
__device__ void WriteOutput(const DecodeParams& p, const WgTask& task, int splits,
                            const Partials& partials, const float (&o)[4][32], int row0,
                            int dim0, const float (&row_max)[2], const float (&row_sum)[2],
                            unsigned char* smem) {
  const int tig = threadIdx.x & 3;
  if (splits == 1 && Fp8Output(p)) {
    WriteE4m3Output(p, task, o, row0, dim0, row_max, row_sum, smem);
    return;
  }
  if (splits == 1) {
    const float* cos_sin = DerotationOf(p, task.t);
    unsigned char* staged = smem + WgLayout::kKeys;
#pragma unroll
    for (int half = 0; half < 2; ++half) {
      const int h = row0 + 8 * half;
      if (task.h0 + h >= p.num_heads) continue;
      const RowEnd end = EndOfRow(p, task.t, task.h0 + h, row_max[half], row_sum[half]);
      if (dim0 == 0 && tig == 0) StoreLse(p, task.t, task.h0 + h, end.lse);
#pragma unroll
      for (int n = 0; n < 4; ++n) {
#pragma unroll
        for (int i = 0; i < 8; ++i) {
          const int dim = dim0 + 64 * n + 8 * i + 2 * tig;
          *reinterpret_cast<uint32_t*>(staged + h * kStagedRowBytes + dim * 2) =
              FinishedPair(dim / 2, end.factor, cos_sin, o[n][4 * i + 2 * half],
                           o[n][4 * i + 2 * half + 1]);
        }
      }
    }
    MbarrierArrive(SharedAddress(smem) + WgLayout::kStaged);
    MbarrierWait(SharedAddress(smem) + WgLayout::kStaged, 0);
    const int heads = min(kTileRows, p.num_heads - task.h0);
    uint16_t* out = p.out + (task.t * p.num_heads + task.h0) * kHeadDim;
    if ((reinterpret_cast<uintptr_t>(p.out) & 15) == 0) {
      for (int k = threadIdx.x; k < heads * (kHeadDim / 8); k += 256) {
        const int h = k / (kHeadDim / 8);
        const int piece = k % (kHeadDim / 8);
        *reinterpret_cast<uint4*>(out + h * kHeadDim + piece * 8) =
            *reinterpret_cast<const uint4*>(staged + h * kStagedRowBytes + piece * 16);
      }
    } else {  // an output view that is only 4-byte aligned
      for (int k = threadIdx.x; k < heads * (kHeadDim / 2); k += 256) {
        const int h = k / (kHeadDim / 2);
        const int word = k % (kHeadDim / 2);
        reinterpret_cast<uint32_t*>(out + h * kHeadDim)[word] =
            *reinterpret_cast<const uint32_t*>(staged + h * kStagedRowBytes + word * 4);
      }
    }
    return;
  }
#pragma unroll
  for (int half = 0; half < 2; ++half) {
    const int h = row0 + 8 * half;
    if (h >= task.heads_here) continue;
    const int64_t item = Partials::Item(p, task.t, task.h0 + h, splits, task.split);
    if (dim0 == 0 && tig == 0) partials.StoreState(item, row_max[half], row_sum[half]);
#pragma unroll
    for (int n = 0; n < 4; ++n) {
#pragma unroll
      for (int i = 0; i < 8; ++i) {
        const int dim = dim0 + 64 * n + 8 * i + 2 * tig;
        partials.Store(item, dim / 2, o[n][4 * i + 2 * half], o[n][4 * i + 2 * half + 1]);
      }
    }
  }
}

// Q into shared memory, by WG0 and WG1 together (u = 0..255): warp w = u / 32
// copies heads 8 w .. 8 w + 7, lane l head 8 w + l % 8 and of it dims 16 c ..
// 16 c + 15 for c = l / 8 + 4k. Each load instruction of a warp reads 64 B
// of each of 8 heads (8 cache lines; a warp reading 32 B of 32 heads was 32
// lines an instruction, and a CTA's start took 5-6 us for Q); the 8 lanes of
// one c store 128 contiguous bytes. Rows past heads_here are zero. All 16
// loads are in flight before the first store: one memory latency, not one
// per step. Then u arrives on kQReady.
__device__ __forceinline__ void StoreQ(const DecodeParams& p, const WgTask& task,
                                       unsigned char* smem, int u) {
  const uint16_t* q = p.q + (task.t * p.padded_heads + task.h0) * kHeadDim;
  const int q_head = 8 * (u >> 5) + (u & 7);
  const int c0 = (u & 31) >> 3;
  uint4 q_pieces[16];
#pragma unroll
  for (int k = 0; k < 8; ++k) {
    const int c = c0 + 4 * k;
    q_pieces[2 * k] = q_pieces[2 * k + 1] = make_uint4(0, 0, 0, 0);
    if (q_head < task.heads_here) {
      const uint4* src = reinterpret_cast<const uint4*>(q + q_head * kHeadDim) + 2 * c;
      q_pieces[2 * k] = __ldg(src);
      q_pieces[2 * k + 1] = __ldg(src + 1);
    }
  }
#pragma unroll
  for (int k = 0; k < 8; ++k) {
    const int c = c0 + 4 * k;
    *reinterpret_cast<uint4*>(smem + WgLayout::kQ + TileOffset(q_head, 16 * c)) = q_pieces[2 * k];
    *reinterpret_cast<uint4*>(smem + WgLayout::kQ + TileOffset(q_head, 16 * c + 8)) =
        q_pieces[2 * k + 1];
  }
  FenceForWgmma();
  MbarrierArrive(SharedAddress(smem) + WgLayout::kQReady);
}

// A cluster of two CTAs (kPair: the two head groups of a token at
// Hp 72..128, the second 64 heads or fewer) shares the work of filling the key tiles: each CTA's producers
// gather and dequantise half of every chunk's rows (CTA rank k rows 32 k ..
// 32 k + 31) and store them into both CTAs' tiles, the peer's through
// st.async, which counts its bytes on the peer's full barrier. A tile is
// full when the 256 local producers have arrived and the peer's bytes have
// landed (one local thread announces them: expect_tx); free when both CTAs'
// consumers are done with it (their local arrivals and one remote arrival
// from each consumer warpgroup of the peer).
constexpr int kPairRows = kTileRows / 2;  // the rows of a chunk each CTA of a pair fills
constexpr uint32_t kPeerBytesPerChunk = kPairRows * (kHeadDim * 2 + sizeof(int));  // rows, flags
// What ProducePair sends of each of its rows: 28 FP8 pieces as two 16-byte
// bf16 stores each, 8 RoPE pieces of 16 bytes and the valid flag.
static_assert(kPeerBytesPerChunk == kPairRows * (28 * 2 * 16 + 8 * 16 + 4),
              "the peer's expect_tx must count every byte ProducePair sends");
// Arrivals a phase of a pair's barriers: Full, the producers' threads and the
// expect_tx of one of them; Empty, the consumers' threads and one thread of
// each of the peer's two consumer warpgroups.
constexpr int kPairFullArrivals = 256 + 1;
constexpr int kPairEmptyArrivals = 256 + 2;

__device__ __forceinline__ uint32_t ClusterRank() {
  uint32_t rank;
  asm volatile("mov.u32 %0, %%cluster_ctarank;\n" : "=r"(rank));
  return rank;
}
// The address of the same byte of the other CTA's shared memory.
__device__ __forceinline__ uint32_t PeerAddress(uint32_t local, uint32_t rank) {
  uint32_t address;
  asm volatile("mapa.shared::cluster.u32 %0, %1, %2;\n" : "=r"(address) : "r"(local), "r"(rank));
  return address;
}
__device__ __forceinline__ void ClusterSync() {
  asm volatile(
      "barrier.cluster.arrive.release.aligned;\n"
      "barrier.cluster.wait.acquire.aligned;\n" ::: "memory");
}
__device__ __forceinline__ void StoreToPeer(uint32_t address, uint4 value, uint32_t peer_bar) {
  asm volatile(
      "st.async.shared::cluster.mbarrier::complete_tx::bytes.v4.b32 "
      "[%0], {%1, %2, %3, %4}, [%5];\n"
      :: "r"(address), "r"(value.x), "r"(value.y), "r"(value.z), "r"(value.w), "r"(peer_bar)
      : "memory");
}
__device__ __forceinline__ void StoreToPeer(uint32_t address, uint32_t value, uint32_t peer_bar) {
  asm volatile(
      "st.async.shared::cluster.mbarrier::complete_tx::bytes.b32 [%0], %1, [%2];\n"
      :: "r"(address), "r"(value), "r"(peer_bar)
      : "memory");
}
// An arrival on the peer's barrier with the default (CTA-scope release)
// semantics. It only says that this warpgroup's wgmma reads of a tile are
// over, and they are (their wait_group returned) before it issues, so the
// peer's later writes into the tile cannot reach them: no cluster-scope
// release is needed. That release compiled to a GPU-scope MEMBAR, which
// ncu put on WG0's critical path; without it V4-Pro H = 128 is 4% faster.
__device__ __forceinline__ void ArriveOnPeer(uint32_t peer_bar) {
  asm volatile("mbarrier.arrive.shared::cluster.b64 _, [%0];\n" ::"r"(peer_bar)
               : "memory");
}
__device__ __forceinline__ void ArriveExpectingBytes(uint32_t bar, uint32_t bytes) {
  asm volatile("mbarrier.arrive.expect_tx.shared::cta.b64 _, [%0], %1;\n" ::"r"(bar), "r"(bytes)
               : "memory");
}
// Orders the barrier initialisation before the peer's first access to it.
__device__ __forceinline__ void FenceBarrierInitForCluster() {
  asm volatile("fence.mbarrier_init.release.cluster;\n" ::: "memory");
}

// The producers of a pair (u = 0..255): thread (warp w, lane l) handles row
// 32 rank + 8 (w % 4) + l % 8 of every chunk and of it the eighth
// e = 4 (w / 4) + l / 8: FP8 pieces j = e + 8 k (k < 4, j < 28; codes of
// dims 16 j .. 16 j + 15, scale byte j / 4) and RoPE piece e (dims
// 448 + 8 e ..). Eight lanes store one core-matrix column.
__device__ void ProducePair(const DecodeParams& p, const WgTask& task, unsigned char* smem, int u,
                            uint32_t rank) {
  const int lane = u & 31;
  const int warp = u >> 5;
  const int r = kPairRows * static_cast<int>(rank) + 8 * (warp & 3) + (lane & 7);
  const int eighth = 4 * (warp >> 2) + (lane >> 3);
  const int fp8_pieces = eighth < 4 ? 4 : 3;
  const uint32_t base = SharedAddress(smem);
  const uint32_t peer = PeerAddress(base, rank ^ 1);
  if (task.num_chunks == 0) return;
  int32_t slot = SlotOf(p, task, 0, r);
  int32_t next = SlotOf(p, task, 1, r);
  uint4 fp8[4];
  uint4 rope;
  uint2 scales;
  auto load = [&](int chunk, int32_t s) {
#pragma unroll
    for (int k = 0; k < 4; ++k) fp8[k] = make_uint4(0, 0, 0, 0);
    rope = make_uint4(0, 0, 0, 0);
    scales = make_uint2(kSkippedRowScales, kSkippedRowScales);
    if (s == -1) return;
    const RowSource source = SourceOf(p, task, chunk, r, s);
#pragma unroll
    for (int k = 0; k < 4; ++k) {
      if (k < fp8_pieces) fp8[k] = __ldg(source.data + eighth + 8 * k);
    }
    rope = __ldg(source.data + 28 + eighth);
    scales = __ldg(reinterpret_cast<const uint2*>(source.scales));
  };
  WaitForPreviousGrid();  // the cache rows may be the previous kernel's
  load(0, slot);
  for (int chunk = 0; chunk < task.num_chunks; ++chunk) {
    const int buffer = chunk & 1;
    const int32_t after = SlotOf(p, task, chunk + 2, r);
    // Both CTAs' consumers are done with this buffer's previous chunk. (The
    // cluster-scope acquire pairs with no release since 0337391; it is kept
    // as the conservative wait, off the critical path: at H = 128 the
    // producers wait here for the consumers anyway.)
    MbarrierWaitCluster(base + WgLayout::kEmpty + 8 * buffer, ((chunk >> 1) & 1) ^ 1);
    const uint32_t tile = WgLayout::kKeys + buffer * kTileBytes;
    const uint32_t peer_full = peer + WgLayout::kFull + 8 * buffer;
#pragma unroll
    for (int k = 0; k < 4; ++k) {
      if (k >= fp8_pieces) continue;
      const int j = eighth + 8 * k;
      uint32_t out[8];
      DequantisePiece(fp8[k], ScaleByte(scales, j >> 2), out);
      const uint4 lo = make_uint4(out[0], out[1], out[2], out[3]);
      const uint4 hi = make_uint4(out[4], out[5], out[6], out[7]);
      const uint32_t at_lo = tile + TileOffset(r, 16 * j);
      const uint32_t at_hi = tile + TileOffset(r, 16 * j + 8);
      *reinterpret_cast<uint4*>(smem + at_lo) = lo;
      *reinterpret_cast<uint4*>(smem + at_hi) = hi;
      StoreToPeer(peer + at_lo, lo, peer_full);
      StoreToPeer(peer + at_hi, hi, peer_full);
    }
    const uint32_t at_rope = tile + TileOffset(r, kNopeDim + 8 * eighth);
    *reinterpret_cast<uint4*>(smem + at_rope) = rope;
    StoreToPeer(peer + at_rope, rope, peer_full);
    if (eighth == 0) {
      const uint32_t at_valid = WgLayout::kValid + 4 * (buffer * kTileRows + r);
      const uint32_t valid = slot != -1;
      *reinterpret_cast<uint32_t*>(smem + at_valid) = valid;
      StoreToPeer(peer + at_valid, valid, peer_full);
    }
    FenceForWgmma();
    MbarrierArrive(base + WgLayout::kFull + 8 * buffer);
    if (u == 0) ArriveExpectingBytes(base + WgLayout::kFull + 8 * buffer, kPeerBytesPerChunk);
    if (chunk + 1 < task.num_chunks) load(chunk + 1, next);
    slot = next;
    next = after;
  }
}

// The consumers' side of a key tile. A pair's tile holds the peer's bytes
// too: the wait acquires at cluster scope what the peer's st.async
// released. The release: every thread arrives on this CTA's barrier, and
// in a pair one thread of the warpgroup also on the peer's (whose producers
// fill this tile too). One thread can speak for its warpgroup there: the
// wgmma that read the tile is warpgroup-collective, so when its wait
// returns in that thread, every warp of the warpgroup is past its reads.
// The arrival on the peer orders no memory access (ArriveOnPeer): what
// keeps the peer's next writes off the tile until the reads are done is
// that those reads are complete before it issues. (The memory model does
// not promise this for a CTA-scope arrival seen by another CTA; CUTLASS's
// cluster pipelines rely on the same, and the GPU tests with racecheck
// pass.)
template <bool kPair>
__device__ __forceinline__ void WaitForTile(uint32_t base, int chunk) {
  const uint32_t full = base + WgLayout::kFull + 8 * (chunk & 1);
  if (kPair) {
    MbarrierWaitCluster(full, (chunk >> 1) & 1);
  } else {
    MbarrierWait(full, (chunk >> 1) & 1);
  }
}
template <bool kPair>
__device__ __forceinline__ void ReleaseTile(uint32_t base, uint32_t peer_base, int chunk,
                                            int wt) {
  MbarrierArrive(base + WgLayout::kEmpty + 8 * (chunk & 1));
  if (kPair && wt == 0) ArriveOnPeer(peer_base + WgLayout::kEmpty + 8 * (chunk & 1));
}
// Where the peer's shared memory starts in the cluster's shared window (a
// pair only; this CTA's offsets apply there too).
template <bool kPair>
__device__ __forceinline__ uint32_t PeerBase(uint32_t base) {
  return kPair ? PeerAddress(base, ClusterRank() ^ 1) : 0;
}

// WG0: S = Q K^T, the softmax, P, and O for dims 0..255.
template <bool kPair>
__device__ void Score(const DecodeParams& p, const WgTask& task, int splits,
                      const Partials& partials, unsigned char* smem, int wt) {
  const uint32_t base = SharedAddress(smem);
  const uint32_t peer_base = PeerBase<kPair>(base);
  const int lane = wt & 31;
  const int g = lane >> 2;
  const int tig = lane & 3;
  const int row0 = (wt >> 5) * 16 + g;  // this thread's heads: row0 and row0 + 8

  WaitForPreviousGrid();  // q is the prologue's
  StoreQ(p, task, smem, wt);
  MbarrierWait(base + WgLayout::kQReady, 0);

  float o[4][32];
#pragma unroll
  for (int n = 0; n < 4; ++n) {
#pragma unroll
    for (int i = 0; i < 32; ++i) o[n][i] = 0.0f;
  }
  // Scores and maxima are kept in log2 units (scaled by log2 e), so that
  // every exponential is one ex2; row_max goes back to natural units at the end.
  const float scale_log2 = p.softmax_scale * 1.4426950408889634f;
  const uint64_t q_tile = KMajorTile(base + WgLayout::kQ);
  float row_max[2] = {-INFINITY, -INFINITY};
  float row_sum[2] = {0.0f, 0.0f};  // this thread's columns only until the end
  float* alphas = reinterpret_cast<float*>(smem + WgLayout::kAlpha);
  for (int chunk = 0; chunk < task.num_chunks; ++chunk) {
    const int buffer = chunk & 1;
    const uint32_t keys = base + WgLayout::kKeys + buffer * kTileBytes;
    WaitForTile<kPair>(base, chunk);

    // S = Q K^T: s[4 i + 2 half + c] is head row0 + 8 half, key 8 i + 2 tig + c.
    float s[32];
#pragma unroll
    for (int i = 0; i < 32; ++i) s[i] = 0.0f;
    WgmmaFence();
    const uint64_t key_tile = KMajorTile(keys);
#pragma unroll
    for (int step = 0; step < kHeadDim / 16; ++step) {
      WgmmaSmemA(s, Advance(q_tile, KStepBytes(step)), Advance(key_tile, KStepBytes(step)),
                    step > 0);
    }
    WgmmaCommit();
    WgmmaWaitAll();
    PinRegisters(s);

    // Online softmax of rows row0, row0 + 8 (the four lanes of a quad hold a
    // row's 64 keys between them).
    const int* valid = reinterpret_cast<const int*>(smem + WgLayout::kValid) + buffer * kTileRows;
    float chunk_max[2] = {-INFINITY, -INFINITY};
#pragma unroll
    for (int i = 0; i < 8; ++i) {
      const int2 ok = *reinterpret_cast<const int2*>(valid + 8 * i + 2 * tig);
#pragma unroll
      for (int c = 0; c < 2; ++c) {
#pragma unroll
        for (int half = 0; half < 2; ++half) {
          float& z = s[4 * i + 2 * half + c];
          z = (c == 0 ? ok.x : ok.y) != 0 ? scale_log2 * z : -INFINITY;
          chunk_max[half] = fmaxf(chunk_max[half], z);
        }
      }
    }
    float alpha[2];
#pragma unroll
    for (int half = 0; half < 2; ++half) {
      chunk_max[half] = fmaxf(chunk_max[half], __shfl_xor_sync(0xffffffffu, chunk_max[half], 1));
      chunk_max[half] = fmaxf(chunk_max[half], __shfl_xor_sync(0xffffffffu, chunk_max[half], 2));
      const float new_max = fmaxf(row_max[half], chunk_max[half]);
      alpha[half] = new_max == -INFINITY ? 1.0f : Exp2(row_max[half] - new_max);
      row_max[half] = new_max;
      row_sum[half] *= alpha[half];
    }
    // A row with no key yet subtracts 0 instead of -inf: its scores are all
    // -inf, and 2^-inf is the 0 they need (not the NaN of -inf - -inf).
    const float subtract[2] = {row_max[0] == -INFINITY ? 0.0f : row_max[0],
                               row_max[1] == -INFINITY ? 0.0f : row_max[1]};
#pragma unroll
    for (int i = 0; i < 32; ++i) {
      const int half = (i >> 1) & 1;
      s[i] = Exp2(s[i] - subtract[half]);
      row_sum[half] += s[i];
    }
    // P as the A operand of P V, k-step j covering keys 16 j .. 16 j + 15.
    uint32_t pa[4][4];
#pragma unroll
    for (int j = 0; j < 4; ++j) {
      pa[j][0] = PackBf16(s[8 * j + 0], s[8 * j + 1]);
      pa[j][1] = PackBf16(s[8 * j + 2], s[8 * j + 3]);
      pa[j][2] = PackBf16(s[8 * j + 4], s[8 * j + 5]);
      pa[j][3] = PackBf16(s[8 * j + 6], s[8 * j + 7]);
    }
#pragma unroll
    for (int j = 0; j < 4; ++j) PinRegisters(pa[j]);
    // Hand P and alpha to WG1 once it is done with the previous chunk's.
    if (chunk > 0) MbarrierWait(base + WgLayout::kPFree, (chunk - 1) & 1);
#pragma unroll
    for (int j = 0; j < 4; ++j) {
#pragma unroll
      for (int r = 0; r < 4; ++r) {
        const int head = row0 + 8 * (r & 1);
        const int key = 16 * j + 8 * (r >> 1) + 2 * tig;
        *reinterpret_cast<uint32_t*>(smem + WgLayout::kP + TileOffset(head, key)) = pa[j][r];
      }
    }
    if (tig == 0) {
      alphas[row0] = alpha[0];
      alphas[row0 + 8] = alpha[1];
    }
    FenceForWgmma();
    MbarrierArrive(base + WgLayout::kPReady);

    // O[:, 0:256] = O * alpha + P V.
    RescaleForMma(o, alpha);
    const uint64_t value_tile = ValueTile(keys);
#pragma unroll
    for (int j = 0; j < 4; ++j) {
      WgmmaRegisterA128<0>(o, pa[j], Advance(value_tile, ValueStepBytes(0, j)));
      WgmmaRegisterA128<1>(o, pa[j], Advance(value_tile, ValueStepBytes(128, j)));
    }
    WgmmaCommit();
    WgmmaWaitAll();
#pragma unroll
    for (int n = 0; n < 4; ++n) PinRegisters(o[n]);
    ReleaseTile<kPair>(base, peer_base, chunk, wt);
  }

  // The row sums over the quad, the maxima in natural units; the final state
  // for WG1.
#pragma unroll
  for (int half = 0; half < 2; ++half) {
    row_max[half] *= 0.6931471805599453f;  // ln 2; -inf stays -inf
    row_sum[half] += __shfl_xor_sync(0xffffffffu, row_sum[half], 1);
    row_sum[half] += __shfl_xor_sync(0xffffffffu, row_sum[half], 2);
  }
  if (tig == 0) {
    float* maxima = reinterpret_cast<float*>(smem + WgLayout::kRowMax);
    float* sums = reinterpret_cast<float*>(smem + WgLayout::kRowSum);
    maxima[row0] = row_max[0];
    maxima[row0 + 8] = row_max[1];
    sums[row0] = row_sum[0];
    sums[row0 + 8] = row_sum[1];
  }
  MbarrierArrive(base + WgLayout::kStateReady);
  MbarrierWait(base + WgLayout::kStateReady, 0);
  WriteOutput(p, task, splits, partials, o, row0, 0, row_max, row_sum, smem);
}

// WG1: O for dims 256..511, with P and alpha from WG0.
template <bool kPair>
__device__ void Value(const DecodeParams& p, const WgTask& task, int splits,
                      const Partials& partials, unsigned char* smem, int wt) {
  const uint32_t base = SharedAddress(smem);
  const uint32_t peer_base = PeerBase<kPair>(base);
  WaitForPreviousGrid();  // q is the prologue's
  StoreQ(p, task, smem, 128 + wt);
  const int row0 = (wt >> 5) * 16 + ((wt & 31) >> 2);
  const float* alphas = reinterpret_cast<const float*>(smem + WgLayout::kAlpha);
  const uint64_t p_tile = KMajorTile(base + WgLayout::kP);
  float o[4][32];
#pragma unroll
  for (int n = 0; n < 4; ++n) {
#pragma unroll
    for (int i = 0; i < 32; ++i) o[n][i] = 0.0f;
  }
  for (int chunk = 0; chunk < task.num_chunks; ++chunk) {
    const int buffer = chunk & 1;
    const uint32_t keys = base + WgLayout::kKeys + buffer * kTileBytes;
    WaitForTile<kPair>(base, chunk);
    const uint64_t value_tile = ValueTile(keys);
    MbarrierWait(base + WgLayout::kPReady, chunk & 1);
    const float alpha[2] = {alphas[row0], alphas[row0 + 8]};
    RescaleForMma(o, alpha);
#pragma unroll
    for (int j = 0; j < 4; ++j) {
      WgmmaSmemA128<0>(o, Advance(p_tile, KStepBytes(j)),
                       Advance(value_tile, ValueStepBytes(kHeadDim / 2, j)));
      WgmmaSmemA128<1>(o, Advance(p_tile, KStepBytes(j)),
                       Advance(value_tile, ValueStepBytes(kHeadDim / 2 + 128, j)));
    }
    WgmmaCommit();
    WgmmaWaitAll();
#pragma unroll
    for (int n = 0; n < 4; ++n) PinRegisters(o[n]);
    if (chunk + 1 < task.num_chunks) MbarrierArrive(base + WgLayout::kPFree);
    ReleaseTile<kPair>(base, peer_base, chunk, wt);
  }
  MbarrierArrive(base + WgLayout::kStateReady);
  MbarrierWait(base + WgLayout::kStateReady, 0);
  const float row_max[2] = {reinterpret_cast<const float*>(smem + WgLayout::kRowMax)[row0],
                            reinterpret_cast<const float*>(smem + WgLayout::kRowMax)[row0 + 8]};
  const float row_sum[2] = {reinterpret_cast<const float*>(smem + WgLayout::kRowSum)[row0],
                            reinterpret_cast<const float*>(smem + WgLayout::kRowSum)[row0 + 8]};
  WriteOutput(p, task, splits, partials, o, row0, kHeadDim / 2, row_max, row_sum, smem);
}

// setmaxnreg: the registers of the four warpgroups, together at most what
// the launch gave (4 x 128, the cap of __launch_bounds__(512, 1)): WG0 holds
// S, P and half of O; WG1 half of O; a producer a quarter row of loads (an
// eighth in a pair).
constexpr int kLaunchRegisters = 128;
constexpr int kScoreRegisters = 208;
constexpr int kValueRegisters = 168;
constexpr int kProducerRegisters = 64;
static_assert(kScoreRegisters + kValueRegisters + 2 * kProducerRegisters <= 4 * kLaunchRegisters,
              "setmaxnreg.inc would wait forever for registers");

template <bool kPair>
__global__ void __launch_bounds__(kWgThreads, 1)
    DecodeWgmmaKernel(const DecodeParams p, int groups, int splits, int split_entries,
                      Partials partials) {
  extern __shared__ __align__(1024) unsigned char smem[];
  // blockIdx.x: token-major, the `groups` 64-head groups of a token (the
  // plan's) adjacent, so that a pair's two CTAs are one cluster; x has room
  // for any batch.
  const int h0 = static_cast<int>(blockIdx.x % groups) * kTileRows;
  const WgTask task = MakeTask(p, blockIdx.x / groups, h0, min(kTileRows, p.padded_heads - h0),
                               blockIdx.y, split_entries);

  AllowNextGrid();
  const int tid = threadIdx.x;
  if (tid == 0) {
    const uint32_t base = SharedAddress(smem);
    for (int b = 0; b < 2; ++b) {
      // The producers' threads (and the peer's bytes, announced by one of them).
      MbarrierInit(base + WgLayout::kFull + 8 * b, kPair ? kPairFullArrivals : 256);
      // WG0's and WG1's threads (and one thread of each of the peer's).
      MbarrierInit(base + WgLayout::kEmpty + 8 * b, kPair ? kPairEmptyArrivals : 256);
    }
    MbarrierInit(base + WgLayout::kPReady, 128);  // WG0's
    MbarrierInit(base + WgLayout::kPFree, 128);   // WG1's
    MbarrierInit(base + WgLayout::kStateReady, 256);
    MbarrierInit(base + WgLayout::kStaged, 256);
    MbarrierInit(base + WgLayout::kQReady, 256);
    if (kPair) FenceBarrierInitForCluster();
  }
  __syncthreads();
  if (kPair) ClusterSync();  // the peer's barriers exist before anything reaches them
  const int role = tid / 128;
  if (role == 0) {
    asm volatile("setmaxnreg.inc.sync.aligned.u32 %0;\n" ::"n"(kScoreRegisters));
    Score<kPair>(p, task, splits, partials, smem, tid);
  } else if (role == 1) {
    asm volatile("setmaxnreg.inc.sync.aligned.u32 %0;\n" ::"n"(kValueRegisters));
    Value<kPair>(p, task, splits, partials, smem, tid - 128);
  } else {
    asm volatile("setmaxnreg.dec.sync.aligned.u32 %0;\n" ::"n"(kProducerRegisters));
    if (kPair) {
      ProducePair(p, task, smem, tid - 256, ClusterRank());
    } else {
      Produce<WgLayout>(p, task, smem, tid - 256);
    }
  }
  // The peer may still arrive on this CTA's barriers until it is done.
  if (kPair) ClusterSync();
}

template <bool kPair>
cudaError_t LaunchWgmma(const DecodeParams& p, dim3 grid, int groups, int splits,
                        int split_entries, const Partials& partials, cudaStream_t stream) {
  const cudaError_t error =
      PrepareWarpSpecialised<DecodeWgmmaKernel<kPair>, kLaunchRegisters>(WgLayout::kBytes);
  if (error != cudaSuccess) return error;
  return LaunchOverlapped(DecodeWgmmaKernel<kPair>, grid, kWgThreads, WgLayout::kBytes, stream,
                          kPair ? 2 : 1, p, groups, splits, split_entries, partials);
}

}  // namespace

cudaError_t LaunchDecodeWgmma(const DecodeParams& p, int groups, int splits, int split_entries,
                              float* partial_o, float* partial_ml, cudaStream_t stream) {
  const dim3 grid(static_cast<unsigned>(p.num_tokens * groups), splits);
  const Partials partials{partial_o, partial_ml};
  // Hp 72..128: the two head groups of a token as a pair.
  return groups == 2 ? LaunchWgmma<true>(p, grid, groups, splits, split_entries, partials, stream)
                     : LaunchWgmma<false>(p, grid, groups, splits, split_entries, partials, stream);
}

}  // namespace cuda
}  // namespace mla

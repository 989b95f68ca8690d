// Sparse MLA decode (spec section 5) with Hopper's warpgroup MMA (wgmma):
// one CTA per 64 heads of a token (and per split of its keys), keys in
// chunks of 64. Made for Hp = 64 and 128; a smaller Hp fills the MMA's 64
// rows with zero queries whose results are dropped (the gather, not the
// MMAs, bounds those shapes). The default decode kernel (MLA_CUDA_DECODE,
// see decode_kernels.h); kernels/bench/RESULTS.md has its figures and limits.
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
//     one of two key tiles and signal
//     the consumers through an mbarrier; the consumers free a tile through
//     another. Eight warps issue the loads: with the same bytes in flight, a
//     gather runs faster from more warps (RESULTS.md).
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
#include "kernels/geometry.h"

namespace mla {
namespace cuda {
namespace {

constexpr int kWgThreads = 512;  // four warpgroups: two consumers, two producers
constexpr int kTileRows = 64;    // heads of a CTA; keys of a chunk
constexpr uint32_t kTileBytes = kTileRows * kHeadDim * 2;

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

// Byte offset of element (row, col) of a 64-row bf16 tile made of 8 x 8 core
// matrices: the 8 columns 8c .. 8c + 7 of a row are 16 contiguous bytes, the
// 64 rows of column group c follow each other (1 KiB), and the column
// groups follow each other. K-major for rows = heads (Q, P) or keys (K);
// read with rows = keys as the reduction dimension, MN-major (V).
__device__ __forceinline__ uint32_t TileOffset(int row, int col) {
  return static_cast<uint32_t>((col >> 3) * (kTileRows * 16) + row * 16 + (col & 7) * 2);
}

// A wgmma shared-memory matrix descriptor without swizzling: start address,
// leading-dimension byte offset (between core matrices along the reduction
// dimension for K-major operands; along it also for MN-major ones) and
// stride-dimension byte offset (between core matrices along M or N).
__device__ __forceinline__ uint64_t MatrixDescriptor(uint32_t address, uint32_t leading,
                                                     uint32_t stride) {
  return static_cast<uint64_t>((address & 0x3ffffu) >> 4) |
         static_cast<uint64_t>(leading >> 4) << 16 | static_cast<uint64_t>(stride >> 4) << 32;
}

// A descriptor moved by `bytes` (a multiple of 16): its start address is the
// low 14 bits in 16-byte units, and no shared address (below 228 KiB) carries
// out of them, so the other fields stay as they are. Computing a tile's
// descriptor once and moving it by constants keeps the address arithmetic
// off the MMAs' issue path.
__device__ __forceinline__ uint64_t Advance(uint64_t descriptor, uint32_t bytes) {
  return descriptor + (bytes >> 4);
}

// A K-major tile (core matrices 1 KiB apart along the columns, 128 bytes
// apart along the rows); k-step `step` (16 columns) is Advance(d, KStepBytes(step)).
__device__ __forceinline__ uint64_t KMajorTile(uint32_t tile) {
  return MatrixDescriptor(tile, kTileRows * 16, 128);
}
__host__ __device__ constexpr uint32_t KStepBytes(int step) { return step * 2 * (kTileRows * 16); }

// A key tile as V, an MN-major operand: along the keys (the reduction) core
// matrices are 128 bytes apart, along the dims 1 KiB. Keys 16 step .. + 15
// and dims dim0 .. dim0 + 63 are Advance(d, ValueStepBytes(dim0, step)).
__device__ __forceinline__ uint64_t ValueTile(uint32_t tile) {
  return MatrixDescriptor(tile, 128, kTileRows * 16);
}
__host__ __device__ constexpr uint32_t ValueStepBytes(int dim0, int step) {
  return (dim0 >> 3) * (kTileRows * 16) + step * 16 * 16;
}

__device__ __forceinline__ uint32_t SharedAddress(const void* pointer) {
  return static_cast<uint32_t>(__cvta_generic_to_shared(pointer));
}

__device__ __forceinline__ void WgmmaFence() { asm volatile("wgmma.fence.sync.aligned;\n" ::: "memory"); }
__device__ __forceinline__ void WgmmaCommit() {
  asm volatile("wgmma.commit_group.sync.aligned;\n" ::: "memory");
}
__device__ __forceinline__ void WgmmaWaitAll() {
  asm volatile("wgmma.wait_group.sync.aligned 0;\n" ::: "memory");
}

// Keeps the compiler from moving reads or writes of the accumulators across
// the asynchronous wgmma (their values change only at the wait).
template <int N>
__device__ __forceinline__ void PinRegisters(float (&d)[N]) {
#pragma unroll
  for (int i = 0; i < N; ++i) asm volatile("" : "+f"(d[i])::"memory");
}
template <int N>
__device__ __forceinline__ void PinRegisters(uint32_t (&d)[N]) {
#pragma unroll
  for (int i = 0; i < N; ++i) asm volatile("" : "+r"(d[i])::"memory");
}

// D[64 x 64] (+)= A B, A a 64 x 16 tile from shared memory (K-major), B 16 x
// 64 from shared memory (K-major, or MN-major with kTransB).
template <int kTransB>
__device__ __forceinline__ void WgmmaSmemA(float (&d)[32], uint64_t a, uint64_t b,
                                           int accumulate) {
  asm volatile(
      "{\n.reg .pred p;\nsetp.ne.b32 p, %34, 0;\n"
      "wgmma.mma_async.sync.aligned.m64n64k16.f32.bf16.bf16 "
      "{%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15, %16, %17, %18, "
      "%19, %20, %21, %22, %23, %24, %25, %26, %27, %28, %29, %30, %31}, %32, %33, p, 1, 1, 0, "
      "%35;\n}\n"
      : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3]), "+f"(d[4]), "+f"(d[5]), "+f"(d[6]),
        "+f"(d[7]), "+f"(d[8]), "+f"(d[9]), "+f"(d[10]), "+f"(d[11]), "+f"(d[12]), "+f"(d[13]),
        "+f"(d[14]), "+f"(d[15]), "+f"(d[16]), "+f"(d[17]), "+f"(d[18]), "+f"(d[19]), "+f"(d[20]),
        "+f"(d[21]), "+f"(d[22]), "+f"(d[23]), "+f"(d[24]), "+f"(d[25]), "+f"(d[26]), "+f"(d[27]),
        "+f"(d[28]), "+f"(d[29]), "+f"(d[30]), "+f"(d[31])
      : "l"(a), "l"(b), "r"(accumulate), "n"(kTransB));
}

// D[64 x 64] += A B, A a 64 x 16 bf16 tile in registers (the layout of
// mma.m16n8k16's A, warp w holding rows 16w .. 16w + 15), B MN-major.
__device__ __forceinline__ void WgmmaRegisterA(float (&d)[32], const uint32_t (&a)[4],
                                               uint64_t b) {
  asm volatile(
      "{\n.reg .pred p;\nsetp.ne.b32 p, 1, 0;\n"
      "wgmma.mma_async.sync.aligned.m64n64k16.f32.bf16.bf16 "
      "{%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15, %16, %17, %18, "
      "%19, %20, %21, %22, %23, %24, %25, %26, %27, %28, %29, %30, %31}, {%32, %33, %34, %35}, "
      "%36, p, 1, 1, 1;\n}\n"
      : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3]), "+f"(d[4]), "+f"(d[5]), "+f"(d[6]),
        "+f"(d[7]), "+f"(d[8]), "+f"(d[9]), "+f"(d[10]), "+f"(d[11]), "+f"(d[12]), "+f"(d[13]),
        "+f"(d[14]), "+f"(d[15]), "+f"(d[16]), "+f"(d[17]), "+f"(d[18]), "+f"(d[19]), "+f"(d[20]),
        "+f"(d[21]), "+f"(d[22]), "+f"(d[23]), "+f"(d[24]), "+f"(d[25]), "+f"(d[26]), "+f"(d[27]),
        "+f"(d[28]), "+f"(d[29]), "+f"(d[30]), "+f"(d[31])
      : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "l"(b));
}

__device__ __forceinline__ void MbarrierInit(uint32_t bar, uint32_t count) {
  asm volatile("mbarrier.init.shared::cta.b64 [%0], %1;\n" ::"r"(bar), "r"(count) : "memory");
}
__device__ __forceinline__ void MbarrierArrive(uint32_t bar) {
  asm volatile("{\n.reg .b64 state;\nmbarrier.arrive.shared::cta.b64 state, [%0];\n}\n" ::"r"(bar)
               : "memory");
}
// Waits for the completion of the barrier's phase of parity `parity`.
__device__ __forceinline__ void MbarrierWait(uint32_t bar, uint32_t parity) {
  asm volatile(
      "{\n.reg .pred done;\nmbarrier_wait:\n"
      "mbarrier.try_wait.parity.shared::cta.b64 done, [%0], %1;\n"
      "@!done bra mbarrier_wait;\n}\n" ::"r"(bar),
      "r"(parity)
      : "memory");
}
// Makes this thread's shared-memory stores visible to wgmma's reads.
__device__ __forceinline__ void FenceForWgmma() {
  asm volatile("fence.proxy.async.shared::cta;\n" ::: "memory");
}

// Two floats as bf16 (round to nearest even), `lo` in the low half.
__device__ __forceinline__ uint32_t PackBf16(float lo, float hi) {
  uint32_t packed;
  asm("cvt.rn.bf16x2.f32 %0, %1, %2;\n" : "=r"(packed) : "f"(hi), "f"(lo));
  return packed;
}

// 2^x (ex2.approx, subnormal results flushed to zero; 2^-inf = 0).
__device__ __forceinline__ float Exp2(float x) {
  float y;
  asm("ex2.approx.ftz.f32 %0, %1;\n" : "=f"(y) : "f"(x));
  return y;
}

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

struct WgTask {
  int64_t t;
  int h0;
  int heads_here;  // rows of q this CTA reads (below 64 when Hp < 64)
  int split;
  int main_len;
  int begin;
  int end;
  int num_chunks;
};

// The producers: thread (warp w of the two warpgroups, lane l) handles row
// r = 8w + l % 8 of each chunk, and of it the 16-byte pieces l / 8 + 4k: FP8
// pieces k = 0..6 (dims 16 (l / 8 + 4k) .., scale byte k) and RoPE pieces
// k = 0, 1. Eight lanes store one core-matrix column: 128 contiguous bytes.
// The loads of a chunk's row go out as soon as the previous chunk's copy of
// that row is stored and its tile announced, so they have the consumers'
// time on a whole chunk to arrive; the slots come two chunks ahead.
struct RowPieces {
  uint4 pieces[9];  // FP8 pieces 0..6, RoPE pieces 7, 8
  uint2 scales;
};

__device__ __forceinline__ void LoadRow(const DecodeParams& p, const WgTask& task, int chunk,
                                        int r, int32_t slot, int part, RowPieces& row) {
  const uint4 zero = make_uint4(0, 0, 0, 0);
#pragma unroll
  for (int q = 0; q < 9; ++q) row.pieces[q] = zero;
  // A skipped row: zero codes with a scale the bf16x2 path takes (+0s).
  row.scales = make_uint2(0x7f7f7f7fu, 0x7f7f7f7fu);
  if (slot == -1) return;
  const int e = task.begin + chunk * kTileRows + r;
  const uint8_t* pool = e < task.main_len ? p.main.pool.base : p.extra.pool.base;
  const uint8_t* block = pool + static_cast<int64_t>(slot / kBlockTokens) * kBlockBytes;
  const int offset = slot % kBlockTokens;
  const uint4* data = reinterpret_cast<const uint4*>(block + offset * kTokenDataBytes);
#pragma unroll
  for (int q = 0; q < 7; ++q) row.pieces[q] = __ldg(data + part + 4 * q);
  row.pieces[7] = __ldg(data + 28 + part);
  row.pieces[8] = __ldg(data + 32 + part);
  row.scales = __ldg(reinterpret_cast<const uint2*>(block + kBlockTokens * kTokenDataBytes +
                                                   offset * kTokenScaleBytes));
}

__device__ __forceinline__ void StoreRow(const RowPieces& row, int r, int part,
                                         unsigned char* tile) {
#pragma unroll
  for (int q = 0; q < 7; ++q) {
    const uint32_t scale_word = q < 4 ? row.scales.x : row.scales.y;
    const uint32_t scale_byte = (scale_word >> (8 * (q & 3))) & 0xffu;
    uint32_t out[8];
    DequantisePiece(row.pieces[q], scale_byte, out);
    const int dim = 16 * (part + 4 * q);
    *reinterpret_cast<uint4*>(tile + TileOffset(r, dim)) =
        make_uint4(out[0], out[1], out[2], out[3]);
    *reinterpret_cast<uint4*>(tile + TileOffset(r, dim + 8)) =
        make_uint4(out[4], out[5], out[6], out[7]);
  }
  *reinterpret_cast<uint4*>(tile + TileOffset(r, kNopeDim + 8 * part)) = row.pieces[7];
  *reinterpret_cast<uint4*>(tile + TileOffset(r, kNopeDim + 8 * (part + 4))) = row.pieces[8];
}

__device__ void Produce(const DecodeParams& p, const WgTask& task, unsigned char* smem, int wt) {
  const int part = (wt & 31) >> 3;
  const int r = (wt >> 5) * 8 + (wt & 7);
  const uint32_t base = SharedAddress(smem);
  auto slot_of = [&](int chunk) -> int32_t {
    const int e = task.begin + chunk * kTileRows + r;
    if (chunk >= task.num_chunks || e >= task.end) return -1;
    return e < task.main_len ? __ldg(p.main.indices + task.t * p.main.width + e)
                             : __ldg(p.extra.indices + task.t * p.extra.width + (e - task.main_len));
  };
  int32_t slot = slot_of(0);
  int32_t next = slot_of(1);
  RowPieces row;
  LoadRow(p, task, 0, r, slot, part, row);
  for (int chunk = 0; chunk < task.num_chunks; ++chunk) {
    const int buffer = chunk & 1;
    const int32_t after = slot_of(chunk + 2);
    // The consumers are done with this buffer's previous chunk (none before
    // chunk 2: the wait on the phase before the first returns at once).
    MbarrierWait(base + WgLayout::kEmpty + 8 * buffer, ((chunk >> 1) & 1) ^ 1);
    unsigned char* tile = smem + WgLayout::kKeys + buffer * kTileBytes;
    StoreRow(row, r, part, tile);
    if (part == 0) reinterpret_cast<int*>(smem + WgLayout::kValid)[buffer * kTileRows + r] = slot != -1;
    FenceForWgmma();
    MbarrierArrive(base + WgLayout::kFull + 8 * buffer);
    // The tile is announced before the next chunk's loads go out: a fence
    // or release after them may wait for them (RESULTS.md).
    if (chunk + 1 < task.num_chunks) LoadRow(p, task, chunk + 1, r, next, part, row);
    slot = next;
    next = after;
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

// Q into shared memory, by WG0 and WG1 together (u = 0..255): thread u
// copies dims 16 c .. 16 c + 15 of head u % 64 for c = u / 64 + 4k (a warp
// reads 32 B of 32 heads; 8 lanes store 128 B); rows past heads_here are
// zero. All 16 loads are in flight before the first store: one memory
// latency, not one per step. Then u arrives on kQReady.
__device__ __forceinline__ void StoreQ(const DecodeParams& p, const WgTask& task,
                                       unsigned char* smem, int u) {
  const uint16_t* q = p.q + (task.t * p.padded_heads + task.h0) * kHeadDim;
  const int q_head = u & 63;
  uint4 q_pieces[16];
#pragma unroll
  for (int k = 0; k < 8; ++k) {
    const int c = (u >> 6) + 4 * k;
    q_pieces[2 * k] = q_pieces[2 * k + 1] = make_uint4(0, 0, 0, 0);
    if (q_head < task.heads_here) {
      const uint4* src = reinterpret_cast<const uint4*>(q + q_head * kHeadDim) + 2 * c;
      q_pieces[2 * k] = __ldg(src);
      q_pieces[2 * k + 1] = __ldg(src + 1);
    }
  }
#pragma unroll
  for (int k = 0; k < 8; ++k) {
    const int c = (u >> 6) + 4 * k;
    *reinterpret_cast<uint4*>(smem + WgLayout::kQ + TileOffset(q_head, 16 * c)) = q_pieces[2 * k];
    *reinterpret_cast<uint4*>(smem + WgLayout::kQ + TileOffset(q_head, 16 * c + 8)) =
        q_pieces[2 * k + 1];
  }
  FenceForWgmma();
  MbarrierArrive(SharedAddress(smem) + WgLayout::kQReady);
}

// WG0: S = Q K^T, the softmax, P, and O for dims 0..255.
__device__ void Score(const DecodeParams& p, const WgTask& task, int splits,
                      const Partials& partials, unsigned char* smem, int wt) {
  const uint32_t base = SharedAddress(smem);
  const int lane = wt & 31;
  const int g = lane >> 2;
  const int tig = lane & 3;
  const int row0 = (wt >> 5) * 16 + g;  // this thread's heads: row0 and row0 + 8

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
    MbarrierWait(base + WgLayout::kFull + 8 * buffer, (chunk >> 1) & 1);

    // S = Q K^T: s[4 i + 2 half + c] is head row0 + 8 half, key 8 i + 2 tig + c.
    float s[32];
#pragma unroll
    for (int i = 0; i < 32; ++i) s[i] = 0.0f;
    WgmmaFence();
    const uint64_t key_tile = KMajorTile(keys);
#pragma unroll
    for (int step = 0; step < kHeadDim / 16; ++step) {
      WgmmaSmemA<0>(s, Advance(q_tile, KStepBytes(step)), Advance(key_tile, KStepBytes(step)),
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
#pragma unroll
      for (int n = 0; n < 4; ++n) {
        WgmmaRegisterA(o[n], pa[j], Advance(value_tile, ValueStepBytes(64 * n, j)));
      }
    }
    WgmmaCommit();
    WgmmaWaitAll();
#pragma unroll
    for (int n = 0; n < 4; ++n) PinRegisters(o[n]);
    MbarrierArrive(base + WgLayout::kEmpty + 8 * buffer);
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
__device__ void Value(const DecodeParams& p, const WgTask& task, int splits,
                      const Partials& partials, unsigned char* smem, int wt) {
  const uint32_t base = SharedAddress(smem);
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
    MbarrierWait(base + WgLayout::kFull + 8 * buffer, (chunk >> 1) & 1);
    const uint64_t value_tile = ValueTile(keys);
    MbarrierWait(base + WgLayout::kPReady, chunk & 1);
    const float alpha[2] = {alphas[row0], alphas[row0 + 8]};
    RescaleForMma(o, alpha);
#pragma unroll
    for (int j = 0; j < 4; ++j) {
#pragma unroll
      for (int n = 0; n < 4; ++n) {
        WgmmaSmemA<1>(o[n], Advance(p_tile, KStepBytes(j)),
                      Advance(value_tile, ValueStepBytes(kHeadDim / 2 + 64 * n, j)), 1);
      }
    }
    WgmmaCommit();
    WgmmaWaitAll();
#pragma unroll
    for (int n = 0; n < 4; ++n) PinRegisters(o[n]);
    if (chunk + 1 < task.num_chunks) MbarrierArrive(base + WgLayout::kPFree);
    MbarrierArrive(base + WgLayout::kEmpty + 8 * buffer);
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
// S, P and half of O; WG1 half of O; a producer a quarter row of loads.
constexpr int kLaunchRegisters = 128;
constexpr int kScoreRegisters = 208;
constexpr int kValueRegisters = 168;
constexpr int kProducerRegisters = 64;
static_assert(kScoreRegisters + kValueRegisters + 2 * kProducerRegisters <= 4 * kLaunchRegisters,
              "setmaxnreg.inc would wait forever for registers");

__global__ void __launch_bounds__(kWgThreads, 1)
    DecodeWgmmaKernel(const DecodeParams p, int splits, int split_entries, Partials partials) {
  extern __shared__ __align__(1024) unsigned char smem[];
  // blockIdx.x: token-major, the head groups of a token adjacent (the second
  // group's row reads find the first's in L2); x has room for any batch.
  const int groups = (p.padded_heads + kTileRows - 1) / kTileRows;
  WgTask task;
  task.t = blockIdx.x / groups;
  task.h0 = static_cast<int>(blockIdx.x % groups) * kTileRows;
  task.heads_here = min(kTileRows, p.padded_heads - task.h0);
  task.split = blockIdx.y;
  task.main_len = ListLength(p.main, task.t);
  const int total = task.main_len + ListLength(p.extra, task.t);
  task.begin = task.split * split_entries;
  task.end = min(total, task.begin + split_entries);
  task.num_chunks = task.begin < task.end ? (task.end - task.begin + kTileRows - 1) / kTileRows : 0;

  const int tid = threadIdx.x;
  if (tid == 0) {
    const uint32_t base = SharedAddress(smem);
    for (int b = 0; b < 2; ++b) {
      MbarrierInit(base + WgLayout::kFull + 8 * b, 256);   // the producers' threads
      MbarrierInit(base + WgLayout::kEmpty + 8 * b, 256);  // WG0's and WG1's
    }
    MbarrierInit(base + WgLayout::kPReady, 128);  // WG0's
    MbarrierInit(base + WgLayout::kPFree, 128);   // WG1's
    MbarrierInit(base + WgLayout::kStateReady, 256);
    MbarrierInit(base + WgLayout::kStaged, 256);
    MbarrierInit(base + WgLayout::kQReady, 256);
  }
  __syncthreads();
  const int role = tid / 128;
  if (role == 0) {
    asm volatile("setmaxnreg.inc.sync.aligned.u32 %0;\n" ::"n"(kScoreRegisters));
    Score(p, task, splits, partials, smem, tid);
  } else if (role == 1) {
    asm volatile("setmaxnreg.inc.sync.aligned.u32 %0;\n" ::"n"(kValueRegisters));
    Value(p, task, splits, partials, smem, tid - 128);
  } else {
    asm volatile("setmaxnreg.dec.sync.aligned.u32 %0;\n" ::"n"(kProducerRegisters));
    Produce(p, task, smem, tid - 256);
  }
}

}  // namespace

cudaError_t LaunchDecodeWgmma(const DecodeParams& p, int groups, int splits, int split_entries,
                              float* partial_o, float* partial_ml, cudaStream_t stream) {
  // Compiled with fewer registers than kLaunchRegisters, the launch would
  // leave too few for WG0's setmaxnreg.inc, which would then never return.
  static const int registers = [] {
    cudaFuncAttributes attributes;
    return cudaFuncGetAttributes(&attributes, DecodeWgmmaKernel) == cudaSuccess
               ? attributes.numRegs
               : -1;
  }();
  if (registers != kLaunchRegisters) return cudaErrorInvalidKernelImage;
  cudaError_t error = cudaFuncSetAttribute(
      DecodeWgmmaKernel, cudaFuncAttributeMaxDynamicSharedMemorySize, WgLayout::kBytes);
  if (error != cudaSuccess) return error;
  const dim3 grid(static_cast<unsigned>(p.num_tokens * groups), splits);
  DecodeWgmmaKernel<<<grid, kWgThreads, WgLayout::kBytes, stream>>>(
      p, splits, split_entries, Partials{partial_o, partial_ml});
  return cudaGetLastError();
}

}  // namespace cuda
}  // namespace mla

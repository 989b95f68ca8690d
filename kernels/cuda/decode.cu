// Sparse MLA decode with attention sink (spec section 5).
//
// Implementations of the same algorithm: the default, warpgroup MMA, is
// decode_narrow.cu's DecodeNarrowKernel for Hp <= 32 (the heads as the
// MMA's N) and decode_wgmma.cu's DecodeWgmmaKernel (64 heads a CTA) for
// Hp >= 40, or at every Hp with MLA_CUDA_DECODE=padded; here
// DecodeMmaKernel (tensor cores, mma.sync bf16 -> fp32, 16 or 32 heads a
// CTA; MLA_CUDA_DECODE=mma, described further down) and DecodeKernel (CUDA
// cores, fp32 throughout; MLA_CUDA_DECODE=simt, kept as a cross-check).
// This file also plans the key splits and launches the combine for all of
// them. The CUDA-core one:
//
// One CTA of 256 threads handles one token, a group of HG heads (HG = 16, or
// 8 when Hp is not a multiple of 16) and a range of its key entries (all of them, or one split of
// them when there are too few tokens to fill the GPU; a combine kernel then
// merges the splits). Keys are processed in chunks of KC = 512 / HG entries:
//   1. dequantise the chunk's FP8 rows into shared memory as bf16 (exact: an
//      e4m3 value times a power of two has 4 significant bits), each row read
//      from global memory once for all HG heads; -1 entries and entries past
//      the token's lengths become zero rows with -inf scores;
//   2. scores S[h][c] = scale * <q_h, K_c> in fp32 (each thread a 4x4 tile of
//      heads x keys over one eighth of the dims, reduced with shuffles);
//   3. online softmax per head: running max m, running denominator l summed
//      from unrounded fp32 probabilities;
//   4. o[h] = o[h] * alpha + P[h] . V (each thread two dims of every head).
// Main (SWA) and extra (compressed) entries form one list: entry e < main_len
// is main entry e, the rest are extra entries; duplicates count twice.
#include <cuda_runtime.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <iterator>
#include <string>

#include "kernels/cuda/decode_device.cuh"
#include "kernels/cuda/kernels.h"
#include "kernels/geometry.h"

namespace mla {
namespace cuda {
namespace {

constexpr int kThreads = 256;
// Row stride of the key chunk in 32-bit words (256 words of data + 2): makes
// the score loop's loads from four key rows hit distinct banks.
constexpr int kKeyStride = 258;
constexpr int kChunksPerRow = 36;  // 28 x 16 e4m3 bytes + 8 x 16 bytes of bf16

template <int HG>
struct Layout {
  static constexpr int KC = 512 / HG;
  static constexpr int kKeyWords = KC * kKeyStride;
  static constexpr int kQFloats = HG * kHeadDim;
  static constexpr size_t kBytes =
      sizeof(uint32_t) * kKeyWords + sizeof(float) * (kQFloats + 2 * HG * KC + 3 * HG) +
      sizeof(int) * KC;
};

__device__ __forceinline__ float LowBf16(uint32_t word) { return __uint_as_float(word << 16); }
__device__ __forceinline__ float HighBf16(uint32_t word) {
  return __uint_as_float(word & 0xffff0000u);
}

struct Entry {
  const uint8_t* data;    // null: skipped entry
  const uint8_t* scales;
};

__device__ __forceinline__ Entry LookUp(const DecodeParams& p, int64_t t, int e, int main_len) {
  int32_t slot;
  const uint8_t* base;
  if (e < main_len) {
    slot = __ldg(p.main.indices + t * p.main.width + e);
    base = p.main.pool.base;
  } else {
    slot = __ldg(p.extra.indices + t * p.extra.width + (e - main_len));
    base = p.extra.pool.base;
  }
  if (slot == -1) return {nullptr, nullptr};
  const int64_t block = slot / kBlockTokens;
  const int64_t offset = slot % kBlockTokens;
  const uint8_t* block_base = base + block * kBlockBytes;
  return {block_base + offset * kTokenDataBytes,
          block_base + int64_t{kBlockTokens} * kTokenDataBytes + offset * kTokenScaleBytes};
}

// One head's online-softmax step, run by a whole warp: sums the lanes' new
// probabilities and, in lane 0, rescales the head's running sum by
// alpha = exp(old_max - new_max) and records alpha for the output rescale.
__device__ __forceinline__ void UpdateRunningSoftmax(float sum, float old_max, float new_max,
                                                     int lane, int h, float* alphas,
                                                     float* run_sum, float* run_max) {
#pragma unroll
  for (int offset = 16; offset > 0; offset >>= 1) {
    sum += __shfl_xor_sync(0xffffffffu, sum, offset);
  }
  __syncwarp();
  if (lane == 0) {
    const float alpha = new_max == -INFINITY ? 1.0f : expf(old_max - new_max);
    alphas[h] = alpha;
    run_sum[h] = run_sum[h] * alpha + sum;
    run_max[h] = new_max;
  }
}

template <int HG>
__global__ void __launch_bounds__(kThreads, 2)
    DecodeKernel(const DecodeParams p, int splits, int split_entries, Partials partials) {
  using L = Layout<HG>;
  constexpr int KC = L::KC;
  extern __shared__ __align__(16) unsigned char smem[];
  uint32_t* keys = reinterpret_cast<uint32_t*>(smem);
  float* qs = reinterpret_cast<float*>(keys + L::kKeyWords);
  float* scores = qs + L::kQFloats;   // [HG][KC]
  float* probs = scores + HG * KC;    // [KC][HG]
  float* run_max = probs + HG * KC;   // [HG]
  float* run_sum = run_max + HG;      // [HG]
  float* alphas = run_sum + HG;       // [HG]
  int* valid = reinterpret_cast<int*>(alphas + HG);  // [KC]

  const int tid = threadIdx.x;
  const int lane = tid & 31;
  const int warp = tid >> 5;
  const int64_t t = blockIdx.x;
  const int h0 = blockIdx.y * HG;
  const int split = blockIdx.z;

  const int main_len = ListLength(p.main, t);
  const int total = main_len + ListLength(p.extra, t);
  const int begin = split * split_entries;
  const int end = min(total, begin + split_entries);

  for (int i = tid; i < HG * kHeadDim / 2; i += kThreads) {
    const uint32_t word = __ldg(reinterpret_cast<const uint32_t*>(
                                    p.q + (t * p.padded_heads + h0) * kHeadDim) + i);
    qs[2 * i] = LowBf16(word);
    qs[2 * i + 1] = HighBf16(word);
  }
  if (tid < HG) {
    run_max[tid] = -INFINITY;
    run_sum[tid] = 0.0f;
  }
  // The epilogue reads the state even when the loop below runs no chunk.
  __syncthreads();

  float o[HG][2];
#pragma unroll
  for (int h = 0; h < HG; ++h) o[h][0] = o[h][1] = 0.0f;

  // Score tile of this thread: heads hg*4..+3, keys kg*4..+3, words s + 8i.
  const int s = tid & 7;
  const int tile = tid >> 3;
  const int hg = tile / (KC / 4);
  const int kg = tile % (KC / 4);

  for (int c0 = begin; c0 < end; c0 += KC) {
    // 1. Dequantise the chunk.
    for (int i = tid; i < KC * kChunksPerRow; i += kThreads) {
      const int r = i / kChunksPerRow;
      const int ch = i % kChunksPerRow;
      const int e = c0 + r;
      Entry entry{nullptr, nullptr};
      if (e < end) entry = LookUp(p, t, e, main_len);
      if (ch == 0) valid[r] = entry.data != nullptr;
      uint32_t* row = keys + r * kKeyStride;
      if (ch < 28) {
        uint2* dst = reinterpret_cast<uint2*>(row + ch * 8);
        if (entry.data == nullptr) {
#pragma unroll
          for (int k = 0; k < 4; ++k) dst[k] = make_uint2(0, 0);
          continue;
        }
        const uint4 raw = __ldg(reinterpret_cast<const uint4*>(entry.data) + ch);
        uint32_t out[8];
        DequantisePieceFp32(raw, ScaleOfByte(__ldg(entry.scales + (ch >> 2))), out);
#pragma unroll
        for (int k = 0; k < 4; ++k) dst[k] = make_uint2(out[2 * k], out[2 * k + 1]);
      } else {
        uint2* dst = reinterpret_cast<uint2*>(row + 224 + (ch - 28) * 4);
        if (entry.data == nullptr) {
          dst[0] = make_uint2(0, 0);
          dst[1] = make_uint2(0, 0);
          continue;
        }
        const uint4 raw = __ldg(reinterpret_cast<const uint4*>(entry.data + kNopeDim) + (ch - 28));
        dst[0] = make_uint2(raw.x, raw.y);
        dst[1] = make_uint2(raw.z, raw.w);
      }
    }
    __syncthreads();

    // 2. Scores.
    {
      float acc[4][4];
#pragma unroll
      for (int a = 0; a < 4; ++a)
#pragma unroll
        for (int b = 0; b < 4; ++b) acc[a][b] = 0.0f;
      const uint32_t* krow = keys + (kg * 4) * kKeyStride;
      const float* qrow = qs + (hg * 4) * kHeadDim;
#pragma unroll 4
      for (int i = 0; i < 32; ++i) {
        const int w = s + 8 * i;
        float kx[4], ky[4];
#pragma unroll
        for (int j = 0; j < 4; ++j) {
          const uint32_t word = krow[j * kKeyStride + w];
          kx[j] = LowBf16(word);
          ky[j] = HighBf16(word);
        }
#pragma unroll
        for (int a = 0; a < 4; ++a) {
          const float2 qv = *reinterpret_cast<const float2*>(qrow + a * kHeadDim + 2 * w);
#pragma unroll
          for (int j = 0; j < 4; ++j) acc[a][j] = fmaf(qv.x, kx[j], fmaf(qv.y, ky[j], acc[a][j]));
        }
      }
#pragma unroll
      for (int a = 0; a < 4; ++a)
#pragma unroll
        for (int j = 0; j < 4; ++j) {
          float v = acc[a][j];
          v += __shfl_xor_sync(0xffffffffu, v, 1);
          v += __shfl_xor_sync(0xffffffffu, v, 2);
          v += __shfl_xor_sync(0xffffffffu, v, 4);
          acc[a][j] = v;
        }
#pragma unroll
      for (int k = 0; k < 2; ++k) {
        const int idx = 2 * s + k;  // of the 16 outputs of the tile
        const int a = idx >> 2;
        const int j = idx & 3;
        float v = 0.0f;
#pragma unroll
        for (int aa = 0; aa < 4; ++aa)
#pragma unroll
          for (int jj = 0; jj < 4; ++jj)
            if (aa == a && jj == j) v = acc[aa][jj];
        const int c = kg * 4 + j;
        scores[(hg * 4 + a) * KC + c] = valid[c] ? p.softmax_scale * v : -INFINITY;
      }
    }
    __syncthreads();

    // 3. Online softmax, one warp per head.
    for (int h = warp; h < HG; h += kThreads / 32) {
      float z[KC / 32];
      float chunk_max = -INFINITY;
#pragma unroll
      for (int k = 0; k < KC / 32; ++k) {
        z[k] = scores[h * KC + lane + 32 * k];
        chunk_max = fmaxf(chunk_max, z[k]);
      }
#pragma unroll
      for (int offset = 16; offset > 0; offset >>= 1) {
        chunk_max = fmaxf(chunk_max, __shfl_xor_sync(0xffffffffu, chunk_max, offset));
      }
      const float old_max = run_max[h];
      const float new_max = fmaxf(old_max, chunk_max);
      float sum = 0.0f;
#pragma unroll
      for (int k = 0; k < KC / 32; ++k) {
        const float prob = z[k] == -INFINITY ? 0.0f : expf(z[k] - new_max);
        probs[(lane + 32 * k) * HG + h] = prob;
        sum += prob;
      }
      UpdateRunningSoftmax(sum, old_max, new_max, lane, h, alphas, run_sum, run_max);
    }
    __syncthreads();

    // 4. o = o * alpha + P . V, dims (2 tid, 2 tid + 1) of every head.
#pragma unroll
    for (int h = 0; h < HG; ++h) {
      const float alpha = alphas[h];
      o[h][0] *= alpha;
      o[h][1] *= alpha;
    }
#pragma unroll 2
    for (int c = 0; c < KC; ++c) {
      const uint32_t word = keys[c * kKeyStride + tid];
      const float vx = LowBf16(word);
      const float vy = HighBf16(word);
#pragma unroll
      for (int hq = 0; hq < HG / 4; ++hq) {
        const float4 pp = *reinterpret_cast<const float4*>(probs + c * HG + 4 * hq);
        o[4 * hq + 0][0] = fmaf(pp.x, vx, o[4 * hq + 0][0]);
        o[4 * hq + 0][1] = fmaf(pp.x, vy, o[4 * hq + 0][1]);
        o[4 * hq + 1][0] = fmaf(pp.y, vx, o[4 * hq + 1][0]);
        o[4 * hq + 1][1] = fmaf(pp.y, vy, o[4 * hq + 1][1]);
        o[4 * hq + 2][0] = fmaf(pp.z, vx, o[4 * hq + 2][0]);
        o[4 * hq + 2][1] = fmaf(pp.z, vy, o[4 * hq + 2][1]);
        o[4 * hq + 3][0] = fmaf(pp.w, vx, o[4 * hq + 3][0]);
        o[4 * hq + 3][1] = fmaf(pp.w, vy, o[4 * hq + 3][1]);
      }
    }
    __syncthreads();
  }

  if (splits == 1) {
    const float* cos_sin = DerotationOf(p, t);
#pragma unroll
    for (int h = 0; h < HG; ++h) {
      const int head = h0 + h;
      if (head >= p.num_heads) continue;
      const RowEnd end = EndOfRow(p, t, head, run_max[h], run_sum[h]);
      StorePair(p, t, head, tid, end.factor, cos_sin, o[h][0], o[h][1]);
      if (tid == 0) StoreLse(p, t, head, end.lse);
    }
  } else {
#pragma unroll
    for (int h = 0; h < HG; ++h) {
      const int64_t item = Partials::Item(p, t, h0 + h, splits, split);
      partials.Store(item, tid, o[h][0], o[h][1]);
      if (tid == 0) partials.StoreState(item, run_max[h], run_sum[h]);
    }
  }
}

// ---- Tensor-core version (mma.sync m16n8k16, bf16 in, fp32 accumulate).
//
// One CTA of 8 warps: one token, MT x 16 heads (with Hp = 8 the upper 8 are
// zero queries whose results are dropped), a range of key entries in chunks
// of KC (64 with MT = 2, 32 with MT = 1). The FP8 rows of a chunk are
// gathered with cp.async into one of kStages raw stages in shared memory,
// kStages - 1 chunks ahead of the one being computed, so that several chunks
// of random row reads are in flight per SM at any time; the slots of a
// chunk's entries arrive (also by cp.async) two steps before its rows are
// requested. Per chunk:
//   1. dequantise the chunk's raw stage into the bf16 key tile (each row once
//      for all the CTA's heads; -1 entries are zero rows with -inf scores);
//   2. S^T = K Q^T: warp w multiplies its quarter of the dims for its half of
//      the keys, Q fragments held in registers, K fragments by ldmatrix, and
//      stores the partial scores;
//   3. online softmax per head in fp32 over the summed partials (denominator
//      from unrounded probabilities); P rounded to bf16 for the product only;
//   4. O += P V: warp w owns dims 64w..64w+63 of every head, 8 n-tiles;
//      V fragments come from the bf16 rows with ldmatrix.trans, each serving
//      every M-tile.
constexpr int kMmaHeads = 16;
// Keys a chunk: 64 with 32 heads a CTA (MT = 2), 32 with 16 (MT = 1).
constexpr int MmaChunkKeys(int mt) { return mt == 1 ? 32 : 64; }
constexpr int kStages = 3;
constexpr int kSlotRing = 4;  // chunks whose slots are held (kStages + 1)
constexpr int kRowHalves = 520;  // bf16 row stride: 1040 bytes, 16-byte aligned, conflict-free
constexpr int kRowWords = kRowHalves / 2;
constexpr int kPiecesPerRow = kTokenDataBytes / 16;  // 36 16-byte pieces of row data
constexpr int kWarps = kThreads / 32;                 // warps a CTA of the tensor-core kernel
static_assert(kPiecesPerRow - 32 < 32 && kNopeDim / 16 == 28, "row pieces per lane");

// Shared memory of a CTA with MT M-tiles of 16 heads (MT = 2 for Hp >= 32:
// each dequantised chunk serves 32 heads) and KC keys a chunk: 64 with
// MT = 2 (one CTA an SM), 32 with MT = 1 so that two CTAs fit an SM and one's
// barriers overlap the other's work.
template <int MT, int KC>
struct MmaLayout {
  static constexpr int kHeads = kMmaHeads * MT;
  static constexpr int kThreadCount = kThreads;
  static constexpr int kProbHalves = KC + 8;   // P row stride in bf16: conflict-free A loads
  static constexpr int kPartStride = KC + 4;   // partial-score row stride: conflict-free stores
  static constexpr size_t kRawData = size_t{kStages} * KC * kTokenDataBytes;
  static constexpr size_t kRawScales = size_t{kStages} * KC * kTokenScaleBytes;
  static constexpr size_t kKeys = sizeof(uint16_t) * KC * kRowHalves;
  // Q (bf16 rows) until every warp holds its fragments, then the partial
  // scores of the 4 dim slices: [4][kHeads][kPartStride] fp32.
  static constexpr size_t kQ = sizeof(uint16_t) * kHeads * kRowHalves;
  static constexpr size_t kParts = sizeof(float) * 4 * kHeads * kPartStride;
  static constexpr size_t kQOrParts = kQ > kParts ? kQ : kParts;
  static constexpr size_t kProbs = sizeof(uint16_t) * kHeads * kProbHalves;
  static constexpr size_t kState = sizeof(float) * 3 * kHeads;
  static constexpr size_t kValid = sizeof(int) * kStages * KC;
  static constexpr size_t kSlots = sizeof(int32_t) * kSlotRing * KC;
  static constexpr size_t kBytes =
      kRawData + kRawScales + kKeys + kQOrParts + kProbs + kState + kValid + kSlots;
};
static_assert(MmaLayout<2, 64>::kBytes <= 227 * 1024, "shared memory of the 32-head CTA");
static_assert(2 * (MmaLayout<1, 32>::kBytes + 1024) <= 228 * 1024, "two 16-head CTAs an SM");

__device__ __forceinline__ void Mma(float (&c)[4], uint32_t a0, uint32_t a1, uint32_t a2,
                                    uint32_t a3, uint32_t b0, uint32_t b1) {
  asm volatile(
      "mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, "
      "{%8,%9}, {%0,%1,%2,%3};\n"
      : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
      : "r"(a0), "r"(a1), "r"(a2), "r"(a3), "r"(b0), "r"(b1));
}

__device__ __forceinline__ void LdMatrixX4(const void* smem_ptr, uint32_t& r0, uint32_t& r1,
                                           uint32_t& r2, uint32_t& r3) {
  const uint32_t address = static_cast<uint32_t>(__cvta_generic_to_shared(smem_ptr));
  asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0,%1,%2,%3}, [%4];\n"
               : "=r"(r0), "=r"(r1), "=r"(r2), "=r"(r3)
               : "r"(address));
}

__device__ __forceinline__ void LdMatrixX4Trans(const void* smem_ptr, uint32_t& r0, uint32_t& r1,
                                                uint32_t& r2, uint32_t& r3) {
  const uint32_t address = static_cast<uint32_t>(__cvta_generic_to_shared(smem_ptr));
  asm volatile("ldmatrix.sync.aligned.m8n8.x4.trans.shared.b16 {%0,%1,%2,%3}, [%4];\n"
               : "=r"(r0), "=r"(r1), "=r"(r2), "=r"(r3)
               : "r"(address));
}

// Asynchronous copy of `bytes` (8 or 16) from global to shared memory; with
// `fill_zero` nothing is read and the destination gets zeros.
template <int kBytesCopied>
__device__ __forceinline__ void CpAsync(void* smem_dst, const void* global_src, bool fill_zero) {
  const uint32_t dst = static_cast<uint32_t>(__cvta_generic_to_shared(smem_dst));
  const int src_bytes = fill_zero ? 0 : kBytesCopied;
  if constexpr (kBytesCopied == 16) {
    asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;\n" ::"r"(dst), "l"(global_src),
                 "r"(src_bytes));
  } else {
    asm volatile("cp.async.ca.shared.global [%0], [%1], %2, %3;\n" ::"r"(dst), "l"(global_src),
                 "n"(kBytesCopied), "r"(src_bytes));
  }
}
__device__ __forceinline__ void CpAsyncCommit() { asm volatile("cp.async.commit_group;\n" ::); }
template <int kPending>
__device__ __forceinline__ void CpAsyncWait() {
  asm volatile("cp.async.wait_group %0;\n" ::"n"(kPending));
}

template <int MT, int KC>
__global__ void __launch_bounds__(kThreads, 2 / MT)
    DecodeMmaKernel(const DecodeParams p, int groups, int splits, int split_entries,
                    Partials partials) {
  using L = MmaLayout<MT, KC>;
  constexpr int kProbHalves = L::kProbHalves;
  constexpr int kHeadsHere = L::kHeads;
  constexpr int kCtaThreads = L::kThreadCount;
  extern __shared__ __align__(16) unsigned char smem[];
  uint8_t* raw_data = smem;
  uint8_t* raw_scales = raw_data + L::kRawData;
  uint16_t* keys = reinterpret_cast<uint16_t*>(raw_scales + L::kRawScales);
  uint16_t* qs = keys + KC * kRowHalves;
  float* parts = reinterpret_cast<float*>(qs);  // after the Q fragments are loaded
  uint16_t* probs = reinterpret_cast<uint16_t*>(reinterpret_cast<uint8_t*>(qs) + L::kQOrParts);
  float* run_max = reinterpret_cast<float*>(probs + kHeadsHere * kProbHalves);
  float* run_sum = run_max + kHeadsHere;
  float* alphas = run_sum + kHeadsHere;
  int* stage_valid = reinterpret_cast<int*>(alphas + kHeadsHere);  // [kStages][64]
  int32_t* chunk_slots = stage_valid + kStages * KC;  // [kSlotRing][KC]
  uint32_t* key_words = reinterpret_cast<uint32_t*>(keys);

  const int tid = threadIdx.x;
  const int lane = tid & 31;
  const int warp = tid >> 5;
  const int g = lane >> 2;   // MMA group id
  const int tig = lane & 3;  // thread in group
  // blockIdx.x: token-major, the `groups` head groups of a token (the
  // plan's) adjacent (the second group's row reads find the first's in L2);
  // x has room for any batch (y and z are limited to 65,535).
  const int64_t t = blockIdx.x / groups;
  const int h0 = static_cast<int>(blockIdx.x % groups) * kHeadsHere;
  const int heads_here = min(kHeadsHere, p.padded_heads - h0);
  const int split = blockIdx.y;

  const int main_len = ListLength(p.main, t);
  const int total = main_len + ListLength(p.extra, t);
  const int begin = split * split_entries;
  const int end = min(total, begin + split_entries);
  const int num_chunks = begin < end ? (end - begin + KC - 1) / KC : 0;

  for (int i = tid; i < kHeadsHere * kHeadDim / 2; i += kCtaThreads) {
    const int h = i / (kHeadDim / 2);
    const int w = i % (kHeadDim / 2);
    uint32_t word = 0;
    if (h < heads_here) {
      word = __ldg(reinterpret_cast<const uint32_t*>(p.q + (t * p.padded_heads + h0 + h) * kHeadDim) +
                   w);
    }
    reinterpret_cast<uint32_t*>(qs)[h * kRowWords + w] = word;
  }
  if (tid < kHeadsHere) {
    run_max[tid] = -INFINITY;
    run_sum[tid] = 0.0f;
  }

  // Requests the slot of entry `tid` of chunk j (threads 0..KC-1) into
  // chunk_slots[j % kSlotRing] (asynchronously, with the current group);
  // entries past the range are not fetched (issue_chunk skips them).
  auto fetch_slots = [&](int j) {
    const int e = begin + j * KC + tid;
    if (tid >= KC || j >= num_chunks || e >= end) return;
    const int32_t* index = e < main_len ? p.main.indices + t * p.main.width + e
                                        : p.extra.indices + t * p.extra.width + (e - main_len);
    CpAsync<4>(chunk_slots + (j % kSlotRing) * KC + tid, index, false);
  };
  // Requests chunk j's rows into raw stage j % kStages; -1 entries and
  // entries past the range get zero bytes and valid = 0.
  auto issue_chunk = [&](int j) {
    const int stage = j % kStages;
    const int32_t* slots = chunk_slots + (j % kSlotRing) * KC;
    uint8_t* data = raw_data + stage * (KC * kTokenDataBytes);
    uint8_t* scales_dst = raw_scales + stage * (KC * kTokenScaleBytes);
    // A warp a row: lane l copies 16-byte pieces l and (l < 4) 32 + l, lane
    // 4 the scales.
    for (int r = warp; r < KC; r += kWarps) {
      const int e = begin + j * KC + r;
      const int32_t slot = e < end ? slots[r] : -1;
      const bool skip = slot == -1;
      const uint8_t* pool = e < main_len ? p.main.pool.base : p.extra.pool.base;
      const uint8_t* block_base =
          pool + (skip ? 0 : static_cast<int64_t>(slot / kBlockTokens) * kBlockBytes);
      const int offset = skip ? 0 : slot % kBlockTokens;
      const uint8_t* src = block_base + offset * kTokenDataBytes;
      uint8_t* dst = data + r * kTokenDataBytes;
      CpAsync<16>(dst + lane * 16, src + lane * 16, skip);
      if (lane < kPiecesPerRow - 32) {
        CpAsync<16>(dst + (32 + lane) * 16, src + (32 + lane) * 16, skip);
      } else if (lane == kPiecesPerRow - 32) {
        CpAsync<8>(scales_dst + r * kTokenScaleBytes,
                   block_base + kBlockTokens * kTokenDataBytes + offset * kTokenScaleBytes, skip);
        stage_valid[stage * KC + r] = !skip;
      }
    }
  };
  // Dequantises raw stage j % kStages into the bf16 key tile, a warp a row:
  // lanes 0..27 convert the 28 FP8 pieces (16 values each, one scale per
  // four lanes), lanes 28..31 copy two bf16 RoPE pieces each.
  auto dequantise_chunk = [&](int j) {
    const int stage = j % kStages;
    const uint8_t* data = raw_data + stage * (KC * kTokenDataBytes);
    const uint8_t* scales = raw_scales + stage * (KC * kTokenScaleBytes);
    for (int r = warp; r < KC; r += kWarps) {
      const uint4* src = reinterpret_cast<const uint4*>(data + r * kTokenDataBytes);
      uint32_t* row = key_words + r * kRowWords;
      if (lane < 28) {
        const uint4 raw = src[lane];
        // A skipped entry has zero bytes: +0 values (scale irrelevant).
        uint32_t out[8];
        DequantisePiece(raw, scales[r * kTokenScaleBytes + (lane >> 2)], out);
        uint4* dst = reinterpret_cast<uint4*>(row + lane * 8);
        dst[0] = make_uint4(out[0], out[1], out[2], out[3]);
        dst[1] = make_uint4(out[4], out[5], out[6], out[7]);
      } else {
        const int piece = 28 + 2 * (lane - 28);
        uint4* dst = reinterpret_cast<uint4*>(row + 224 + (piece - 28) * 4);
        dst[0] = src[piece];
        dst[1] = src[piece + 1];
      }
    }
  };

  // Fill the pipeline: the slots of chunks 0 .. kSlotRing - 1 and the rows
  // of chunks 0 .. kStages - 2 requested. Iteration i then requests the rows
  // of chunk i + kStages - 1 and the slots of chunk i + kSlotRing in one
  // group, so a chunk's slots arrive two iterations before its rows are
  // requested and its rows kStages - 1 iterations before they are used.
  for (int j = 0; j < kSlotRing; ++j) fetch_slots(j);
  CpAsyncCommit();
  CpAsyncWait<0>();
  __syncthreads();
#pragma unroll
  for (int j = 0; j < kStages - 1; ++j) {
    if (j < num_chunks) issue_chunk(j);
    CpAsyncCommit();
  }

  // q.K is computed as S^T = K Q^T: warp w takes dims 128 (w / 2) .. + 127
  // and keys (w % 2) KC/2 .. + KC/2 - 1; its Q fragments (the MMA's B
  // operand: 8 heads x 16 dims each) stay in registers for the whole CTA, so
  // per chunk only the key tile is read from shared memory, each element
  // once. The 4 dim slices' partial scores meet in shared memory.
  constexpr int kNTiles = kHeadsHere / 8;  // n-tiles of 8 heads
  constexpr int kKeyTiles = KC / 32;       // m-tiles of 16 keys a warp
  const int slice = warp >> 1;
  const int key_base = (warp & 1) * (KC / 2);
  __syncthreads();  // Q rows stored
  uint32_t qf[kNTiles][8][2];
#pragma unroll
  for (int nt = 0; nt < kNTiles; ++nt) {
#pragma unroll
    for (int k32 = 0; k32 < 4; ++k32) {
      const uint16_t* rows =
          qs + (nt * 8 + (lane & 7)) * kRowHalves + slice * 128 + k32 * 32 + (lane >> 3) * 8;
      LdMatrixX4(rows, qf[nt][2 * k32][0], qf[nt][2 * k32][1], qf[nt][2 * k32 + 1][0],
                 qf[nt][2 * k32 + 1][1]);
    }
  }
  // O: the warp owns dims 64w .. 64w + 63 of every head (MT M-tiles of 16).
  float acc[MT][8][4];
#pragma unroll
  for (int m = 0; m < MT; ++m) {
#pragma unroll
    for (int j = 0; j < 8; ++j) acc[m][j][0] = acc[m][j][1] = acc[m][j][2] = acc[m][j][3] = 0.0f;
  }

  for (int chunk = 0; chunk < num_chunks; ++chunk) {
    // The chunk's rows have landed (this thread's copies; the barrier makes
    // everyone's visible and frees the stage, key tile and partial scores of
    // the chunk before; the first one also ends the reads of Q).
    const int ahead = chunk + kStages - 1;
    CpAsyncWait<kStages - 2>();
    __syncthreads();
    if (ahead < num_chunks) issue_chunk(ahead);
    fetch_slots(chunk + kSlotRing);  // into the ring entry chunk's slots used
    CpAsyncCommit();

    // 1. Dequantise.
    dequantise_chunk(chunk);
    __syncthreads();
    const int* valid = stage_valid + (chunk % kStages) * KC;

    // 2. Partial S^T over the warp's dims for its keys and every head.
    {
      float s[kKeyTiles][kNTiles][4];
#pragma unroll
      for (int mk = 0; mk < kKeyTiles; ++mk) {
#pragma unroll
        for (int nt = 0; nt < kNTiles; ++nt) s[mk][nt][0] = s[mk][nt][1] = s[mk][nt][2] = s[mk][nt][3] = 0.0f;
      }
      const int mat = lane >> 3;
#pragma unroll
      for (int ks = 0; ks < 8; ++ks) {
#pragma unroll
        for (int mk = 0; mk < kKeyTiles; ++mk) {
          uint32_t a0, a1, a2, a3;
          LdMatrixX4(keys + (key_base + mk * 16 + (mat & 1) * 8 + (lane & 7)) * kRowHalves +
                         slice * 128 + ks * 16 + (mat >> 1) * 8,
                     a0, a1, a2, a3);
#pragma unroll
          for (int nt = 0; nt < kNTiles; ++nt) Mma(s[mk][nt], a0, a1, a2, a3, qf[nt][ks][0], qf[nt][ks][1]);
        }
      }
      // s[mk][nt]: keys key_base + 16mk + g (+8), heads 8nt + 2tig (+1).
      float* part = parts + slice * kHeadsHere * L::kPartStride;
#pragma unroll
      for (int mk = 0; mk < kKeyTiles; ++mk) {
#pragma unroll
        for (int nt = 0; nt < kNTiles; ++nt) {
          const int key = key_base + mk * 16 + g;
          const int head = nt * 8 + 2 * tig;
          part[head * L::kPartStride + key] = s[mk][nt][0];
          part[(head + 1) * L::kPartStride + key] = s[mk][nt][1];
          part[head * L::kPartStride + key + 8] = s[mk][nt][2];
          part[(head + 1) * L::kPartStride + key + 8] = s[mk][nt][3];
        }
      }
    }
    __syncthreads();

    // 3. Online softmax: warp w handles heads kHeadsHere/8 w .., a lane keys
    //    lane (and lane + 32 when KC = 64); scores are the 4 slices' sum.
#pragma unroll
    for (int hh = 0; hh < kHeadsHere / 8; ++hh) {
      const int h = warp * (kHeadsHere / 8) + hh;
      auto score = [&](int key) {
        float dot = 0.0f;
#pragma unroll
        for (int sl = 0; sl < 4; ++sl) dot += parts[(sl * kHeadsHere + h) * L::kPartStride + key];
        return valid[key] != 0 ? p.softmax_scale * dot : -INFINITY;
      };
      const float z0 = score(lane);
      const float z1 = KC == 64 ? score(lane + 32) : -INFINITY;
      float chunk_max = fmaxf(z0, z1);
#pragma unroll
      for (int offset = 16; offset > 0; offset >>= 1) {
        chunk_max = fmaxf(chunk_max, __shfl_xor_sync(0xffffffffu, chunk_max, offset));
      }
      const float old_max = run_max[h];
      const float new_max = fmaxf(old_max, chunk_max);
      const float p0 = z0 == -INFINITY ? 0.0f : expf(z0 - new_max);
      const float p1 = z1 == -INFINITY ? 0.0f : expf(z1 - new_max);
      probs[h * kProbHalves + lane] = static_cast<uint16_t>(ToBf16Bits(p0));
      if constexpr (KC == 64) probs[h * kProbHalves + lane + 32] = static_cast<uint16_t>(ToBf16Bits(p1));
      float sum = p0 + p1;
      UpdateRunningSoftmax(sum, old_max, new_max, lane, h, alphas, run_sum, run_max);
    }
    __syncthreads();

    // 4. O = O * alpha + P V for dims 64w..64w+63; each V fragment serves
    //    every M-tile.
    {
#pragma unroll
      for (int m = 0; m < MT; ++m) {
        const float alpha0 = alphas[m * 16 + g];
        const float alpha1 = alphas[m * 16 + g + 8];
#pragma unroll
        for (int j = 0; j < 8; ++j) {
          acc[m][j][0] *= alpha0;
          acc[m][j][1] *= alpha0;
          acc[m][j][2] *= alpha1;
          acc[m][j][3] *= alpha1;
        }
      }
      const uint32_t* prob_words = reinterpret_cast<const uint32_t*>(probs);
      const int mat = lane >> 3;
      const int mrow = lane & 7;
#pragma unroll
      for (int ks = 0; ks < KC / 16; ++ks) {
        const int kw = ks * 8 + tig;  // word of P rows
        uint32_t a[MT][4];
#pragma unroll
        for (int m = 0; m < MT; ++m) {
          const int pr = m * 16 + g;
          a[m][0] = prob_words[pr * (kProbHalves / 2) + kw];
          a[m][1] = prob_words[(pr + 8) * (kProbHalves / 2) + kw];
          a[m][2] = prob_words[pr * (kProbHalves / 2) + kw + 4];
          a[m][3] = prob_words[(pr + 8) * (kProbHalves / 2) + kw + 4];
        }
        const int key = ks * 16 + mrow + 8 * (mat & 1);
#pragma unroll
        for (int j = 0; j < 8; j += 2) {
          const int dim = warp * 64 + j * 8 + 8 * (mat >> 1);
          uint32_t b0, b1, b2, b3;
          LdMatrixX4Trans(keys + key * kRowHalves + dim, b0, b1, b2, b3);
#pragma unroll
          for (int m = 0; m < MT; ++m) {
            Mma(acc[m][j], a[m][0], a[m][1], a[m][2], a[m][3], b0, b1);
            Mma(acc[m][j + 1], a[m][0], a[m][1], a[m][2], a[m][3], b2, b3);
          }
        }
      }
    }
    // The next chunk's first barrier keeps its dequantisation off this
    // chunk's key tile and probabilities.
  }

  // Thread holds heads m*16 + g and + 8, dims 64w + 8j + 2tig (+1). The
  // per-row and per-token reads come before the row's stores.
  const float* cos_sin = splits == 1 ? DerotationOf(p, t) : nullptr;
#pragma unroll
  for (int m = 0; m < MT; ++m) {
#pragma unroll
    for (int half = 0; half < 2; ++half) {
      const int h = m * 16 + g + 8 * half;
      const float run_m = run_max[h];
      const float l = run_sum[h];
      const bool finish = splits == 1 && h0 + h < p.num_heads;
      const RowEnd end = finish ? EndOfRow(p, t, h0 + h, run_m, l) : RowEnd{0.0f, 0.0f};
      if (finish && warp == 0 && tig == 0) StoreLse(p, t, h0 + h, end.lse);
#pragma unroll
      for (int j = 0; j < 8; ++j) {
        const int word = (warp * 64 + j * 8 + 2 * tig) / 2;
        const float o0 = acc[m][j][2 * half];
        const float o1 = acc[m][j][2 * half + 1];
        if (splits == 1) {
          if (finish) StorePair(p, t, h0 + h, word, end.factor, cos_sin, o0, o1);
        } else if (h < heads_here) {
          const int64_t item = Partials::Item(p, t, h0 + h, splits, split);
          partials.Store(item, word, o0, o1);
          if (word == 0) partials.StoreState(item, run_m, l);
        }
      }
    }
  }
}

// Merges the splits of one (token, head < H): one CTA, two dims a thread,
// and finishes the row in either output format.
__global__ void __launch_bounds__(kThreads)
    CombineKernel(const DecodeParams p, int splits, Partials partials) {
  const int64_t t = blockIdx.x / p.num_heads;
  const int h = static_cast<int>(blockIdx.x % p.num_heads);
  const int64_t first = Partials::Item(p, t, h, splits, 0);
  float m = -INFINITY;
  for (int s = 0; s < splits; ++s) m = fmaxf(m, partials.ml[2 * (first + s)]);
  float l = 0.0f, o0 = 0.0f, o1 = 0.0f;
  if (m != -INFINITY) {
    for (int s = 0; s < splits; ++s) {
      const float ms = partials.ml[2 * (first + s)];
      if (ms == -INFINITY) continue;
      const float w = expf(ms - m);
      l += w * partials.ml[2 * (first + s) + 1];
      const float2 os = reinterpret_cast<const float2*>(partials.o + (first + s) * kHeadDim)[threadIdx.x];
      o0 += w * os.x;
      o1 += w * os.y;
    }
  }
  if (!Fp8Output(p)) {
    Finish(p, t, h, threadIdx.x, m, l, o0, o1);
    return;
  }
  // FP8: a block of 128 dims is two warps' pairs; their maxima meet in
  // shared memory.
  static_assert(kThreads * 2 == kHeadDim && kOutputQuantBlock == 2 * 32 * 2, "two warps a block");
  __shared__ float warp_max[kThreads / 32];
  const RowEnd end = EndOfRow(p, t, h, m, l);
  const float2 v = FinishedValues(threadIdx.x, end.factor, DerotationOf(p, t), o0, o1);
  const int warp = threadIdx.x >> 5;
  const float amax = LanesMax<32>(fmaxf(fabsf(v.x), fabsf(v.y)));
  if ((threadIdx.x & 31) == 0) warp_max[warp] = amax;
  __syncthreads();
  const int block = warp >> 1;
  const int e = BlockScaleExponent(fmaxf(warp_max[2 * block], warp_max[2 * block + 1]));
  reinterpret_cast<uint16_t*>(E4m3Row(p, t, h))[threadIdx.x] =
      static_cast<uint16_t>(E4m3Pair(v.x, v.y, InverseBlockScale(e)));
  if ((threadIdx.x & 63) == 0) ScaleBytes(p, t, h)[block] = BlockScaleByte(e);
  if (threadIdx.x == 0) StoreLse(p, t, h, end.lse);
}

struct Plan {
  int hg;
  int groups;
  int splits;
  int split_entries;
  int chunk_keys;  // the kernel's keys a chunk: split boundaries fall on them
};

// Splits each token's keys into at most `wanted` ranges (and kMaxSplits),
// never below one chunk of `kc` keys a range; boundaries on whole chunks.
void SplitKeys(const DecodeParams& p, int64_t wanted, int kc, Plan& plan) {
  const int width = p.main.width + p.extra.width;
  int splits = 1;
  if (wanted > 1 && width > kc) {
    splits = static_cast<int>(std::min<int64_t>(wanted, kMaxSplits));
    splits = max(1, min(splits, (width + kc - 1) / kc));
  }
  const int chunks = (width + kc - 1) / kc;
  const int chunks_per_split = (chunks + splits - 1) / splits;
  plan.chunk_keys = kc;
  plan.split_entries = splits == 1 ? (width > 0 ? width : 1) : chunks_per_split * kc;
  plan.splits = splits == 1 ? 1 : (width + plan.split_entries - 1) / plan.split_entries;
}

Plan MakePlan(const DecodeParams& p, DecodeKernels kernels, int num_sms) {
  Plan plan;
  // The CUDA-core kernel's (a divisor of Hp); the others set their own.
  plan.hg = p.padded_heads % 16 == 0 ? 16 : 8;
  if (kernels == DecodeKernels::kWgmma || kernels == DecodeKernels::kPadded) {
    // One CTA an SM (its shared memory), 64-key chunks; the narrow kernel's
    // Hp <= 32 is one group of 64.
    plan.hg = kWgmmaHeads;
    plan.groups = (p.padded_heads + kWgmmaHeads - 1) / kWgmmaHeads;
    const int64_t ctas = p.num_tokens * plan.groups;
    SplitKeys(p, ctas > 0 && ctas < num_sms ? num_sms / ctas : 1, kWgmmaChunk, plan);
    return plan;
  }
  if (kernels == DecodeKernels::kMma) {
    plan.hg = p.padded_heads >= 32 ? 2 * kMmaHeads : kMmaHeads;
    plan.groups = (p.padded_heads + plan.hg - 1) / plan.hg;
    const int mt = plan.hg / kMmaHeads;
    // Split only as far as whole waves of CTAs allow: shared memory holds one
    // 32-head or two 16-head CTAs an SM.
    const int64_t resident = int64_t{num_sms} * (mt == 1 ? 2 : 1);
    const int64_t ctas = p.num_tokens * plan.groups;
    SplitKeys(p, ctas > 0 && ctas < resident ? resident / ctas : 1, MmaChunkKeys(mt), plan);
    return plan;
  }
  plan.groups = p.padded_heads / plan.hg;
  // Two CTAs an SM, rounded up.
  const int64_t wanted = 2 * int64_t{num_sms};
  const int64_t ctas = p.num_tokens * plan.groups;
  SplitKeys(p, ctas > 0 && ctas < wanted ? (wanted + ctas - 1) / ctas : 1, 512 / plan.hg, plan);
  return plan;
}

template <int HG>
cudaError_t LaunchWith(const DecodeParams& p, const Plan& plan, Partials partials,
                       cudaStream_t stream) {
  const size_t bytes = Layout<HG>::kBytes;
  cudaError_t error =
      cudaFuncSetAttribute(DecodeKernel<HG>, cudaFuncAttributeMaxDynamicSharedMemorySize,
                           static_cast<int>(bytes));
  if (error != cudaSuccess) return error;
  const dim3 grid(static_cast<unsigned>(p.num_tokens), plan.groups, plan.splits);
  DecodeKernel<HG><<<grid, kThreads, bytes, stream>>>(p, plan.splits, plan.split_entries,
                                                      partials);
  return cudaGetLastError();
}

template <int MT>
cudaError_t LaunchMma(const DecodeParams& p, const Plan& plan, Partials partials,
                      cudaStream_t stream) {
  constexpr int kc = MmaChunkKeys(MT);
  const size_t bytes = MmaLayout<MT, kc>::kBytes;
  cudaError_t error = cudaFuncSetAttribute(DecodeMmaKernel<MT, kc>,
                                           cudaFuncAttributeMaxDynamicSharedMemorySize,
                                           static_cast<int>(bytes));
  if (error != cudaSuccess) return error;
  const dim3 grid(static_cast<unsigned>(p.num_tokens * plan.groups), plan.splits);
  DecodeMmaKernel<MT, kc><<<grid, kThreads, bytes, stream>>>(p, plan.groups, plan.splits,
                                                              plan.split_entries, partials);
  return cudaGetLastError();
}

}  // namespace

// Every choice and its MLA_CUDA_DECODE value.
constexpr struct {
  DecodeKernels kernels;
  const char* name;
} kDecodeKernelsNames[] = {{DecodeKernels::kWgmma, "wgmma"},
                           {DecodeKernels::kPadded, "padded"},
                           {DecodeKernels::kMma, "mma"},
                           {DecodeKernels::kSimt, "simt"}};

std::optional<DecodeKernels> DecodeKernelsFor(const char* value) {
  if (value == nullptr || value[0] == '\0') return DecodeKernels::kWgmma;
  for (const auto& known : kDecodeKernelsNames) {
    if (std::strcmp(value, known.name) == 0) return known.kernels;
  }
  return std::nullopt;
}

std::string DecodeKernelsChoices() {
  std::string choices;
  const int count = static_cast<int>(std::size(kDecodeKernelsNames));
  for (int i = 0; i < count; ++i) {
    if (i > 0) choices += i + 1 == count ? " or " : ", ";
    choices += kDecodeKernelsNames[i].name;
    if (kDecodeKernelsNames[i].kernels == DecodeKernels::kWgmma) choices += " (the default)";
  }
  return choices;
}

const char* DecodeKernelsName(DecodeKernels kernels) {
  for (const auto& known : kDecodeKernelsNames) {
    if (known.kernels == kernels) return known.name;
  }
  return "?";
}

DecodeSplit DecodeSplitOf(const DecodeParams& p, DecodeKernels kernels, int num_sms) {
  const Plan plan = MakePlan(p, kernels, num_sms);
  return DecodeSplit{plan.splits, plan.split_entries, plan.chunk_keys};
}

size_t DecodeScratchBytes(const DecodeParams& p, DecodeKernels kernels, int num_sms) {
  const Plan plan = MakePlan(p, kernels, num_sms);
  if (plan.splits == 1) return 0;
  const size_t items = static_cast<size_t>(p.num_tokens) * p.padded_heads * plan.splits;
  return items * (kHeadDim + 2) * sizeof(float);
}

cudaError_t LaunchDecode(const DecodeParams& p, DecodeKernels kernels, int num_sms, void* scratch,
                         cudaStream_t stream, const FusedQuery& fused) {
  if (p.num_tokens == 0) return cudaSuccess;
  const Plan plan = MakePlan(p, kernels, num_sms);
  Partials partials{nullptr, nullptr};
  if (plan.splits > 1) {
    const size_t items = static_cast<size_t>(p.num_tokens) * p.padded_heads * plan.splits;
    partials.o = static_cast<float*>(scratch);
    partials.ml = partials.o + items * kHeadDim;
  }
  cudaError_t error;
  if (kernels == DecodeKernels::kWgmma && p.padded_heads <= kNarrowMaxHeads) {
    error = LaunchDecodeNarrow(p, fused, plan.splits, plan.split_entries, partials.o, partials.ml,
                               stream);
  } else if (fused.q != nullptr) {
    return cudaErrorInvalidValue;  // CudaBackend fuses with the narrow kernel only
  } else if (kernels == DecodeKernels::kWgmma || kernels == DecodeKernels::kPadded) {
    error = LaunchDecodeWgmma(p, plan.groups, plan.splits, plan.split_entries, partials.o,
                              partials.ml, stream);
  } else if (kernels == DecodeKernels::kMma) {
    error = plan.hg == 2 * kMmaHeads ? LaunchMma<2>(p, plan, partials, stream)
                                     : LaunchMma<1>(p, plan, partials, stream);
  } else {
    error = plan.hg == 16 ? LaunchWith<16>(p, plan, partials, stream)
                          : LaunchWith<8>(p, plan, partials, stream);
  }
  if (error != cudaSuccess || plan.splits == 1) return error;
  CombineKernel<<<static_cast<unsigned>(p.num_tokens * p.num_heads), kThreads, 0, stream>>>(
      p, plan.splits, partials);
  return cudaGetLastError();
}

}  // namespace cuda
}  // namespace mla

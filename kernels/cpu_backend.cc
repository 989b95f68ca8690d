#include "kernels/cpu_backend.h"

#include <immintrin.h>

#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <cstring>
#include <limits>
#include <thread>
#include <vector>

#include "absl/strings/str_cat.h"
#include "kernels/bf16.h"
#include "kernels/cache_format.h"
#include "kernels/geometry.h"
#include "kernels/rope.h"
#include "kernels/validation.h"

namespace mla {
namespace {

// Key rows dequantised at a time (64 rows x 2 KiB stays in L2).
constexpr int kChunkRows = 64;

void Bf16RowToFloat(const uint16_t* src, float* dst) {
  for (int d = 0; d < kHeadDim; ++d) dst[d] = Bf16ToFloat(src[d]);
}

// Eight bf16 values to floats (exact).
inline __m256 LoadBf16x8(const uint16_t* src) {
  const __m128i bits = _mm_loadu_si128(reinterpret_cast<const __m128i*>(src));
  return _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_cvtepu16_epi32(bits), 16));
}

// FloatToBf16 (kernels/bf16.h) of eight floats, in the low half of each
// 32-bit lane: round to nearest even; a NaN keeps its top bits, made quiet.
inline __m256i Bf16Bits8(__m256 x) {
  const __m256i bits = _mm256_castps_si256(x);
  const __m256i high = _mm256_srli_epi32(bits, 16);
  const __m256i lsb = _mm256_and_si256(high, _mm256_set1_epi32(1));
  const __m256i rounded = _mm256_srli_epi32(
      _mm256_add_epi32(_mm256_add_epi32(bits, _mm256_set1_epi32(0x7fff)), lsb), 16);
  const __m256i quiet = _mm256_or_si256(high, _mm256_set1_epi32(0x0040));
  const __m256i nan = _mm256_castps_si256(_mm256_cmp_ps(x, x, _CMP_UNORD_Q));
  return _mm256_blendv_epi8(rounded, quiet, nan);
}

// FloatToBf16 of 16 floats (lo, then hi), stored in order.
inline void StoreBf16x16(__m256 lo, __m256 hi, uint16_t* dst) {
  // The pack interleaves 128-bit lanes; the permute puts them back in order.
  const __m256i packed = _mm256_packus_epi32(Bf16Bits8(lo), Bf16Bits8(hi));
  _mm256_storeu_si256(reinterpret_cast<__m256i*>(dst), _mm256_permute4x64_epi64(packed, 0xd8));
}

void FloatsToBf16(const float* src, int count, uint16_t* dst) {
  for (int d = 0; d < count; d += 16) {
    StoreBf16x16(_mm256_loadu_ps(src + d), _mm256_loadu_ps(src + d + 8), dst + d);
  }
}

// Heads whose sums of squares are taken together, one per vector lane.
constexpr int kNormHeads = 8;

// Transposes an 8x8 block of floats: lane j of row i goes to lane i of row j.
inline void Transpose8x8(__m256 rows[8]) {
  const __m256 t0 = _mm256_unpacklo_ps(rows[0], rows[1]);
  const __m256 t1 = _mm256_unpackhi_ps(rows[0], rows[1]);
  const __m256 t2 = _mm256_unpacklo_ps(rows[2], rows[3]);
  const __m256 t3 = _mm256_unpackhi_ps(rows[2], rows[3]);
  const __m256 t4 = _mm256_unpacklo_ps(rows[4], rows[5]);
  const __m256 t5 = _mm256_unpackhi_ps(rows[4], rows[5]);
  const __m256 t6 = _mm256_unpacklo_ps(rows[6], rows[7]);
  const __m256 t7 = _mm256_unpackhi_ps(rows[6], rows[7]);
  const __m256 u0 = _mm256_shuffle_ps(t0, t2, 0x44);
  const __m256 u1 = _mm256_shuffle_ps(t0, t2, 0xee);
  const __m256 u2 = _mm256_shuffle_ps(t1, t3, 0x44);
  const __m256 u3 = _mm256_shuffle_ps(t1, t3, 0xee);
  const __m256 u4 = _mm256_shuffle_ps(t4, t6, 0x44);
  const __m256 u5 = _mm256_shuffle_ps(t4, t6, 0xee);
  const __m256 u6 = _mm256_shuffle_ps(t5, t7, 0x44);
  const __m256 u7 = _mm256_shuffle_ps(t5, t7, 0xee);
  rows[0] = _mm256_permute2f128_ps(u0, u4, 0x20);
  rows[1] = _mm256_permute2f128_ps(u1, u5, 0x20);
  rows[2] = _mm256_permute2f128_ps(u2, u6, 0x20);
  rows[3] = _mm256_permute2f128_ps(u3, u7, 0x20);
  rows[4] = _mm256_permute2f128_ps(u0, u4, 0x31);
  rows[5] = _mm256_permute2f128_ps(u1, u5, 0x31);
  rows[6] = _mm256_permute2f128_ps(u2, u6, 0x31);
  rows[7] = _mm256_permute2f128_ps(u3, u7, 0x31);
}

// sums[h] = x[h][0]^2 + x[h][1]^2 + ... + x[h][511]^2 for 8 bf16 rows,
// each square rounded to float and added in dim order: the rounding of the
// one-row loop this replaces (which the compiler kept in order, since
// reordering a float sum changes it). Each lane is one row's running sum; the
// squares of 8 dims of 8 rows are transposed so that lane h gets row h's.
void SumSquares8(const uint16_t* const rows[8], float* sums) {
  __m256 acc = _mm256_setzero_ps();
  for (int d = 0; d < kHeadDim; d += 8) {
    __m256 squares[8];
    for (int h = 0; h < 8; ++h) {
      const __m256 v = LoadBf16x8(rows[h] + d);
      squares[h] = _mm256_mul_ps(v, v);
    }
    Transpose8x8(squares);
    for (int i = 0; i < 8; ++i) acc = _mm256_add_ps(acc, squares[i]);
  }
  _mm256_storeu_ps(sums, acc);
}

// Heads [h0, h0 + count) of one token, count <= kNormHeads: per-head RMS norm,
// RoPE, rounding to bf16.
void NormRopeQueries(const uint16_t* q, int count, const float* cos_sin, float eps,
                     uint16_t* q_out) {
  static const uint16_t kZeroRow[kHeadDim] = {};
  const uint16_t* rows[kNormHeads];
  for (int h = 0; h < kNormHeads; ++h) rows[h] = h < count ? q + h * kHeadDim : kZeroRow;
  float squares[kNormHeads];
  SumSquares8(rows, squares);
  for (int h = 0; h < count; ++h) {
    const float inv_rms = 1.0f / std::sqrt(squares[h] / kHeadDim + eps);
    const __m256 scale = _mm256_set1_ps(inv_rms);
    uint16_t* out = q_out + h * kHeadDim;
    for (int d = 0; d < kNopeDim; d += 16) {
      StoreBf16x16(_mm256_mul_ps(LoadBf16x8(rows[h] + d), scale),
                   _mm256_mul_ps(LoadBf16x8(rows[h] + d + 8), scale), out + d);
    }
    float rope[kRopeDim];
    for (int i = 0; i < kRopeDim; ++i) rope[i] = Bf16ToFloat(rows[h][kNopeDim + i]) * inv_rms;
    ApplyRope(cos_sin, /*inverse=*/false, rope);
    FloatsToBf16(rope, kRopeDim, out + kNopeDim);
  }
}

// Rotates, rounds, quantises and writes row r of `insert` (nothing for slot -1).
void InsertRow(const KvInsertParams& insert, const RopeTableView& rope, int64_t r) {
  const int64_t slot = insert.slots[r];
  if (slot < 0) return;
  float y[kHeadDim];
  Bf16RowToFloat(insert.rows + r * kHeadDim, y);
  ApplyRope(rope.data + int64_t{insert.positions[r]} * kRopeDim, /*inverse=*/false,
            y + kNopeDim);
  for (int d = 0; d < kHeadDim; ++d) y[d] = RoundToBf16(y[d]);
  QuantizeRow(y, insert.pool.base + SlotDataOffset(slot),
              insert.pool.base + SlotScaleOffset(slot));
}

absl::Status CheckInsertValues(const KvInsertParams& insert, const RopeTableView& rope,
                               absl::string_view name) {
  if (absl::Status status = CheckInsertSlots(absl::StrCat(name, " slots"), insert.slots,
                                             insert.num_rows, insert.pool.num_slots());
      !status.ok()) {
    return status;
  }
  return CheckPositions(absl::StrCat(name, " positions"), insert.positions, insert.num_rows,
                        rope.num_positions);
}

// exp(x) for the softmax, where x <= 0: Cephes' polynomial on a reduced
// argument, written with plain arithmetic so that loops over it vectorise
// (libm's expf would be a scalar call per score). Relative error ~2e-7;
// arguments below -87 (results under 1.6e-38) come out as about 1e-38.
inline float SoftmaxExp(float x) {
  // A NaN score (a NaN or infinite query or key element) gives NaN, and
  // scores above 88 (none: scores are taken less their maximum) saturate:
  // the integer conversion below is defined for every input.
  const bool nan = x != x;
  x = nan ? 0.0f : (x < -87.0f ? -87.0f : (x > 88.0f ? 88.0f : x));
  constexpr float kRoundMagic = 12582912.0f;  // 1.5 x 2^23: adding it rounds to an integer
  const float n = (x * 1.44269504088896341f + kRoundMagic) - kRoundMagic;
  const float r = (x - n * 0.693359375f) + n * 2.12194440e-4f;
  float poly = 1.9875691500e-4f;
  poly = poly * r + 1.3981999507e-3f;
  poly = poly * r + 8.3334519073e-3f;
  poly = poly * r + 4.1665795894e-2f;
  poly = poly * r + 1.6666665459e-1f;
  poly = poly * r + 5.0000001201e-1f;
  const float y = poly * r * r + r + 1.0f;
  const uint32_t bits = static_cast<uint32_t>(static_cast<int32_t>(n) + 127) << 23;
  float two_to_n;
  std::memcpy(&two_to_n, &bits, sizeof(two_to_n));
  return nan ? std::numeric_limits<float>::quiet_NaN() : y * two_to_n;
}

// Heads handled together by the micro-kernels below: each key element loaded
// feeds this many multiply-adds.
constexpr int kHeadBlock = 4;

// scores[h][c + r] = scale * <q[h], keys[c + r]> for kHeadBlock heads and
// kRows rows (1 or 2). Each dot product is eight lane sums, lane l
// multiply-adding dims l, l + 8, ... in order, then added lane 0 to 7 onto 0.
template <int kRows>
inline void ScoreRows(const float* q, const float* keys, int c, float scale, float* scores,
                      int score_stride) {
  __m256 acc[kHeadBlock][kRows];
  for (int h = 0; h < kHeadBlock; ++h) {
    for (int r = 0; r < kRows; ++r) acc[h][r] = _mm256_setzero_ps();
  }
  const float* k = keys + c * kHeadDim;
  for (int d = 0; d < kHeadDim; d += 8) {
    __m256 key[kRows];
    for (int r = 0; r < kRows; ++r) key[r] = _mm256_loadu_ps(k + r * kHeadDim + d);
    for (int h = 0; h < kHeadBlock; ++h) {
      const __m256 query = _mm256_loadu_ps(q + h * kHeadDim + d);
      for (int r = 0; r < kRows; ++r) acc[h][r] = _mm256_fmadd_ps(query, key[r], acc[h][r]);
    }
  }
  for (int h = 0; h < kHeadBlock; ++h) {
    for (int r = 0; r < kRows; ++r) {
      alignas(32) float lanes[8];
      _mm256_store_ps(lanes, acc[h][r]);
      float sum = 0.0f;
      for (float lane : lanes) sum += lane;
      scores[h * score_stride + c + r] = scale * sum;
    }
  }
}

// For kHeadBlock heads: o[h] = o[h] * alpha[h] + sum_c probs[h][c] *
// values[c], the products multiply-added in row order (on the first chunk o
// is taken as zero). With `factor` (the last chunk), the NoPE dims leave as
// bf16(o[h] * factor[h]) into out[h] (skipped where null: padding heads),
// and the RoPE dims stay in o, times factor, for the de-rotation; without
// `out` (the FP8 output) every dim stays in o, times factor.
inline void AccumulateBlock(const float* probs, int prob_stride, const float* values, int rows,
                            const float* alpha, bool first, const float* factor,
                            uint16_t* const* out, float* o) {
  for (int d = 0; d < kHeadDim; d += 16) {
    __m256 acc[kHeadBlock][2];
    for (int h = 0; h < kHeadBlock; ++h) {
      const __m256 a = _mm256_set1_ps(alpha[h]);
      for (int i = 0; i < 2; ++i) {
        const __m256 previous =
            first ? _mm256_setzero_ps() : _mm256_loadu_ps(o + h * kHeadDim + d + 8 * i);
        acc[h][i] = _mm256_mul_ps(previous, a);
      }
    }
    for (int c = 0; c < rows; ++c) {
      const __m256 v0 = _mm256_loadu_ps(values + c * kHeadDim + d);
      const __m256 v1 = _mm256_loadu_ps(values + c * kHeadDim + d + 8);
      for (int h = 0; h < kHeadBlock; ++h) {
        const __m256 prob = _mm256_set1_ps(probs[h * prob_stride + c]);
        acc[h][0] = _mm256_fmadd_ps(prob, v0, acc[h][0]);
        acc[h][1] = _mm256_fmadd_ps(prob, v1, acc[h][1]);
      }
    }
    for (int h = 0; h < kHeadBlock; ++h) {
      float* row = o + h * kHeadDim + d;
      if (factor == nullptr) {
        _mm256_storeu_ps(row, acc[h][0]);
        _mm256_storeu_ps(row + 8, acc[h][1]);
        continue;
      }
      const __m256 f = _mm256_set1_ps(factor[h]);
      const __m256 lo = _mm256_mul_ps(acc[h][0], f);
      const __m256 hi = _mm256_mul_ps(acc[h][1], f);
      if (d >= kNopeDim || out == nullptr) {
        _mm256_storeu_ps(row, lo);
        _mm256_storeu_ps(row + 8, hi);
      } else if (out[h] != nullptr) {
        StoreBf16x16(lo, hi, out[h] + d);
      }
    }
  }
}

// Per-thread buffers of one decode work item. Heads are padded up to a
// multiple of kHeadBlock with zero queries whose results are not written.
struct DecodeScratch {
  std::vector<const uint8_t*> data_rows;
  std::vector<const uint8_t*> scale_rows;
  std::vector<float> q;       // [heads, 512]
  std::vector<float> o;       // [heads, 512]
  std::vector<float> keys;    // [kChunkRows, 512]
  std::vector<float> probs;   // [heads, kChunkRows]: scores, then probabilities
  std::vector<float> running_max;
  std::vector<float> running_sum;
  std::vector<float> alpha;   // [heads]: this chunk's rescaling of o
  std::vector<float> factor;  // [heads]: 1 / the softmax denominator, sink included
  std::vector<float> lse;     // [heads]
  std::vector<uint16_t*> out;  // [heads]: the rows of bf16 out; null for padding heads
};

// Spec section 5's FP8 output of one head: its fp32 o in blocks of 128
// dims, each quantised by the cache's rule (section 3).
void QuantizeOutputRow(const float* o, uint8_t* codes, uint8_t* scales) {
  for (int k = 0; k < kOutputQuantBlocks; ++k) {
    scales[k] = QuantizeBlock(o + k * kOutputQuantBlock, kOutputQuantBlock,
                              codes + k * kOutputQuantBlock);
  }
}

void AppendKeys(const KeyListParams& list, int64_t t, DecodeScratch& scratch) {
  if (list.width == 0) return;
  const int32_t length = list.lengths == nullptr ? list.width : list.lengths[t];
  const int32_t* row = list.indices + t * list.width;
  for (int32_t k = 0; k < length; ++k) {
    if (row[k] == -1) continue;
    scratch.data_rows.push_back(list.pool.base + SlotDataOffset(row[k]));
    scratch.scale_rows.push_back(list.pool.base + SlotScaleOffset(row[k]));
  }
}

// Heads [h0, h1) of token t: one online softmax over both key lists. Each key
// row is dequantised once for all these heads.
void DecodeHeads(const DecodeParams& p, int64_t t, int h0, int h1, DecodeScratch& scratch) {
  const int heads = h1 - h0;
  const int blocked = (heads + kHeadBlock - 1) / kHeadBlock * kHeadBlock;
  scratch.data_rows.clear();
  scratch.scale_rows.clear();
  AppendKeys(p.main, t, scratch);
  AppendKeys(p.extra, t, scratch);
  const int64_t num_keys = static_cast<int64_t>(scratch.data_rows.size());

  // Only what is read before it is written is set here: the padding heads'
  // queries (o is written by the first chunk, key rows past a chunk's end
  // are never read).
  scratch.q.resize(size_t{kHeadDim} * blocked);
  scratch.o.resize(size_t{kHeadDim} * blocked);
  scratch.keys.resize(size_t{kHeadDim} * kChunkRows);
  scratch.probs.resize(size_t{kChunkRows} * blocked);
  scratch.running_max.assign(blocked, -std::numeric_limits<float>::infinity());
  scratch.running_sum.assign(blocked, 0.0f);
  scratch.alpha.resize(blocked);
  scratch.factor.resize(blocked);
  scratch.lse.assign(blocked, std::numeric_limits<float>::infinity());
  scratch.out.assign(blocked, nullptr);
  const bool fp8 = p.out == nullptr;
  for (int h = 0; h < heads; ++h) {
    Bf16RowToFloat(p.q + (t * p.padded_heads + h0 + h) * kHeadDim, &scratch.q[h * kHeadDim]);
    if (!fp8) scratch.out[h] = p.out + (t * p.num_heads + h0 + h) * kHeadDim;
  }
  std::fill(scratch.q.begin() + size_t{kHeadDim} * heads, scratch.q.end(), 0.0f);

  for (int64_t start = 0; start < num_keys; start += kChunkRows) {
    const int rows = static_cast<int>(std::min<int64_t>(kChunkRows, num_keys - start));
    const bool last = start + rows == num_keys;
    // Key rows are scattered over the pool: ask for the next chunk's rows now
    // so their memory latency overlaps this chunk's arithmetic.
    for (int64_t c = start + kChunkRows; c < std::min(num_keys, start + 2 * kChunkRows); ++c) {
      for (int line = 0; line < kTokenDataBytes; line += 64) {
        __builtin_prefetch(scratch.data_rows[c] + line);
      }
      __builtin_prefetch(scratch.scale_rows[c]);
    }
    for (int c = 0; c < rows; ++c) {
      DequantizeRow(scratch.data_rows[start + c], scratch.scale_rows[start + c],
                    &scratch.keys[c * kHeadDim]);
    }
    for (int h = 0; h < blocked; h += kHeadBlock) {
      float* scores = &scratch.probs[h * kChunkRows];
      int c = 0;
      for (; c + 2 <= rows; c += 2) {
        ScoreRows<2>(&scratch.q[h * kHeadDim], scratch.keys.data(), c, p.softmax_scale, scores,
                     kChunkRows);
      }
      if (c < rows) {
        ScoreRows<1>(&scratch.q[h * kHeadDim], scratch.keys.data(), c, p.softmax_scale, scores,
                     kChunkRows);
      }
    }
    for (int h = 0; h < blocked; ++h) {
      float* probs = &scratch.probs[h * kChunkRows];
      float chunk_max = scratch.running_max[h];
      for (int c = 0; c < rows; ++c) chunk_max = std::max(chunk_max, probs[c]);
      float chunk_sum = 0.0f;
      for (int c = 0; c < rows; ++c) {
        probs[c] = SoftmaxExp(probs[c] - chunk_max);
        chunk_sum += probs[c];
      }
      const float alpha = SoftmaxExp(scratch.running_max[h] - chunk_max);
      scratch.alpha[h] = alpha;
      scratch.running_sum[h] = scratch.running_sum[h] * alpha + chunk_sum;
      scratch.running_max[h] = chunk_max;
    }
    if (last) {
      for (int h = 0; h < heads; ++h) {
        const float lse = scratch.running_max[h] + std::log(scratch.running_sum[h]);
        const float sink = p.sinks == nullptr ? -std::numeric_limits<float>::infinity()
                           : p.sinks_per_token ? p.sinks[t * p.num_heads + h0 + h]
                                               : p.sinks[h0 + h];
        scratch.lse[h] = lse;
        scratch.factor[h] = 1.0f / (scratch.running_sum[h] * (1.0f + std::exp(sink - lse)));
      }
    }
    for (int h = 0; h < blocked; h += kHeadBlock) {
      AccumulateBlock(&scratch.probs[h * kChunkRows], kChunkRows, scratch.keys.data(), rows,
                      &scratch.alpha[h], start == 0, last ? &scratch.factor[h] : nullptr,
                      fp8 ? nullptr : &scratch.out[h], &scratch.o[h * kHeadDim]);
    }
  }

  for (int h = 0; h < heads; ++h) {
    const int64_t row = t * p.num_heads + h0 + h;
    float* o = &scratch.o[h * kHeadDim];
    if (num_keys > 0 && p.derotate) {
      ApplyRope(p.rope.data + int64_t{p.positions[t]} * kRopeDim, /*inverse=*/true, o + kNopeDim);
    }
    if (fp8) {
      // An empty key set's o is 0 (its blocks take the amax floor's scale).
      if (num_keys == 0) std::fill_n(o, kHeadDim, 0.0f);
      QuantizeOutputRow(o, p.out_e4m3 + row * kFp8RowBytes,
                        p.out_scales + row * kFp8ScaleRowBytes);
    } else if (num_keys > 0) {
      FloatsToBf16(o + kNopeDim, kRopeDim, scratch.out[h] + kNopeDim);
    } else {
      std::fill_n(scratch.out[h], kHeadDim, uint16_t{0});
    }
    if (p.lse != nullptr) p.lse[row] = scratch.lse[h];
  }
}

}  // namespace

CpuBackend::CpuBackend(int num_threads)
    : pool_(num_threads > 0 ? num_threads
                            : std::max(1, static_cast<int>(std::thread::hardware_concurrency()))) {}

std::string CpuBackend::Describe() const {
  return absl::StrCat("cpu (", pool_.num_threads(), " threads)");
}

absl::StatusOr<DeviceBuffer> CpuBackend::Allocate(int64_t bytes) {
  if (bytes < 0) return absl::InvalidArgumentError("cannot allocate a negative size");
  void* data = std::calloc(std::max<int64_t>(bytes, 1), 1);
  if (data == nullptr) {
    return absl::ResourceExhaustedError(absl::StrCat("cannot allocate ", bytes, " bytes"));
  }
  return DeviceBuffer(data, bytes, [](void* ptr) { std::free(ptr); });
}

absl::Status CpuBackend::CopyToDevice(void* device_dst, const void* host_src, int64_t bytes) {
  if (bytes > 0) std::memcpy(device_dst, host_src, bytes);
  return absl::OkStatus();
}

absl::Status CpuBackend::CopyToHost(void* host_dst, const void* device_src, int64_t bytes) {
  if (bytes > 0) std::memcpy(host_dst, device_src, bytes);
  return absl::OkStatus();
}

absl::Status CpuBackend::Prologue(const PrologueParams& p) {
  if (absl::Status status = CheckPrologueParams(p); !status.ok()) return status;
  if (absl::Status status =
          CheckPositions("prologue positions", p.positions, p.num_tokens, p.rope.num_positions);
      !status.ok()) {
    return status;
  }
  if (absl::Status status = CheckInsertValues(p.swa, p.rope, "prologue swa"); !status.ok()) {
    return status;
  }
  if (absl::Status status = CheckInsertValues(p.compressed, p.rope, "prologue compressed");
      !status.ok()) {
    return status;
  }

  // One loop for the queries and both inserts (they touch disjoint memory):
  // items are tokens, then SWA rows, then compressed rows.
  const int64_t swa_end = p.num_tokens + p.swa.num_rows;
  pool_.ParallelFor(swa_end + p.compressed.num_rows, [&](int64_t item) {
    if (item >= swa_end) {
      InsertRow(p.compressed, p.rope, item - swa_end);
      return;
    }
    if (item >= p.num_tokens) {
      InsertRow(p.swa, p.rope, item - p.num_tokens);
      return;
    }
    const int64_t t = item;
    const float* cos_sin = p.rope.data + int64_t{p.positions[t]} * kRopeDim;
    for (int h = 0; h < p.num_heads; h += kNormHeads) {
      NormRopeQueries(p.q + (t * p.num_heads + h) * kHeadDim,
                      std::min(kNormHeads, p.num_heads - h), cos_sin, p.rms_norm_eps,
                      p.q_out + (t * p.padded_heads + h) * kHeadDim);
    }
    std::memset(p.q_out + (t * p.padded_heads + p.num_heads) * kHeadDim, 0,
                sizeof(uint16_t) * kHeadDim * (p.padded_heads - p.num_heads));
  });
  return absl::OkStatus();
}

absl::Status CpuBackend::Decode(const DecodeParams& p) {
  if (absl::Status status = CheckDecodeParams(p); !status.ok()) return status;
  if (absl::Status status = CheckKeyIndices("decode main indices", p.main.indices, p.main.lengths,
                                            p.num_tokens, p.main.width, p.main.pool.num_slots());
      !status.ok()) {
    return status;
  }
  if (absl::Status status =
          CheckKeyIndices("decode extra indices", p.extra.indices, p.extra.lengths, p.num_tokens,
                          p.extra.width, p.extra.pool.num_slots());
      !status.ok()) {
    return status;
  }
  if (p.derotate) {
    if (absl::Status status =
            CheckPositions("decode positions", p.positions, p.num_tokens, p.rope.num_positions);
        !status.ok()) {
      return status;
    }
  }

  // A work item is (token, group of heads). Whole tokens dequantise each key
  // row once; heads are split only when there are too few tokens to keep
  // every thread busy.
  const int64_t wanted_items = 2 * int64_t{pool_.num_threads()};
  const int max_groups = (p.num_heads + kHeadBlock - 1) / kHeadBlock;
  const int groups = static_cast<int>(std::clamp<int64_t>(
      (wanted_items + p.num_tokens - 1) / std::max<int64_t>(p.num_tokens, 1), 1, max_groups));
  const int group_heads = (max_groups + groups - 1) / groups * kHeadBlock;
  pool_.ParallelFor(p.num_tokens * groups, [&](int64_t item) {
    thread_local DecodeScratch scratch;
    const int64_t t = item / groups;
    const int h0 = static_cast<int>(item % groups) * group_heads;
    if (h0 < p.num_heads) DecodeHeads(p, t, h0, std::min(h0 + group_heads, p.num_heads), scratch);
  });
  return absl::OkStatus();
}

}  // namespace mla

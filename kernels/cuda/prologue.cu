// Fused prologue (spec section 4) in one launch.
//
// One warp handles 512-wide rows: 4, 2 or 1 (token, head) query rows of one
// token (PrologueRowsPerWarp picks by the batch's size), or one KV row of
// the SWA or compressed insert list. Lane l holds dims 16l..16l+15, so
// lanes 0..27 hold the seven 64-dim NoPE tiles (four lanes each) and lanes
// 28..31 the 64 RoPE dims (8 GPT-J pairs each). The rotation uses explicitly
// rounded multiplies and adds (no fused multiply-add), the same operations as
// the CPU backend, so both produce the same bf16 RoPE values.
#include <cuda_bf16.h>
#include <cuda_fp8.h>
#include <cuda_runtime.h>

#include <cstdint>

#include "kernels/cuda/bf16_device.cuh"
#include "kernels/cuda/fp8_device.cuh"
#include "kernels/cuda/kernels.h"
#include "kernels/cuda/query_device.cuh"
#include "kernels/cuda/wgmma_device.cuh"
#include "kernels/geometry.h"
#include "kernels/head_padding.h"

namespace mla {
namespace cuda {
namespace {

constexpr int kWarpsPerBlock = 8;
// The insert rows alone (LaunchInserts) in CTAs of 32 warps: the decode
// after them needs a whole SM a CTA, and waits for the SMs these occupy.
constexpr int kInsertWarpsPerBlock = 32;

// The kernel before has finished (its reads of what we overwrite are done),
// and only then may the decode after this one launch: the decode reads its
// key lists before it waits, and the kernel before may be the one that wrote
// them (LaunchKeyLists).
__device__ __forceinline__ void WaitToWrite() {
  WaitForPreviousGrid();
  AllowNextGrid();
}

// Query rows h0 .. h0 + kRows - 1 of token t (one warp): every row's loads
// go out before the first is used, and the token's position and RoPE row
// are read once for them all.
template <int kRows>
__device__ void QueryRows(const PrologueParams& p, int64_t t, int h0, int lane) {
  uint4 raw[kRows][2];
#pragma unroll
  for (int k = 0; k < kRows; ++k) LoadQueryRow(p.q, t, h0 + k, p.num_heads, lane, raw[k]);
  const float* cos_sin = p.rope.data + int64_t{__ldg(p.positions + t)} * kRopeDim;
  uint4 rows[kRows][2];
#pragma unroll
  for (int k = 0; k < kRows; ++k) {
    FinishQueryRow(raw[k], h0 + k < p.num_heads, cos_sin, p.rms_norm_eps, lane, rows[k]);
  }
  WaitToWrite();  // the kernel before may still read this q_out
#pragma unroll
  for (int k = 0; k < kRows; ++k) {
    uint4* out =
        reinterpret_cast<uint4*>(p.q_out + (t * p.padded_heads + h0 + k) * kHeadDim + lane * 16);
    out[0] = rows[k][0];
    out[1] = rows[k][1];
  }
}

__device__ void KvRow(const KvInsertParams& insert, const RopeTableView& rope, int64_t r,
                      int lane) {
  const int32_t slot = __ldg(insert.slots + r);
  if (slot < 0) return;  // -1: nothing to write (the whole warp agrees)
  float x[16];
  LoadRow16(insert.rows + r * kHeadDim, lane, x);
  RopeLane(rope.data + int64_t{__ldg(insert.positions + r)} * kRopeDim, lane, x);
  // Round to bf16 and back (the model materialises K in bf16).
#pragma unroll
  for (int i = 0; i < 16; ++i) x[i] = Bf16Bits(ToBf16Bits(x[i]));

  float amax = 0.0f;
#pragma unroll
  for (int i = 0; i < 16; ++i) amax = fmaxf(amax, fabsf(x[i]));
  amax = fmaxf(amax, __shfl_xor_sync(0xffffffffu, amax, 1));
  amax = fmaxf(amax, __shfl_xor_sync(0xffffffffu, amax, 2));
  WaitToWrite();  // the kernel before may still read this slot

  uint8_t* base = insert.pool.base;
  const int64_t block = slot / kBlockTokens;
  const int64_t offset = slot % kBlockTokens;
  uint8_t* data = base + block * kBlockBytes + offset * kTokenDataBytes;
  uint8_t* scales = base + block * kBlockBytes + int64_t{kBlockTokens} * kTokenDataBytes +
                    offset * kTokenScaleBytes;
  if (lane < 28) {
    const int e = BlockScaleExponent(amax);
    const float inv_scale = InverseBlockScale(e);
    uint32_t words[4];
#pragma unroll
    for (int w = 0; w < 4; ++w) {
      words[w] = E4m3Pair(x[4 * w], x[4 * w + 1], inv_scale) |
                 E4m3Pair(x[4 * w + 2], x[4 * w + 3], inv_scale) << 16;
    }
    reinterpret_cast<uint4*>(data)[lane] = make_uint4(words[0], words[1], words[2], words[3]);
    if ((lane & 3) == 0) scales[lane >> 2] = BlockScaleByte(e);
  } else {
    uint4 a, b;
    PackRow16(x, a, b);
    uint4* rope_out = reinterpret_cast<uint4*>(data + kNopeDim + (lane - 28) * 32);
    rope_out[0] = a;
    rope_out[1] = b;
    if (lane == 28) scales[kNopeTiles] = 0;  // pad byte
  }
}

// kRows query rows a warp (kRows divides Hp), then one KV row a warp.
// The inserts alone (LaunchInserts) are launched overlapped
// (LaunchOverlapped), as the decode after them: a warp's loads and
// arithmetic overlap the end of the kernel before, and it waits for that
// kernel (WaitToWrite) before its first write. The whole prologue is a plain
// launch: overlapped, its CTAs took SMs at the previous decode's end and
// waited there, and a prologue and decode took 1.4-3.4 us longer
// (RESULTS.md).
template <int kRows, int kWarps>
__global__ void __launch_bounds__(kWarps * 32)
    PrologueKernel(const PrologueParams p, int64_t query_rows) {
  const int lane = threadIdx.x & 31;
  const int64_t item = int64_t{blockIdx.x} * kWarps + (threadIdx.x >> 5);
  const int64_t query_items = query_rows / kRows;
  if (item < query_items) {
    const int64_t row = item * kRows;
    QueryRows<kRows>(p, row / p.padded_heads, static_cast<int>(row % p.padded_heads), lane);
    return;
  }
  int64_t r = item - query_items;
  if (r < p.swa.num_rows) {
    KvRow(p.swa, p.rope, r, lane);
    return;
  }
  r -= p.swa.num_rows;
  if (r < p.compressed.num_rows) KvRow(p.compressed, p.rope, r, lane);
}

__global__ void Fp8NegativeZeroKernel(uint32_t* out) {
  const __nv_fp8x2_storage_t pair =
      __nv_cvt_float2_to_fp8x2(make_float2(-1e-9f, -0.0009765625f), __NV_SATFINITE, __NV_E4M3);
  const __nv_fp8x2_storage_t big =
      __nv_cvt_float2_to_fp8x2(make_float2(448.0f, -448.0f), __NV_SATFINITE, __NV_E4M3);
  *out = static_cast<uint32_t>(pair) | (static_cast<uint32_t>(big) << 16);
}

constexpr bool DividesEveryHeadCount(int rows) {
  for (int count : kSupportedHeadCounts) {
    if (count % rows != 0) return false;
  }
  return true;
}

template <int kRows, int kWarps = kWarpsPerBlock>
cudaError_t LaunchRows(const PrologueParams& params, int64_t query_rows, bool overlapped,
                       cudaStream_t stream) {
  static_assert(DividesEveryHeadCount(kRows), "a warp's query rows are one token's");
  const int64_t items = query_rows / kRows + params.swa.num_rows + params.compressed.num_rows;
  if (items == 0) return cudaSuccess;
  const int64_t blocks = (items + kWarps - 1) / kWarps;
  if (overlapped) {
    return LaunchOverlapped(PrologueKernel<kRows, kWarps>, dim3(static_cast<unsigned>(blocks)),
                            kWarps * 32, 0, stream, 1, params, query_rows);
  }
  PrologueKernel<kRows, kWarps><<<static_cast<unsigned>(blocks), kWarps * 32, 0, stream>>>(
      params, query_rows);
  return cudaGetLastError();
}

}  // namespace

// Query rows a warp: 4, 2 or 1, the most that still gives at least half of
// the SMs a CTA of query rows. More rows a warp put more loads in flight
// per warp and read the token's RoPE row once for them; too few CTAs leave
// SMs idle (RESULTS.md: H = 64, b = 128 6.5 -> 6.0 us with 4; H = 16,
// b = 128 3.4 -> 3.1 us with 2, 4.0 with 4).
int PrologueRowsPerWarp(int64_t query_rows, int sms) {
  for (int rows : {4, 2}) {
    if (query_rows / (rows * kWarpsPerBlock) >= (sms + 1) / 2) return rows;
  }
  return 1;
}

cudaError_t LaunchPrologue(const PrologueParams& params, int num_sms, cudaStream_t stream) {
  const int64_t query_rows = params.num_tokens * params.padded_heads;
  // Every row count divides every Hp (LaunchRows' static_assert; CheckHeads
  // admits the supported counts only): a warp's rows are one token's.
  switch (PrologueRowsPerWarp(query_rows, num_sms)) {
    case 4:
      return LaunchRows<4>(params, query_rows, /*overlapped=*/false, stream);
    case 2:
      return LaunchRows<2>(params, query_rows, /*overlapped=*/false, stream);
    default:
      return LaunchRows<1>(params, query_rows, /*overlapped=*/false, stream);
  }
}

cudaError_t LaunchInserts(const PrologueParams& params, cudaStream_t stream) {
  return LaunchRows<1, kInsertWarpsPerBlock>(params, 0, /*overlapped=*/true, stream);
}

cudaError_t CheckFp8NegativeZero(cudaStream_t stream, bool* ok) {
  uint32_t* device = nullptr;
  cudaError_t error = cudaMalloc(&device, sizeof(uint32_t));
  if (error != cudaSuccess) return error;
  Fp8NegativeZeroKernel<<<1, 1, 0, stream>>>(device);
  uint32_t host = 0;
  error = cudaGetLastError();
  if (error == cudaSuccess) {
    error = cudaMemcpyAsync(&host, device, sizeof(host), cudaMemcpyDeviceToHost, stream);
  }
  if (error == cudaSuccess) error = cudaStreamSynchronize(stream);
  cudaFree(device);
  // -1e-9 and -2^-10 (half the smallest subnormal, a tie to the even code 0)
  // both round to zero and must keep the sign: 0x80. 448 -> 0x7e, -448 -> 0xfe.
  *ok = (host & 0xffffu) == 0x8080u && ((host >> 16) & 0xffu) == 0x7eu && (host >> 24) == 0xfeu;
  return error;
}

}  // namespace cuda
}  // namespace mla

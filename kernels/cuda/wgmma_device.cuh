// Pieces of the warpgroup-MMA decode kernels (decode_wgmma.cu,
// decode_narrow.cu): the bf16 tile layout of 8 x 8 core matrices and its
// wgmma descriptors, the wgmma and mbarrier instructions, programmatic
// dependent launch (the device side and the host's LaunchOverlapped), and
// the producer warpgroups that gather a chunk's FP8 rows and dequantise
// them into a key tile. Included by .cu files only.
#ifndef MLA_OFFLOAD_KERNELS_CUDA_WGMMA_DEVICE_CUH_
#define MLA_OFFLOAD_KERNELS_CUDA_WGMMA_DEVICE_CUH_

#include <cuda_runtime.h>

#include <atomic>
#include <cstdint>

#include "kernels/backend.h"
#include "kernels/cuda/decode_device.cuh"
#include "kernels/geometry.h"

namespace mla {
namespace cuda {
namespace {

constexpr int kTileRows = 64;  // keys of a chunk; heads of a 64-head CTA
constexpr uint32_t kTileBytes = kTileRows * kHeadDim * 2;

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
// and dims from dim0 on (the MMA's N of them: 64 or 128) are
// Advance(d, ValueStepBytes(dim0, step)).
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

// D[64 x 64] (+)= A B, A a 64 x 16 tile and B a 16 x 64 tile, both K-major
// in shared memory (S = Q K^T).
__device__ __forceinline__ void WgmmaSmemA(float (&d)[32], uint64_t a, uint64_t b, int accumulate) {
  asm volatile(
      "{\n.reg .pred p;\nsetp.ne.b32 p, %34, 0;\n"
      "wgmma.mma_async.sync.aligned.m64n64k16.f32.bf16.bf16 "
      "{%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15, %16, %17, %18, "
      "%19, %20, %21, %22, %23, %24, %25, %26, %27, %28, %29, %30, %31}, %32, %33, p, 1, 1, 0, "
      "0;\n}\n"
      : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3]), "+f"(d[4]), "+f"(d[5]), "+f"(d[6]),
        "+f"(d[7]), "+f"(d[8]), "+f"(d[9]), "+f"(d[10]), "+f"(d[11]), "+f"(d[12]), "+f"(d[13]),
        "+f"(d[14]), "+f"(d[15]), "+f"(d[16]), "+f"(d[17]), "+f"(d[18]), "+f"(d[19]), "+f"(d[20]),
        "+f"(d[21]), "+f"(d[22]), "+f"(d[23]), "+f"(d[24]), "+f"(d[25]), "+f"(d[26]), "+f"(d[27]),
        "+f"(d[28]), "+f"(d[29]), "+f"(d[30]), "+f"(d[31])
      : "l"(a), "l"(b), "r"(accumulate));
}

// D[64 x 128] += A B for the columns 128 kHalf .. + 127 of four 64 x 64
// accumulators (d[n] is columns 64n .. 64n + 63, laid out as WgmmaSmemA's
// d): one m64n128k16 instead of two m64n64k16, so A is read half as often.
// A a 64 x 16 tile from shared memory (K-major) or from registers
// (mma.m16n8k16's A layout, warp w holding rows 16w .. 16w + 15), B 16 x 128
// MN-major (V). (m64n256k16 would read it once, but ptxas asks 158
// registers of every thread for it, more than a 512-thread CTA has.)
// The accumulator operands %0 .. %63 of both, as "+f" outputs:
#define MLA_WGMMA_N128_ACCUMULATORS(d, h) \
  "+f"(d[2 * h][0]), "+f"(d[2 * h][1]), "+f"(d[2 * h][2]), "+f"(d[2 * h][3]), "+f"(d[2 * h][4]), \
  "+f"(d[2 * h][5]), "+f"(d[2 * h][6]), "+f"(d[2 * h][7]), "+f"(d[2 * h][8]), "+f"(d[2 * h][9]), \
  "+f"(d[2 * h][10]), "+f"(d[2 * h][11]), "+f"(d[2 * h][12]), "+f"(d[2 * h][13]), \
  "+f"(d[2 * h][14]), "+f"(d[2 * h][15]), "+f"(d[2 * h][16]), "+f"(d[2 * h][17]), \
  "+f"(d[2 * h][18]), "+f"(d[2 * h][19]), "+f"(d[2 * h][20]), "+f"(d[2 * h][21]), \
  "+f"(d[2 * h][22]), "+f"(d[2 * h][23]), "+f"(d[2 * h][24]), "+f"(d[2 * h][25]), \
  "+f"(d[2 * h][26]), "+f"(d[2 * h][27]), "+f"(d[2 * h][28]), "+f"(d[2 * h][29]), \
  "+f"(d[2 * h][30]), "+f"(d[2 * h][31]), "+f"(d[2 * h + 1][0]), "+f"(d[2 * h + 1][1]), \
  "+f"(d[2 * h + 1][2]), "+f"(d[2 * h + 1][3]), "+f"(d[2 * h + 1][4]), "+f"(d[2 * h + 1][5]), \
  "+f"(d[2 * h + 1][6]), "+f"(d[2 * h + 1][7]), "+f"(d[2 * h + 1][8]), "+f"(d[2 * h + 1][9]), \
  "+f"(d[2 * h + 1][10]), "+f"(d[2 * h + 1][11]), "+f"(d[2 * h + 1][12]), \
  "+f"(d[2 * h + 1][13]), "+f"(d[2 * h + 1][14]), "+f"(d[2 * h + 1][15]), \
  "+f"(d[2 * h + 1][16]), "+f"(d[2 * h + 1][17]), "+f"(d[2 * h + 1][18]), \
  "+f"(d[2 * h + 1][19]), "+f"(d[2 * h + 1][20]), "+f"(d[2 * h + 1][21]), \
  "+f"(d[2 * h + 1][22]), "+f"(d[2 * h + 1][23]), "+f"(d[2 * h + 1][24]), \
  "+f"(d[2 * h + 1][25]), "+f"(d[2 * h + 1][26]), "+f"(d[2 * h + 1][27]), \
  "+f"(d[2 * h + 1][28]), "+f"(d[2 * h + 1][29]), "+f"(d[2 * h + 1][30]), \
  "+f"(d[2 * h + 1][31])
// ... and the instruction up to them:
#define MLA_WGMMA_N128_START                                                                  \
  "{\n.reg .pred p;\nsetp.ne.b32 p, 1, 0;\n"                                                  \
  "wgmma.mma_async.sync.aligned.m64n128k16.f32.bf16.bf16 {"                                   \
  "%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15, %16, %17, %18, "     \
  "%19, %20, %21, %22, %23, %24, %25, %26, %27, %28, %29, %30, %31, %32, %33, %34, %35, "     \
  "%36, %37, %38, %39, %40, %41, %42, %43, %44, %45, %46, %47, %48, %49, %50, %51, %52, "     \
  "%53, %54, %55, %56, %57, %58, %59, %60, %61, %62, %63}, "
template <int kHalf>
__device__ __forceinline__ void WgmmaSmemA128(float (&d)[4][32], uint64_t a, uint64_t b) {
  constexpr int h = kHalf;
  asm volatile(
      MLA_WGMMA_N128_START
      "%64, %65, p, 1, 1, 0, 1;\n}\n"
      : MLA_WGMMA_N128_ACCUMULATORS(d, h)
      : "l"(a), "l"(b));
}
template <int kHalf>
__device__ __forceinline__ void WgmmaRegisterA128(float (&d)[4][32], const uint32_t (&a)[4],
                                                  uint64_t b) {
  constexpr int h = kHalf;
  asm volatile(
      MLA_WGMMA_N128_START
      "{%64, %65, %66, %67}, %68, p, 1, 1, 1;\n}\n"
      : MLA_WGMMA_N128_ACCUMULATORS(d, h)
      : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "l"(b));
}
#undef MLA_WGMMA_N128_START
#undef MLA_WGMMA_N128_ACCUMULATORS

__device__ __forceinline__ void MbarrierInit(uint32_t bar, uint32_t count) {
  asm volatile("mbarrier.init.shared::cta.b64 [%0], %1;\n" ::"r"(bar), "r"(count) : "memory");
}
__device__ __forceinline__ void MbarrierArrive(uint32_t bar) {
  asm volatile("{\n.reg .b64 state;\nmbarrier.arrive.shared::cta.b64 state, [%0];\n}\n" ::"r"(bar)
               : "memory");
}
// Waits for the completion of the barrier's phase of parity `parity`
// (`semantics`: "" or a try_wait qualifier such as ".acquire.cluster").
#define MLA_MBARRIER_WAIT(semantics)                                        \
  "{\n.reg .pred done;\nmbarrier_wait:\n"                                   \
  "mbarrier.try_wait.parity" semantics ".shared::cta.b64 done, [%0], %1;\n" \
  "@!done bra mbarrier_wait;\n}\n"
__device__ __forceinline__ void MbarrierWait(uint32_t bar, uint32_t parity) {
  asm volatile(MLA_MBARRIER_WAIT("") ::"r"(bar), "r"(parity) : "memory");
}
// The same, also acquiring at cluster scope what a peer CTA released before
// its arrival.
__device__ __forceinline__ void MbarrierWaitCluster(uint32_t bar, uint32_t parity) {
  asm volatile(MLA_MBARRIER_WAIT(".acquire.cluster") ::"r"(bar), "r"(parity) : "memory");
}
#undef MLA_MBARRIER_WAIT
// Makes this thread's shared-memory stores visible to wgmma's reads.
__device__ __forceinline__ void FenceForWgmma() {
  asm volatile("fence.proxy.async.shared::cta;\n" ::: "memory");
}

// 2^x (ex2.approx, subnormal results flushed to zero; 2^-inf = 0).
__device__ __forceinline__ float Exp2(float x) {
  float y;
  asm("ex2.approx.ftz.f32 %0, %1;\n" : "=f"(y) : "f"(x));
  return y;
}

// Programmatic dependent launch (PDL). The warp-specialised decode kernels
// and the prologue's inserts (prologue.cu) are launched with LaunchOverlapped, so that
// their CTAs may start while the kernel before them in the stream (the
// prologue that wrote q and the cache rows, or the previous decode's
// kernels) is still finishing; each decode CTA allows the next such launch
// as soon as it starts, a prologue warp once the kernel before it has
// finished. Before WaitForPreviousGrid a kernel reads only what no kernel
// writes (the token's list lengths and index lists, which the key list
// kernel wrote before a plain launch's end, or the inputs copied from the
// host) and writes nothing; after it, the previous kernel is complete and
// its writes are visible. Launched without the attribute, the wait returns
// at once.
__device__ __forceinline__ void WaitForPreviousGrid() {
  asm volatile("griddepcontrol.wait;\n" ::: "memory");
}
__device__ __forceinline__ void AllowNextGrid() {
  asm volatile("griddepcontrol.launch_dependents;\n" ::: "memory");
}
// `cluster`: CTAs a cluster along x (1: no clusters).
template <typename... Params, typename... Args>
cudaError_t LaunchOverlapped(void (*kernel)(Params...), dim3 grid, int threads,
                             uint32_t shared_bytes, cudaStream_t stream, int cluster,
                             Args... args) {
  cudaLaunchAttribute attributes[2] = {};
  attributes[0].id = cudaLaunchAttributeProgrammaticStreamSerialization;
  attributes[0].val.programmaticStreamSerializationAllowed = 1;
  attributes[1].id = cudaLaunchAttributeClusterDimension;
  attributes[1].val.clusterDim.x = static_cast<unsigned>(cluster);
  attributes[1].val.clusterDim.y = 1;
  attributes[1].val.clusterDim.z = 1;
  cudaLaunchConfig_t config = {};
  config.gridDim = grid;
  config.blockDim = dim3(static_cast<unsigned>(threads));
  config.dynamicSmemBytes = shared_bytes;
  config.stream = stream;
  config.attrs = attributes;
  config.numAttrs = cluster > 1 ? 2 : 1;
  return cudaLaunchKernelEx(&config, kernel, args...);
}

struct WgTask {
  int64_t t;
  int h0;
  int heads_here;  // rows of q this CTA reads (below 64 when Hp < 64; Hp in the narrow kernel)
  int split;
  int main_len;
  int begin;
  int end;
  int num_chunks;
};

// Readies a warp-specialised kernel for a launch on the current device: its
// dynamic shared memory, and a refusal (cudaErrorInvalidKernelImage) when it
// was compiled with other than kLaunchRegisters a thread, since fewer at
// launch would leave a setmaxnreg.inc waiting forever. The register count is
// read once per kernel (a read that failed is tried again on the next call).
template <auto kKernel, int kLaunchRegisters>
cudaError_t PrepareWarpSpecialised(uint32_t shared_bytes) {
  // Kept once read; a failed read is returned as it is and tried again.
  static std::atomic<int> registers{0};
  if (registers.load() == 0) {
    cudaFuncAttributes attributes;
    const cudaError_t error = cudaFuncGetAttributes(&attributes, kKernel);
    if (error != cudaSuccess) return error;
    registers.store(attributes.numRegs);
  }
  if (registers.load() != kLaunchRegisters) return cudaErrorInvalidKernelImage;
  return cudaFuncSetAttribute(kKernel, cudaFuncAttributeMaxDynamicSharedMemorySize,
                              static_cast<int>(shared_bytes));
}

// The task of a CTA: token t, heads h0 .. h0 + heads_here - 1, entries
// split * split_entries .. (+ split_entries) of the token's key list in
// 64-key chunks.
__device__ __forceinline__ WgTask MakeTask(const DecodeParams& p, int64_t t, int h0,
                                           int heads_here, int split, int split_entries) {
  WgTask task;
  task.t = t;
  task.h0 = h0;
  task.heads_here = heads_here;
  task.split = split;
  task.main_len = ListLength(p.main, t);
  const int total = task.main_len + ListLength(p.extra, t);
  task.begin = split * split_entries;
  task.end = min(total, task.begin + split_entries);
  task.num_chunks = task.begin < task.end ? (task.end - task.begin + kTileRows - 1) / kTileRows : 0;
  return task;
}

// The entry of the token's key list that row r of `chunk` holds (-1 past the
// task's end), and where the bytes of one that is not -1 are.
__device__ __forceinline__ int32_t SlotOf(const DecodeParams& p, const WgTask& task, int chunk,
                                          int r) {
  const int e = task.begin + chunk * kTileRows + r;
  if (chunk >= task.num_chunks || e >= task.end) return -1;
  return e < task.main_len ? __ldg(p.main.indices + task.t * p.main.width + e)
                           : __ldg(p.extra.indices + task.t * p.extra.width + (e - task.main_len));
}
struct RowSource {
  const uint4* data;
  const uint8_t* scales;
};
__device__ __forceinline__ RowSource SourceOf(const DecodeParams& p, const WgTask& task,
                                              int chunk, int r, int32_t slot) {
  const int e = task.begin + chunk * kTileRows + r;
  const uint8_t* pool = e < task.main_len ? p.main.pool.base : p.extra.pool.base;
  const uint8_t* block = pool + static_cast<int64_t>(slot / kBlockTokens) * kBlockBytes;
  const int offset = slot % kBlockTokens;
  return RowSource{reinterpret_cast<const uint4*>(block + offset * kTokenDataBytes),
                   block + kBlockTokens * kTokenDataBytes + offset * kTokenScaleBytes};
}

// The producers: kGroups groups of two warpgroups (thread u = 0 .. 256
// kGroups - 1 of them; group u / 256) that fill the two key tiles
// (Layout::kKeys) of 64-key chunks and their valid flags (Layout::kValid
// [2][64] int), full and free through the mbarriers Layout::kFull (256
// arrivals a phase: the threads of the group that fills that tile) and
// Layout::kEmpty (the consumers'). With one group it fills every chunk; with
// two (decode_narrow.cu) group g takes chunks g, g + 2, ..., each group its
// own tile, so that two chunks' loads are in flight. Thread (warp w of its
// group's two warpgroups, lane l) handles row r = 8w + l % 8 of each of its
// chunks, and of it the 16-byte pieces l / 8 + 4k: FP8 pieces k = 0..6 (dims
// 16 (l / 8 + 4k) .., scale byte k) and RoPE pieces k = 0, 1. Eight lanes
// store one core-matrix column: 128 contiguous bytes. The loads of a chunk's
// row go out as soon as the group's previous chunk's copy of that row is
// stored and its tile announced, so they have the consumers' time on a chunk
// to arrive; the slots come two of the group's chunks ahead.
struct RowPieces {
  uint4 pieces[9];  // FP8 pieces 0..6, RoPE pieces 7, 8
  uint2 scales;
};

// The scale word pair of a skipped row (slot -1): with its zero codes, a
// scale the bf16x2 path takes gives +0s.
constexpr uint32_t kSkippedRowScales = 0x7f7f7f7fu;

// The scale byte of 64-dim tile `tile` (0..6) from a row's two scale words.
__device__ __forceinline__ uint32_t ScaleByte(uint2 scales, int tile) {
  return ((tile < 4 ? scales.x : scales.y) >> (8 * (tile & 3))) & 0xffu;
}

// Whether a row's 16-byte pieces are kept in L1 on their way (ld.global.nc)
// or not (L1::no_allocate). Nothing reads them twice from one SM's L1, and
// in the narrow kernel skipping L1 is 5% faster (RESULTS.md); the 64-row
// kernel's producers were slower with it at Hp = 128 (measured before that
// shape moved to the pair producers of decode_wgmma.cu) and not faster at
// Hp = 64.
enum class RowCaching { kL1, kNoL1 };

template <RowCaching kCaching>
__device__ __forceinline__ uint4 LoadRowPiece(const uint4* source) {
  if constexpr (kCaching == RowCaching::kL1) return __ldg(source);
  uint4 piece;
  asm volatile("ld.global.nc.L1::no_allocate.v4.u32 {%0, %1, %2, %3}, [%4];\n"
               : "=r"(piece.x), "=r"(piece.y), "=r"(piece.z), "=r"(piece.w)
               : "l"(source));
  return piece;
}

template <RowCaching kCaching>
__device__ __forceinline__ void LoadRow(const DecodeParams& p, const WgTask& task, int chunk,
                                        int r, int32_t slot, int part, RowPieces& row) {
  const uint4 zero = make_uint4(0, 0, 0, 0);
#pragma unroll
  for (int q = 0; q < 9; ++q) row.pieces[q] = zero;
  row.scales = make_uint2(kSkippedRowScales, kSkippedRowScales);
  if (slot == -1) return;
  const RowSource source = SourceOf(p, task, chunk, r, slot);
#pragma unroll
  for (int q = 0; q < 7; ++q) row.pieces[q] = LoadRowPiece<kCaching>(source.data + part + 4 * q);
  row.pieces[7] = LoadRowPiece<kCaching>(source.data + 28 + part);
  row.pieces[8] = LoadRowPiece<kCaching>(source.data + 32 + part);
  row.scales = __ldg(reinterpret_cast<const uint2*>(source.scales));
}

__device__ __forceinline__ void StoreRow(const RowPieces& row, int r, int part,
                                         unsigned char* tile) {
#pragma unroll
  for (int q = 0; q < 7; ++q) {
    uint32_t out[8];
    DequantisePiece(row.pieces[q], ScaleByte(row.scales, q), out);
    const int dim = 16 * (part + 4 * q);
    *reinterpret_cast<uint4*>(tile + TileOffset(r, dim)) =
        make_uint4(out[0], out[1], out[2], out[3]);
    *reinterpret_cast<uint4*>(tile + TileOffset(r, dim + 8)) =
        make_uint4(out[4], out[5], out[6], out[7]);
  }
  *reinterpret_cast<uint4*>(tile + TileOffset(r, kNopeDim + 8 * part)) = row.pieces[7];
  *reinterpret_cast<uint4*>(tile + TileOffset(r, kNopeDim + 8 * (part + 4))) = row.pieces[8];
}

// A producer thread's share of filling a key tile with `chunk`: once the
// consumers are done with the buffer's previous chunk (none before chunk 2:
// the wait on the phase before the first returns at once), its quarter row
// (dequantised) and, for part 0, the row's valid flag; then the thread's
// arrival on the tile's full barrier.
template <typename Layout>
__device__ __forceinline__ void FillTile(unsigned char* smem, uint32_t base, int chunk,
                                         const RowPieces& row, int r, int part, int32_t slot) {
  const int buffer = chunk & 1;
  MbarrierWait(base + Layout::kEmpty + 8 * buffer, ((chunk >> 1) & 1) ^ 1);
  unsigned char* tile = smem + Layout::kKeys + buffer * kTileBytes;
  StoreRow(row, r, part, tile);
  if (part == 0) reinterpret_cast<int*>(smem + Layout::kValid)[buffer * kTileRows + r] = slot != -1;
  FenceForWgmma();
  MbarrierArrive(base + Layout::kFull + 8 * buffer);
}

// The caller passes wt = u % 256 and group = u / 256 (< kGroups).
template <typename Layout, int kGroups = 1, RowCaching kCaching = RowCaching::kL1>
__device__ void Produce(const DecodeParams& p, const WgTask& task, unsigned char* smem, int wt,
                        int group = 0) {
  static_assert(kGroups == 1 || kGroups == 2, "two tiles: one or two producer groups");
  const int part = (wt & 31) >> 3;
  const int r = (wt >> 5) * 8 + (wt & 7);
  const uint32_t base = SharedAddress(smem);
  if (group >= task.num_chunks) return;
  int32_t slot = SlotOf(p, task, group, r);
  int32_t next = SlotOf(p, task, group + kGroups, r);
  RowPieces row;
  WaitForPreviousGrid();  // the cache rows may be the previous kernel's
  LoadRow<kCaching>(p, task, group, r, slot, part, row);
  for (int chunk = group; chunk < task.num_chunks; chunk += kGroups) {
    const int32_t after = SlotOf(p, task, chunk + 2 * kGroups, r);
    FillTile<Layout>(smem, base, chunk, row, r, part, slot);
    // The tile is announced before the next chunk's loads go out: a fence
    // or release after them may wait for them (RESULTS.md).
    if (chunk + kGroups < task.num_chunks) {
      LoadRow<kCaching>(p, task, chunk + kGroups, r, next, part, row);
    }
    slot = next;
    next = after;
  }
}

}  // namespace
}  // namespace cuda
}  // namespace mla

#endif  // MLA_OFFLOAD_KERNELS_CUDA_WGMMA_DEVICE_CUH_

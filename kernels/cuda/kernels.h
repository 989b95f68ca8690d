// Host entry points of the CUDA kernels (key_lists.cu, prologue.cu, decode.cu). Each one
// enqueues its kernel(s) on `stream` and returns the launch error, if any;
// parameters were checked by the caller (CudaBackend) beforehand.
#ifndef MLA_OFFLOAD_KERNELS_CUDA_KERNELS_H_
#define MLA_OFFLOAD_KERNELS_CUDA_KERNELS_H_

#include <cuda_runtime_api.h>

#include "kernels/backend.h"
#include "kernels/cuda/decode_kernels.h"

namespace mla {
namespace cuda {

// The key lists of a decode batch (KeyListBuildParams), one CTA a token. A
// plain launch: the decode kernel that reads the lists before it waits for
// the kernel before it (programmatic dependent launch) must not follow this
// one directly.
cudaError_t LaunchKeyLists(const KeyListBuildParams& params, cudaStream_t stream);

// Spec section 4 in one launch: q rows (norm, RoPE, padding heads) and the
// rows of both insert lists (RoPE, bf16, quantise, write), on a GPU of
// `num_sms` SMs.
cudaError_t LaunchPrologue(const PrologueParams& params, int num_sms, cudaStream_t stream);
// The prologue's insert rows alone (both lists), not its query rows: the
// first half of a fused layer step (FusedQuery).
cudaError_t LaunchInserts(const PrologueParams& params, cudaStream_t stream);
// How many query rows one warp of the prologue handles for a batch of
// `query_rows` (tokens x Hp) on a GPU of `sms` SMs: 4, 2 or 1 (prologue.cu).
int PrologueRowsPerWarp(int64_t query_rows, int sms);

// How LaunchDecode divides every token's key list (main then extra entries,
// main.width + extra.width wide): split k has entries k * split_entries ..
// (k + 1) * split_entries - 1 (the last one ends at the list's length);
// splits == 1 is no split. With a split, boundaries fall on whole chunks of
// the kernels' chunk_keys keys. Host code: the plan, without launching.
struct DecodeSplit {
  int splits;
  int split_entries;
  int chunk_keys;
};
DecodeSplit DecodeSplitOf(const DecodeParams& params, DecodeKernels kernels, int num_sms);

// The prologue's query part (spec section 4) done by the narrow decode
// kernel itself, at its start (a fused layer step, CudaBackend::
// PrologueAndDecode): with q set, a decode reads q [N, H, 512] (the
// prologue's input) instead of DecodeParams::q and normalises, rotates and
// rounds each row as the prologue does (query_device.cuh: the same bits),
// before it waits for the kernel before it (LaunchInserts'), so that this
// work overlaps that kernel. Null q: the decode reads DecodeParams::q.
struct FusedQuery {
  const uint16_t* q = nullptr;
  const int32_t* positions = nullptr;  // [N]
  RopeTableView rope;
  float rms_norm_eps = 0.0f;
};

// Spec section 5 with `kernels`. `scratch` is device memory of at least
// DecodeScratchBytes() for the split-key partial results (may be null when
// that is 0). A FusedQuery needs kernels kWgmma and Hp <= kNarrowMaxHeads
// (the narrow kernel's start makes the rows; in decode_wgmma.cu's the same
// start measured 10 us slower a launch at H = 64, RESULTS.md).
size_t DecodeScratchBytes(const DecodeParams& params, DecodeKernels kernels, int num_sms);
cudaError_t LaunchDecode(const DecodeParams& params, DecodeKernels kernels, int num_sms,
                         void* scratch, cudaStream_t stream, const FusedQuery& fused = {});

// The warpgroup-MMA decode kernel (decode_wgmma.cu): one CTA per
// kWgmmaHeads heads of a token and split (the last group of an Hp that is
// not a multiple of 64, and a smaller Hp, which only MLA_CUDA_DECODE=padded
// sends it, padded with zero queries in shared memory; at Hp 72..128 the
// token's two CTAs run as a cluster that shares the key tiles); called
// by LaunchDecode, which plans the splits (partial_o/partial_ml as there).
inline constexpr int kWgmmaHeads = 64;
inline constexpr int kWgmmaChunk = 64;  // keys a chunk (also the narrow kernel's)
inline constexpr int kNarrowMaxHeads = 32;
cudaError_t LaunchDecodeWgmma(const DecodeParams& params, int groups, int splits,
                              int split_entries, float* partial_o, float* partial_ml,
                              cudaStream_t stream);

// Whether the narrow kernel's producers keep a second chunk in flight in a
// raw chunk of shared memory (ProduceRing) for a CTA of `split_entries` keys
// at Hp: always at Hp 24 and 32 (one producer group); at Hp 8 and 16 (two
// groups) only where a CTA has at least kNarrowRingMinChunks chunks, as the
// ring's deeper start is paid back by its faster chunks only there (it won
// at 18 chunks a CTA and lost at 10, RESULTS.md).
inline constexpr int kNarrowRingMinChunks = 14;
inline constexpr bool NarrowUsesRing(int padded_heads, int split_entries) {
  return padded_heads > 16 ||
         (split_entries + kWgmmaChunk - 1) / kWgmmaChunk >= kNarrowRingMinChunks;
}

// The narrow decode kernel (decode_narrow.cu) for Hp = 8, 16, 24 or 32: one CTA
// per token and split; called by LaunchDecode as LaunchDecodeWgmma.
cudaError_t LaunchDecodeNarrow(const DecodeParams& params, const FusedQuery& fused, int splits,
                               int split_entries, float* partial_o, float* partial_ml,
                               cudaStream_t stream);

// Runs a self-check of the fp8 conversion on the device (a negative value
// rounding to zero must give 0x80); false when the hardware disagrees.
cudaError_t CheckFp8NegativeZero(cudaStream_t stream, bool* ok);

}  // namespace cuda
}  // namespace mla

#endif  // MLA_OFFLOAD_KERNELS_CUDA_KERNELS_H_

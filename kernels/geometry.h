// Fixed geometry of DeepSeek-V4 sparse MLA (spec section 1 and 3).
//
// Every size that does not vary between the V4 profiles lives here, so that a
// kernel, the cache format and the server agree on them by construction.
#ifndef MLA_OFFLOAD_KERNELS_GEOMETRY_H_
#define MLA_OFFLOAD_KERNELS_GEOMETRY_H_

#include <cstdint>

namespace mla {

// One latent row per token (MQA, K = V): 448 NoPE dims then 64 RoPE dims.
inline constexpr int kHeadDim = 512;
inline constexpr int kNopeDim = 448;
inline constexpr int kRopeDim = 64;
inline constexpr int kRopePairs = kRopeDim / 2;
// One such row in bf16, as clients send q, kv and compressed rows.
inline constexpr int64_t kRowBytes = int64_t{kHeadDim} * 2;  // 1024

// NoPE dims are quantised in tiles of 64 with one UE8M0 scale each.
inline constexpr int kQuantTile = 64;
inline constexpr int kNopeTiles = kNopeDim / kQuantTile;  // 7

// The decode's optional FP8 output (spec section 5): per token and head, 512
// e4m3fn bytes in blocks of 128 dims, one UE8M0 scale byte a block.
inline constexpr int kOutputQuantBlock = 128;
inline constexpr int kOutputQuantBlocks = kHeadDim / kOutputQuantBlock;  // 4
inline constexpr int64_t kFp8RowBytes = kHeadDim;                        // 512
inline constexpr int64_t kFp8ScaleRowBytes = kOutputQuantBlocks;         // 4

// MODEL1 cache layout: per token 448 e4m3 bytes + 64 bf16, then 8 scale bytes.
inline constexpr int kTokenDataBytes = kNopeDim + kRopeDim * 2;  // 576
inline constexpr int kTokenScaleBytes = 8;                       // 7 scales + pad
inline constexpr int kTokenBytes = kTokenDataBytes + kTokenScaleBytes;  // 584

// Tokens per cache block (this project's choice for every pool) and the
// block's size in bytes, rounded up to a whole number of 576-byte rows.
inline constexpr int kBlockTokens = 64;
inline constexpr int64_t kBlockBytes =
    (int64_t{kBlockTokens} * kTokenBytes + kTokenDataBytes - 1) /
    kTokenDataBytes * kTokenDataBytes;  // 37440
static_assert(kBlockBytes == 37440, "MODEL1 block size for bs = 64");

// Sliding window of every V4 layer.
inline constexpr int kSwaWindow = 128;

}  // namespace mla

#endif  // MLA_OFFLOAD_KERNELS_GEOMETRY_H_

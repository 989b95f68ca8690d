// An independent float64 reference of spec sections 3-5 (cache format, fused
// prologue, sparse MLA decode with attention sink), for holding compute
// backends to the contract.
//
// Everything here was written from docs/spec/dsv4-attention.md alone and
// shares no code with the backends: bf16 rounding, the e4m3 encoder (nearest
// of the 127 finite magnitudes rather than bit manipulation), UE8M0
// exponents, cache slot offsets and dequantisation are re-derived. The only
// inputs shared with the backends are the geometry constants
// (kernels/geometry.h) and the RoPE table (kernels/rope.h), which the spec
// says both sides read.
//
// The reference computes in float64 and returns unrounded values, so that
// kernels/reference/tolerance.h can apply the rules of spec section 7; only
// the cache bytes, which the spec defines exactly, are produced in final form.
// Functions are pure and thread-compatible. Inputs whose sizes or values break
// the contract (wrong span size, position beyond the table, slot or index
// outside the pool) give InvalidArgument. Speed is not a goal: the reference
// is meant for test-sized inputs.
#ifndef MLA_OFFLOAD_KERNELS_REFERENCE_REFERENCE_F64_H_
#define MLA_OFFLOAD_KERNELS_REFERENCE_REFERENCE_F64_H_

#include <array>
#include <cstdint>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/types/span.h"
#include "kernels/geometry.h"
#include "kernels/rope.h"

namespace mla {
namespace reference {

// ---- Number formats (spec section 3).

// The value of a bf16 bit pattern (NaN and infinities included).
double Bf16Value(uint16_t bits);

// The bf16 nearest to `value`, ties to even; overflow gives infinity and NaN
// gives a quiet NaN of the same sign. Rounds once, straight from float64.
uint16_t RoundToBf16(double value);

// The e4m3fn code nearest to `value`: the closest of the 127 finite
// magnitudes, ties to the even code, saturating at 448. A negative value,
// even one that rounds to zero, keeps the sign bit (0x80). NaN gives 0x7f.
uint8_t EncodeE4m3(double value);

// The value of an e4m3fn code (0x7f and 0xff are NaN).
double E4m3Value(uint8_t code);

// The value a code stands for under a UE8M0 scale byte: E4m3Value(code) *
// 2^(scale_byte - 127) (a cache NoPE value, section 3; an element of the
// decode's FP8 output, section 5).
double ScaledE4m3Value(uint8_t code, uint8_t scale_byte);

// The smallest integer e with 2^e >= max(amax, 1e-4) / 448, exactly.
int ScaleExponent(double amax);

// ---- Cache layout (spec section 3).

// Byte offsets of a global slot's 576-byte data row and 8-byte scale row.
int64_t DataOffset(int64_t slot);
int64_t ScaleOffset(int64_t slot);

// Slots in a pool of `pool_bytes` (whole blocks only; a partial block holds
// no slot).
int64_t PoolSlots(int64_t pool_bytes);

// The 512 values a backend must read back from the row at `slot`: e4m3 times
// 2^(byte - 127) for the NoPE dims, the stored bf16 for the RoPE dims.
absl::StatusOr<std::array<double, kHeadDim>> DequantizeSlot(absl::Span<const uint8_t> pool,
                                                            int64_t slot);

// ---- Prologue (spec section 4).

// The q part of the prologue for N tokens. Heads H..Hp-1 are zero.
struct QueryReference {
  int64_t num_tokens = 0;
  int num_heads = 0;     // H
  int padded_heads = 0;  // Hp
  // [N, Hp, 512]: normalised and rotated, before the final bf16 rounding.
  std::vector<double> values;
  // [N, Hp, 32]: |a| + |b| of each RoPE pair (a, b) before rotation, which
  // bounds the cancellation error a float32 rotation may make (section 7).
  std::vector<double> pair_magnitudes;
};

// q is [N, H, 512] bf16 with N = positions.size(). Hp is not checked against
// the supported set: the reference computes whatever it is asked.
absl::StatusOr<QueryReference> ReferenceQuery(absl::Span<const uint16_t> q,
                                              absl::Span<const int32_t> positions, int num_heads,
                                              int padded_heads, double eps, const RopeTable& rope);

// One KV row (an SWA row or a compressed row) after RoPE, and its cache bytes.
struct KvRowReference {
  std::array<double, kHeadDim> rotated;            // after RoPE, before bf16 rounding
  std::array<double, kHeadDim> rounded;            // rotated, rounded to bf16: what is quantised
  std::array<double, kRopePairs> pair_magnitudes;  // |a| + |b| before rotation
  std::array<uint8_t, kTokenDataBytes> data;       // 448 e4m3 + 64 bf16 (little endian)
  std::array<uint8_t, kTokenScaleBytes> scales;    // 7 UE8M0 bytes + pad byte 0
};

// `row` is 512 bf16 values; `position` selects the table row it is rotated by.
absl::StatusOr<KvRowReference> ReferenceKvRow(absl::Span<const uint16_t> row, int32_t position,
                                              const RopeTable& rope);

// Writes a row's bytes at `slot` of a host pool, as an insert would.
absl::Status WriteCacheRow(const KvRowReference& row, int64_t slot, absl::Span<uint8_t> pool);

// ---- Decode (spec section 5).

// One key list in one pool. Row t of `indices` holds global slots of `pool`;
// its first lengths[t] entries are used, -1 entries are skipped, and a slot
// listed twice counts twice.
struct KeyListInputs {
  int width = 0;                      // 0: no list
  absl::Span<const int32_t> indices;  // [N, width]
  absl::Span<const int32_t> lengths;  // [N]; empty: every length is width
  absl::Span<const uint8_t> pool;     // the whole pool, host bytes
};

struct DecodeInputs {
  int64_t num_tokens = 0;
  int num_heads = 0;             // H: heads computed (the first H of q)
  int padded_heads = 0;          // Hp: heads in q
  absl::Span<const uint16_t> q;  // [N, Hp, 512] bf16
  double softmax_scale = 0.0;
  absl::Span<const float> sinks;  // [H], or [N, H] if sinks_per_token; empty: no sink (-inf)
  bool sinks_per_token = false;
  KeyListInputs main;
  KeyListInputs extra;
  // De-rotates out dims 448..511 by the query position (conjugate rotation).
  bool derotate = false;
  absl::Span<const int32_t> positions;  // [N]; read only when derotate
  const RopeTable* rope = nullptr;      // read only when derotate
  // For section 7's composition clause, when q is the checker's own q_out
  // rather than the one the backend used: [N, Hp, 512], how far (in value,
  // one bf16 ulp) the backend's q_out may differ from q at each element, 0
  // where it may not (tolerance.h's TieQuerySlack, DifferingQuerySlack).
  // Empty: the backend used q itself.
  absl::Span<const double> q_slack;
};

struct DecodeReference {
  int64_t num_tokens = 0;
  int num_heads = 0;
  std::vector<double> out;  // [N, H, 512], before the final bf16 rounding; 0 when J is empty
  std::vector<double> lse;  // [N, H], natural log, sink excluded; +inf when J is empty
  // [N]: A_t, the largest |V| among token t's keys (0 when J is empty), which
  // scales the absolute tolerance of section 7.
  std::vector<double> max_abs_values;
  std::vector<int64_t> num_keys;  // [N]: |J|, duplicates counted
  // [N, H]: delta_t of the composition clause, softmax_scale times the
  // largest sum over e of q_slack[e] * |K_j,e| among the keys j; all 0 when
  // q_slack is empty or J is.
  std::vector<double> composition_deltas;
};

absl::StatusOr<DecodeReference> ReferenceDecode(const DecodeInputs& inputs);

}  // namespace reference
}  // namespace mla

#endif  // MLA_OFFLOAD_KERNELS_REFERENCE_REFERENCE_F64_H_

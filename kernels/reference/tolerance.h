// The tolerances of spec section 7, as comparators of backend output against
// the float64 reference of kernels/reference/reference_f64.h.
//
// Each rule gives an element's "excess": its error as a fraction of what the
// rule allows, so an element passes when its excess is at most 1. Exact rules
// (cache bytes, padding heads, +inf lse) give 0 or +inf. NaN, on either side,
// never passes (+inf). The array comparators check every element, including
// those a backend must write as constants (padding heads of q_out, the pad
// byte, out and lse of an empty key set), so poisoned outputs that a backend
// failed to write are caught.
//
// The decode rules assume the reference decoded the q_out the backend used.
// A check that recomputes q_out itself (a client verifying a server, a
// CPU-vs-GPU comparison of a whole layer step) applies section 7's
// composition clause instead: it passes DecodeInputs::q_slack (from
// TieQuerySlack when only its own side is known, DifferingQuerySlack when
// both are), ReferenceDecode turns that into a delta per token and head, and
// the decode comparators widen the lse allowance by delta and the out
// allowance by 2 * delta * A_t. Without q_slack every delta is 0.
//
// A comparator returns a ComparisonReport: the counts, the first failing
// element and the one furthest out of tolerance, each with its indices, and
// the largest excess seen (a margin worth printing even when all pass). A
// size mismatch between output and reference is one failure. Everything here
// is pure and thread-compatible.
#ifndef MLA_OFFLOAD_KERNELS_REFERENCE_TOLERANCE_H_
#define MLA_OFFLOAD_KERNELS_REFERENCE_TOLERANCE_H_

#include <cstdint>
#include <string>
#include <vector>

#include "absl/functional/function_ref.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "absl/types/span.h"
#include "kernels/reference/reference_f64.h"

namespace mla {
namespace reference {

// Decode out: |out - ref| <= 2e-3 * max(1, A_t) + 1e-2 * |ref|.
inline constexpr double kDecodeAbsoluteTolerance = 2e-3;
inline constexpr double kDecodeRelativeTolerance = 1e-2;
// lse: |lse - ref| <= 1e-3 + 2e-6 * |ref|. The relative term is float32's
// accumulation at |lse| in the thousands, where 1e-3 alone is below it.
inline constexpr double kLseAbsoluteTolerance = 1e-3;
inline constexpr double kLseRelativeTolerance = 2e-6;
// FP8 decode out: e4m3 rounding of the fp32 o that the kernel quantised
// (which the decode out clause B holds to the reference), with s the
// block's scale 2^(byte - 127):
//   |deq - ref| <= (1 + 2^-4) * B + 2^-4 * |ref| + 2^-10 * s.
// 2^-4 is half an ulp of e4m3's 3 mantissa bits relative to a normal, 2^-10
// half the subnormal step 2^-9 (in units of s); the (1 + 2^-4) * B is the
// rounding's share of |o| <= |ref| + B.
inline constexpr double kFp8HalfUlp = 1.0 / 16;
inline constexpr double kFp8HalfSubnormalStep = 1.0 / 1024;
// A rotated element may be off by this fraction of |a| + |b| of its pair
// before rotation (float32 rotations cancel near zero): 2^-16.
inline constexpr double kRopePairTolerance = 1.0 / 65536.0;

// The composition clause counts a q_out element whose float64 value lies
// within this fraction of its own magnitude of a bf16 rounding midpoint:
// 2^-20, sixteen float32 ulps, more than a float32 prologue may be off.
inline constexpr double kTieWindow = 1.0 / (1 << 20);

// ---- Element rules.

// Distance in bf16 ulps between two bf16 values (+0 and -0 are equal; the
// count crosses zero); +inf when either is NaN.
double Bf16UlpDistance(uint16_t a, uint16_t b);

// ulp_bf16 of the composition clause: the distance from the bf16 value of
// |bits| to the next larger bf16 (0 for NaN and infinities).
double Bf16Ulp(uint16_t bits);

// A prologue q_out element against its float64 reference: equal to the
// reference rounded to bf16 or one ulp apart, or, for a RoPE element,
// within kRopePairTolerance * pair_magnitude of it. Pass pair_magnitude 0 for
// a NoPE element.
double QueryOutExcess(uint16_t actual, double expected, double pair_magnitude);

// A bf16 RoPE value of a cache row against the reference's rotated float64
// value, with the same rule as QueryOutExcess. Section 7 says "equal or within
// the RoPE clause"; the one-ulp allowance is read into it because a float32
// rotation that lands next to a bf16 rounding tie may round the other way
// (seen on random data: -0.15576171 stored as -0.15625, not -0.155273438).
double CacheRopeExcess(uint16_t actual, double expected, double pair_magnitude);

// A decode out element (the bf16 output's value) against its float64
// reference, with A_t the largest |V| among the token's keys, widened by
// 2 * composition_delta * A_t (see the top of this file).
double DecodeOutExcess(double actual, double expected, double max_abs_value,
                       double composition_delta = 0.0);

// What DecodeOutExcess allows: 2e-3 * max(1, A_t) + 1e-2 * |expected| +
// 2 * composition_delta * A_t (the clause B above).
double DecodeOutAllowance(double expected, double max_abs_value, double composition_delta = 0.0);

// An element of the FP8 output (its dequantised value, ScaledE4m3Value)
// against its float64 reference, in a block of scale `block_scale`, by the
// FP8 rule above (B with the same arguments as DecodeOutExcess).
double Fp8OutExcess(double actual, double expected, double max_abs_value, double block_scale,
                    double composition_delta = 0.0);

// The scale byte of one FP8 output block: 0 when byte - 127 is the
// exponent ScaleExponent gives some amax within `allowance` of the
// reference's block amax `expected_amax` (the kernel quantised an o whose
// every element is within its B of the reference: pass the block's largest
// B), +inf otherwise.
double Fp8ScaleExcess(uint8_t scale_byte, double expected_amax, double allowance);

// A decode lse against its reference: +inf exactly where the reference is
// +inf (empty key set), otherwise within kLseAbsoluteTolerance +
// kLseRelativeTolerance * |expected| + composition_delta.
double LseExcess(double actual, double expected, double composition_delta = 0.0);

// ---- The composition clause's q_slack (DecodeInputs::q_slack).

// Only the checker's own q_out is known: each element of `expected` [N, Hp,
// 512] whose float64 value lies within kTieWindow * |value| of a bf16
// rounding midpoint gets the Bf16Ulp of the larger of the two bf16 values
// beside that midpoint (at least their distance: a backend's float32
// prologue may round to either); every other element, the padding heads'
// included, gets 0.
std::vector<double> TieQuerySlack(const QueryReference& expected);

// Both sides' q_out are known: each element where the bit patterns differ
// gets the Bf16Ulp of the larger in magnitude, the others 0. InvalidArgument
// when the sizes differ.
absl::StatusOr<std::vector<double>> DifferingQuerySlack(absl::Span<const uint16_t> a,
                                                        absl::Span<const uint16_t> b);

// ---- Reports.

class ComparisonReport {
 public:
  // `subject` names what is compared, e.g. "q_out" or "swa pool".
  explicit ComparisonReport(std::string subject);

  // Counts one element. `describe` says where it is and what was seen; it is
  // called only when the element becomes the first or the worst failure.
  void Check(double excess, absl::FunctionRef<std::string()> describe);

  bool ok() const { return failed_ == 0; }
  int64_t checked() const { return checked_; }
  int64_t failed() const { return failed_; }
  double max_excess() const { return max_excess_; }
  // Empty when ok().
  const std::string& first_failure() const { return first_failure_; }
  const std::string& worst_failure() const { return worst_failure_; }

  // One line: "q_out: 4096 elements within tolerance (max 0.5 of allowed)",
  // or the failure count with the first and worst failures.
  std::string ToString() const;
  // OK, or InternalError carrying ToString().
  absl::Status ToStatus() const;

 private:
  std::string subject_;
  int64_t checked_ = 0;
  int64_t failed_ = 0;
  double max_excess_ = 0.0;
  std::string first_failure_;
  std::string worst_failure_;
};

// ---- Array comparators.

// q_out [N, Hp, 512] bf16 against ReferenceQuery: heads < H by
// QueryOutExcess, padding heads exactly +0 (bit pattern 0).
ComparisonReport CompareQueryOut(absl::Span<const uint16_t> q_out, const QueryReference& expected);

// The cache row at `slot` of a host pool against its reference: e4m3 bytes
// and scale bytes equal, pad byte 0, RoPE values by CacheRopeExcess. `label`
// names the row in messages (e.g. "row 3").
void CompareCacheRow(absl::Span<const uint8_t> pool, int64_t slot, const KvRowReference& expected,
                     absl::string_view label, ComparisonReport& report);

// The rows of one insert: row r was written at slots[r] (-1: not written,
// not checked); expected[r] is its reference.
ComparisonReport CompareCacheRows(absl::Span<const uint8_t> pool, absl::Span<const int32_t> slots,
                                  absl::Span<const KvRowReference> expected,
                                  absl::string_view subject);

// Decode out [N, H, 512] bf16 against ReferenceDecode, by DecodeOutExcess
// with the reference's composition_deltas.
ComparisonReport CompareDecodeOut(absl::Span<const uint16_t> out, const DecodeReference& expected);

// The FP8 output, e4m3 [N, H, 512] and scales [N, H, 4], against
// ReferenceDecode: per block of 128 dims its scale byte by Fp8ScaleExcess,
// then each element by Fp8OutExcess, with the reference's
// composition_deltas; a token whose key set is empty exactly 0x00 codes and
// the amax floor's scale byte (ScaleExponent(0) + 127 = 105).
ComparisonReport CompareDecodeOutFp8(absl::Span<const uint8_t> e4m3,
                                     absl::Span<const uint8_t> scales,
                                     const DecodeReference& expected);

// Decode lse [N, H] against ReferenceDecode, by LseExcess with the
// reference's composition_deltas.
ComparisonReport CompareLse(absl::Span<const float> lse, const DecodeReference& expected);

}  // namespace reference
}  // namespace mla

#endif  // MLA_OFFLOAD_KERNELS_REFERENCE_TOLERANCE_H_

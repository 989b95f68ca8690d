// --verify: recomputes a token of a sampled layer step on this machine and
// holds the server's answer to spec section 7.
//
// The rows the token attended are rebuilt from the Workload (SWA rows of
// positions max(0, p-127)..p, and the C4A top-k rows or every C128A row
// j < (p+1)/128), inserted into a small local cache pool by the CPU backend's
// prologue (RoPE, bf16 rounding, FP8 quantisation: the same bytes the server
// stores), the query goes through the CPU prologue, and then
// - the float64 reference (kernels/reference) decodes over that cache: the
//   server's out must be within |out - ref| <= 2e-3 max(1, A_t) + 1e-2 |ref|
//   and its lse within 1e-3 + 2e-6 |ref| (spec section 7; the comparators of
//   kernels/reference/tolerance.h), both widened by the section's
//   composition clause, because the server's q_out is its own prologue's, not
//   this one: where the token's float64 q_out lies within 2^-20 of a bf16
//   rounding midpoint the two may differ by one ulp (delta_t added to the lse
//   allowance, 2 delta_t A_t to the out allowance); an FP8 answer
//   (--fp8_output) by the section's FP8 rule instead (CheckFp8);
// - the CPU backend decodes too, keys in the server's order (SWA ascending,
//   then compressed rows in top-k or row order): a server on the CPU backend
//   should match it bit for bit (reported, not required: a CUDA server
//   rounds differently within the tolerance).
//
// Not thread-safe (one CPU backend, cached RoPE tables); one per thread.
#ifndef MLA_OFFLOAD_CLIENT_LOADTEST_VERIFIER_H_
#define MLA_OFFLOAD_CLIENT_LOADTEST_VERIFIER_H_

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/types/span.h"
#include "client/loadtest/workload.h"
#include "kernels/cpu_backend.h"
#include "kernels/reference/reference_f64.h"
#include "kernels/reference/tolerance.h"
#include "kernels/rope.h"

namespace mla::loadtest {

// One token of a layer step, as it was sent.
struct SentToken {
  int layer = 0;
  int heads = 0;        // H
  int head_offset = 0;  // first head of the rank
  bool derotate = false;
  bool fp8_output = false;  // the answer is the FP8 output
  uint64_t salt = 0;  // its session
  int32_t position = 0;
  absl::Span<const uint16_t> q;  // [H, 512] bf16
  std::vector<int32_t> topk;     // C4A layers: the K entries sent; empty otherwise
};

// What the CPU backend and the float64 reference make of a token.
struct LocalAnswer {
  std::vector<uint16_t> q_out;           // [Hp, 512] bf16: the q both decodes read
  std::vector<uint16_t> out;             // [H, 512] bf16, CPU backend (not fp8_output)
  std::vector<uint8_t> e4m3;             // [H, 512] e4m3fn, CPU backend (fp8_output)
  std::vector<uint8_t> scales;           // [H, 4] UE8M0, CPU backend (fp8_output)
  std::vector<float> lse;                // [H], CPU backend
  reference::DecodeReference reference;  // with the composition clause's deltas
};

// The verdict on one token of the server's answer.
struct TokenVerdict {
  bool ok = false;             // out (and lse, when given) within tolerance
  bool bit_identical = false;  // out (or e4m3 and scales) equals the CPU backend's bit for bit
  double max_excess = 0;       // largest error as a fraction of the allowed one
  std::string failure;         // the comparators' report when !ok
};

class Verifier {
 public:
  Verifier(const Workload& workload, int cpu_threads);

  // The token through the CPU prologue, then RecomputeWith its q_out.
  absl::StatusOr<LocalAnswer> Recompute(const SentToken& token);

  // The token decoded from `q_out` ([Hp, 512] bf16) instead of the CPU
  // prologue's: what a server whose prologue rounded differently answers
  // (the tests' model of a CUDA server at a rounding tie). The reference's
  // composition deltas still come from the token's own float64 q_out.
  absl::StatusOr<LocalAnswer> RecomputeWith(const SentToken& token,
                                            absl::Span<const uint16_t> q_out);

  // `out` is the server's [H, 512]; `lse` its [H], or empty when the layer
  // step did not ask for it.
  absl::StatusOr<TokenVerdict> Check(const SentToken& token, absl::Span<const uint16_t> out,
                                     absl::Span<const float> lse);
  // The same for an FP8 answer (token.fp8_output): `e4m3` [H, 512] and
  // `scales` [H, 4].
  absl::StatusOr<TokenVerdict> CheckFp8(const SentToken& token, absl::Span<const uint8_t> e4m3,
                                        absl::Span<const uint8_t> scales,
                                        absl::Span<const float> lse);

 private:
  // The verdict of an out comparison, with the lse's added.
  static TokenVerdict Verdict(const reference::ComparisonReport& out_report,
                              absl::Span<const float> lse, const LocalAnswer& local,
                              bool bit_identical);
  // Hp of a token, or why the token cannot be recomputed.
  absl::StatusOr<int> PaddedHeads(const SentToken& token) const;
  const RopeTable& Table(RopeKind kind, int32_t position);

  const Workload& workload_;
  CpuBackend backend_;
  std::unique_ptr<RopeTable> plain_;
  std::unique_ptr<RopeTable> yarn_;
};

}  // namespace mla::loadtest

#endif  // MLA_OFFLOAD_CLIENT_LOADTEST_VERIFIER_H_

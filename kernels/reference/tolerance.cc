#include "kernels/reference/tolerance.h"

#include <algorithm>
#include <cmath>
#include <limits>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"

namespace mla {
namespace reference {
namespace {

constexpr double kInf = std::numeric_limits<double>::infinity();

// bf16 patterns mapped to integers that increase with the value, so that
// neighbours differ by one (both zeros map to 0).
int32_t OrderedBf16(uint16_t bits) {
  const int32_t magnitude = bits & 0x7fff;
  return (bits & 0x8000) ? -magnitude : magnitude;
}

std::string Bf16Text(uint16_t bits) {
  return absl::StrFormat("0x%04x (%.9g)", bits, Bf16Value(bits));
}

// The rule shared by q_out and the cache's RoPE values.
double RoundedExcess(uint16_t actual, double expected, double pair_magnitude) {
  const uint16_t rounded = RoundToBf16(expected);
  const double ulps = Bf16UlpDistance(actual, rounded);
  if (ulps <= 1.0 || std::isinf(ulps)) return ulps;
  const double allowed = kRopePairTolerance * pair_magnitude;
  if (!(allowed > 0.0)) return ulps;
  const double error = std::fabs(Bf16Value(actual) - Bf16Value(rounded));
  return std::min(ulps, error / allowed);
}

// +inf; every finite positive bf16 pattern is below it.
constexpr uint16_t kBf16Infinity = 0x7f80;

// TieQuerySlack's rule for one element.
double TieSlack(double value) {
  const double magnitude = std::fabs(value);
  if (!(magnitude > 0.0)) return 0.0;  // zero or NaN
  const uint16_t nearest = RoundToBf16(magnitude);
  if (nearest >= kBf16Infinity) return 0.0;
  const double rounded = Bf16Value(nearest);
  const uint16_t beside = magnitude > rounded ? nearest + 1 : nearest - 1;
  const double midpoint = (rounded + Bf16Value(beside)) / 2.0;
  if (!(std::fabs(magnitude - midpoint) <= kTieWindow * magnitude)) return 0.0;
  return Bf16Ulp(std::max(nearest, beside));  // positive patterns order as their values
}

void CheckSizes(absl::string_view what, size_t actual, size_t expected, ComparisonReport& report) {
  if (actual == expected) return;
  report.Check(kInf, [&] {
    return absl::StrCat(what, " holds ", actual, " elements, the reference ", expected);
  });
}

// Token and head `i` of a reference's deltas; 0 in a reference made
// without them.
double CompositionDelta(const DecodeReference& expected, int64_t i) {
  return expected.composition_deltas.empty() ? 0.0 : expected.composition_deltas[i];
}

std::string DeltaText(double delta) {
  return delta > 0.0 ? absl::StrFormat(", composition delta %.3g", delta) : std::string();
}

}  // namespace

double Bf16UlpDistance(uint16_t a, uint16_t b) {
  const double va = Bf16Value(a);
  const double vb = Bf16Value(b);
  if (std::isnan(va) || std::isnan(vb)) return kInf;
  if (std::isinf(va) || std::isinf(vb)) return va == vb ? 0.0 : kInf;
  return std::abs(OrderedBf16(a) - OrderedBf16(b));
}

double Bf16Ulp(uint16_t bits) {
  const uint16_t magnitude = bits & 0x7fff;
  if (magnitude >= kBf16Infinity) return 0.0;
  if (magnitude + 1 == kBf16Infinity) return Bf16Value(magnitude) - Bf16Value(magnitude - 1);
  return Bf16Value(magnitude + 1) - Bf16Value(magnitude);
}

double QueryOutExcess(uint16_t actual, double expected, double pair_magnitude) {
  return RoundedExcess(actual, expected, pair_magnitude);
}

double CacheRopeExcess(uint16_t actual, double expected, double pair_magnitude) {
  return RoundedExcess(actual, expected, pair_magnitude);
}

double DecodeOutAllowance(double expected, double max_abs_value, double composition_delta) {
  return kDecodeAbsoluteTolerance * std::max(1.0, max_abs_value) +
         kDecodeRelativeTolerance * std::fabs(expected) + 2.0 * composition_delta * max_abs_value;
}

double DecodeOutExcess(double actual, double expected, double max_abs_value,
                       double composition_delta) {
  if (std::isnan(actual) || std::isnan(expected) || std::isinf(actual)) return kInf;
  return std::fabs(actual - expected) /
         DecodeOutAllowance(expected, max_abs_value, composition_delta);
}

double Fp8OutExcess(double actual, double expected, double max_abs_value, double block_scale,
                    double composition_delta) {
  if (std::isnan(actual) || std::isnan(expected) || std::isinf(actual)) return kInf;
  const double allowed =
      (1.0 + kFp8HalfUlp) * DecodeOutAllowance(expected, max_abs_value, composition_delta) +
      kFp8HalfUlp * std::fabs(expected) + kFp8HalfSubnormalStep * block_scale;
  return std::fabs(actual - expected) / allowed;
}

double Fp8ScaleExcess(uint8_t scale_byte, double expected_amax, double allowance) {
  if (std::isnan(expected_amax) || std::isnan(allowance)) return kInf;
  // ScaleExponent grows with amax: the kernel's amax lies within the
  // allowance of the reference's, so its exponent lies between these.
  const int lowest = ScaleExponent(std::max(expected_amax - allowance, 0.0));
  const int highest = ScaleExponent(expected_amax + allowance);
  const int exponent = int{scale_byte} - 127;
  return exponent >= lowest && exponent <= highest ? 0.0 : kInf;
}

double LseExcess(double actual, double expected, double composition_delta) {
  if (std::isnan(actual) || std::isnan(expected)) return kInf;
  if (std::isinf(expected) || std::isinf(actual)) return actual == expected ? 0.0 : kInf;
  const double allowed =
      kLseAbsoluteTolerance + kLseRelativeTolerance * std::fabs(expected) + composition_delta;
  return std::fabs(actual - expected) / allowed;
}

std::vector<double> TieQuerySlack(const QueryReference& expected) {
  std::vector<double> slack(expected.values.size());
  for (size_t i = 0; i < slack.size(); ++i) slack[i] = TieSlack(expected.values[i]);
  return slack;
}

absl::StatusOr<std::vector<double>> DifferingQuerySlack(absl::Span<const uint16_t> a,
                                                        absl::Span<const uint16_t> b) {
  if (a.size() != b.size()) {
    return absl::InvalidArgumentError(
        absl::StrCat("q_out sides hold ", a.size(), " and ", b.size(), " elements"));
  }
  std::vector<double> slack(a.size(), 0.0);
  for (size_t i = 0; i < a.size(); ++i) {
    if (Bf16Value(a[i]) == Bf16Value(b[i])) continue;
    slack[i] = Bf16Ulp(std::max<uint16_t>(a[i] & 0x7fff, b[i] & 0x7fff));
  }
  return slack;
}

ComparisonReport::ComparisonReport(std::string subject) : subject_(std::move(subject)) {}

void ComparisonReport::Check(double excess, absl::FunctionRef<std::string()> describe) {
  ++checked_;
  // NaN compares false both ways: it must fail and count as the worst.
  const bool passed = excess <= 1.0;
  const double ordered = std::isnan(excess) ? kInf : excess;
  const bool worst = ordered > max_excess_ || checked_ == 1;
  if (worst) max_excess_ = ordered;
  if (passed) return;
  ++failed_;
  if (failed_ == 1 || worst) {
    std::string text = absl::StrCat(describe(), " (excess ", absl::StrFormat("%.3g", ordered), ")");
    if (failed_ == 1) first_failure_ = text;
    if (worst) worst_failure_ = std::move(text);
  }
}

std::string ComparisonReport::ToString() const {
  if (ok()) {
    return absl::StrFormat("%s: %d elements within tolerance (max %.3g of allowed)", subject_,
                           checked_, max_excess_);
  }
  return absl::StrCat(subject_, ": ", failed_, " of ", checked_,
                      " elements outside tolerance; first: ", first_failure_,
                      "; worst: ", worst_failure_);
}

absl::Status ComparisonReport::ToStatus() const {
  return ok() ? absl::OkStatus() : absl::InternalError(ToString());
}

ComparisonReport CompareQueryOut(absl::Span<const uint16_t> q_out, const QueryReference& expected) {
  ComparisonReport report("q_out");
  CheckSizes("q_out", q_out.size(), expected.values.size(), report);
  if (!report.ok()) return report;
  for (int64_t t = 0; t < expected.num_tokens; ++t) {
    for (int h = 0; h < expected.padded_heads; ++h) {
      const int64_t row = t * expected.padded_heads + h;
      for (int d = 0; d < kHeadDim; ++d) {
        const uint16_t actual = q_out[row * kHeadDim + d];
        const double want = expected.values[row * kHeadDim + d];
        double excess;
        if (h >= expected.num_heads) {
          excess = actual == 0 ? 0.0 : kInf;
        } else {
          const double pair =
              d < kNopeDim ? 0.0 : expected.pair_magnitudes[row * kRopePairs + (d - kNopeDim) / 2];
          excess = QueryOutExcess(actual, want, pair);
        }
        report.Check(excess, [&] {
          return absl::StrCat("token ", t, " head ", h, h >= expected.num_heads ? " (padding)" : "",
                              " dim ", d, ": got ", Bf16Text(actual), ", want ",
                              Bf16Text(RoundToBf16(want)), " from ", absl::StrFormat("%.9g", want));
        });
      }
    }
  }
  return report;
}

void CompareCacheRow(absl::Span<const uint8_t> pool, int64_t slot, const KvRowReference& expected,
                     absl::string_view label, ComparisonReport& report) {
  const bool in_pool = slot >= 0 && slot < PoolSlots(pool.size());
  report.Check(in_pool ? 0.0 : kInf, [&] {
    return absl::StrCat(label, ": slot ", slot, " is outside the pool's ", PoolSlots(pool.size()),
                        " slots");
  });
  if (!in_pool) return;
  const uint8_t* data = pool.data() + DataOffset(slot);
  const uint8_t* scales = pool.data() + ScaleOffset(slot);
  for (int d = 0; d < kNopeDim; ++d) {
    report.Check(data[d] == expected.data[d] ? 0.0 : kInf, [&] {
      return absl::StrFormat(
          "%s slot %d e4m3 byte %d (tile %d scale byte %d): got 0x%02x, want 0x%02x", label, slot,
          d, d / kQuantTile, scales[d / kQuantTile], data[d], expected.data[d]);
    });
  }
  for (int i = 0; i < kRopeDim; ++i) {
    const uint16_t actual =
        static_cast<uint16_t>(data[kNopeDim + 2 * i] | data[kNopeDim + 2 * i + 1] << 8);
    const double want = expected.rotated[kNopeDim + i];
    report.Check(CacheRopeExcess(actual, want, expected.pair_magnitudes[i / 2]), [&] {
      return absl::StrCat(label, " slot ", slot, " rope dim ", kNopeDim + i, ": got ",
                          Bf16Text(actual), ", want ", Bf16Text(RoundToBf16(want)), " from ",
                          absl::StrFormat("%.9g", want));
    });
  }
  for (int b = 0; b < kTokenScaleBytes; ++b) {
    report.Check(scales[b] == expected.scales[b] ? 0.0 : kInf, [&] {
      return absl::StrFormat("%s slot %d %s byte %d: got 0x%02x, want 0x%02x", label, slot,
                             b < kNopeTiles ? "scale" : "pad", b, scales[b], expected.scales[b]);
    });
  }
}

ComparisonReport CompareCacheRows(absl::Span<const uint8_t> pool, absl::Span<const int32_t> slots,
                                  absl::Span<const KvRowReference> expected,
                                  absl::string_view subject) {
  ComparisonReport report{std::string(subject)};
  CheckSizes("slots", slots.size(), expected.size(), report);
  if (!report.ok()) return report;
  for (size_t r = 0; r < slots.size(); ++r) {
    if (slots[r] == -1) continue;
    CompareCacheRow(pool, slots[r], expected[r], absl::StrCat("row ", r), report);
  }
  return report;
}

ComparisonReport CompareDecodeOut(absl::Span<const uint16_t> out, const DecodeReference& expected) {
  ComparisonReport report("decode out");
  CheckSizes("out", out.size(), expected.out.size(), report);
  if (!report.ok()) return report;
  for (int64_t t = 0; t < expected.num_tokens; ++t) {
    const double max_abs = expected.max_abs_values[t];
    for (int h = 0; h < expected.num_heads; ++h) {
      const double delta = CompositionDelta(expected, t * expected.num_heads + h);
      for (int d = 0; d < kHeadDim; ++d) {
        const int64_t i = (t * expected.num_heads + h) * kHeadDim + d;
        const double actual = Bf16Value(out[i]);
        report.Check(DecodeOutExcess(actual, expected.out[i], max_abs, delta), [&] {
          return absl::StrFormat(
              "token %d head %d dim %d: got 0x%04x (%.9g), want %.9g (A_t %.6g, %d keys%s)", t, h,
              d, out[i], actual, expected.out[i], max_abs, expected.num_keys[t], DeltaText(delta));
        });
      }
    }
  }
  return report;
}

ComparisonReport CompareDecodeOutFp8(absl::Span<const uint8_t> e4m3,
                                     absl::Span<const uint8_t> scales,
                                     const DecodeReference& expected) {
  ComparisonReport report("decode out (fp8)");
  CheckSizes("out e4m3", e4m3.size(), expected.out.size(), report);
  CheckSizes("out scales", scales.size(),
             expected.out.size() / kOutputQuantBlock, report);
  if (!report.ok()) return report;
  const uint8_t empty_scale = static_cast<uint8_t>(ScaleExponent(0.0) + 127);
  for (int64_t t = 0; t < expected.num_tokens; ++t) {
    const double max_abs = expected.max_abs_values[t];
    const bool empty = expected.num_keys[t] == 0;
    for (int h = 0; h < expected.num_heads; ++h) {
      const int64_t row = t * expected.num_heads + h;
      const double delta = CompositionDelta(expected, row);
      for (int k = 0; k < kOutputQuantBlocks; ++k) {
        const int64_t first = row * kHeadDim + k * kOutputQuantBlock;
        const uint8_t scale = scales[row * kOutputQuantBlocks + k];
        double amax = 0.0;
        double allowance = 0.0;
        for (int i = 0; i < kOutputQuantBlock; ++i) {
          amax = std::max(amax, std::fabs(expected.out[first + i]));
          allowance =
              std::max(allowance, DecodeOutAllowance(expected.out[first + i], max_abs, delta));
        }
        const double scale_excess = empty ? (scale == empty_scale ? 0.0 : kInf)
                                          : Fp8ScaleExcess(scale, amax, allowance);
        report.Check(scale_excess, [&] {
          return absl::StrFormat(
              "token %d head %d block %d (dims %d..%d): scale byte %d (2^%d) where the "
              "reference's amax %.6g (allowance %.3g) wants 2^%d..2^%d%s",
              t, h, k, k * kOutputQuantBlock, (k + 1) * kOutputQuantBlock - 1, scale,
              int{scale} - 127, amax, allowance,
              ScaleExponent(std::max(amax - allowance, 0.0)), ScaleExponent(amax + allowance),
              empty ? " (no keys: exactly the amax floor's)" : "");
        });
        const double block_scale = std::ldexp(1.0, int{scale} - 127);
        for (int i = 0; i < kOutputQuantBlock; ++i) {
          const int64_t at = first + i;
          const uint8_t code = e4m3[at];
          const double actual = ScaledE4m3Value(code, scale);
          const double excess = empty ? (code == 0 ? 0.0 : kInf)
                                      : Fp8OutExcess(actual, expected.out[at], max_abs,
                                                     block_scale, delta);
          report.Check(excess, [&] {
            return absl::StrFormat(
                "token %d head %d dim %d: got 0x%02x x 2^%d (%.9g), want %.9g (A_t %.6g, %d "
                "keys%s)",
                t, h, k * kOutputQuantBlock + i, code, int{scale} - 127, actual, expected.out[at],
                max_abs, expected.num_keys[t], DeltaText(delta));
          });
        }
      }
    }
  }
  return report;
}

ComparisonReport CompareLse(absl::Span<const float> lse, const DecodeReference& expected) {
  ComparisonReport report("decode lse");
  CheckSizes("lse", lse.size(), expected.lse.size(), report);
  if (!report.ok()) return report;
  for (int64_t t = 0; t < expected.num_tokens; ++t) {
    for (int h = 0; h < expected.num_heads; ++h) {
      const int64_t i = t * expected.num_heads + h;
      const double delta = CompositionDelta(expected, i);
      report.Check(LseExcess(lse[i], expected.lse[i], delta), [&] {
        return absl::StrFormat("token %d head %d: got %.9g, want %.9g (%d keys%s)", t, h, lse[i],
                               expected.lse[i], expected.num_keys[t], DeltaText(delta));
      });
    }
  }
  return report;
}

}  // namespace reference
}  // namespace mla

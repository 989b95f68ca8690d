#include "kernels/reference/reference_f64.h"

#include <algorithm>
#include <cmath>
#include <limits>

#include "absl/strings/str_cat.h"

namespace mla {
namespace reference {
namespace {

constexpr double kInf = std::numeric_limits<double>::infinity();
constexpr int kE4m3FiniteCodes = 127;  // 0x00..0x7e; 0x7f is NaN
constexpr int kScaleBias = 127;

// The 127 non-negative finite e4m3fn values, increasing with the code:
// exponent field 0 is subnormal (m * 2^-9), otherwise (8 + m) * 2^(E - 10).
struct E4m3Magnitudes {
  std::array<double, kE4m3FiniteCodes> value;
  E4m3Magnitudes() {
    for (int code = 0; code < kE4m3FiniteCodes; ++code) {
      const int exponent = code >> 3;
      const int mantissa = code & 7;
      value[code] =
          exponent == 0 ? std::ldexp(mantissa, -9) : std::ldexp(8 + mantissa, exponent - 10);
    }
  }
};

const E4m3Magnitudes& Magnitudes() {
  static const E4m3Magnitudes magnitudes;
  return magnitudes;
}

// Rotates one pair in float64 by a table row's cosine and sine; `inverse`
// rotates by the negated angle.
void Rotate(double c, double s, bool inverse, double& a, double& b) {
  if (inverse) s = -s;
  const double x = a * c - b * s;
  const double y = a * s + b * c;
  a = x;
  b = y;
}

absl::Status CheckPosition(absl::string_view what, int64_t index, int32_t position,
                           const RopeTable& rope) {
  if (position < 0 || position >= rope.num_positions()) {
    return absl::InvalidArgumentError(absl::StrCat(what, "[", index, "] = ", position,
                                                   " is outside the RoPE table's rows [0, ",
                                                   rope.num_positions(), ")"));
  }
  return absl::OkStatus();
}

absl::Status CheckSlot(absl::string_view what, int64_t slot, int64_t pool_bytes) {
  if (slot < 0 || slot >= PoolSlots(pool_bytes)) {
    return absl::InvalidArgumentError(absl::StrCat(
        what, " ", slot, " is outside the pool's slots [0, ", PoolSlots(pool_bytes), ")"));
  }
  return absl::OkStatus();
}

absl::Status CheckSize(absl::string_view what, size_t actual, int64_t expected) {
  if (static_cast<int64_t>(actual) != expected) {
    return absl::InvalidArgumentError(
        absl::StrCat(what, " holds ", actual, " elements, expected ", expected));
  }
  return absl::OkStatus();
}

// The keys of one token from one list, as dequantised rows appended to `keys`.
absl::Status AppendKeys(absl::string_view what, const KeyListInputs& list, int64_t t,
                        std::vector<std::array<double, kHeadDim>>& keys) {
  if (list.width == 0) return absl::OkStatus();
  const int32_t length = list.lengths.empty() ? list.width : list.lengths[t];
  if (length < 0 || length > list.width) {
    return absl::InvalidArgumentError(absl::StrCat(what, " length of token ", t, " = ", length,
                                                   " is outside [0, ", list.width, "]"));
  }
  for (int32_t k = 0; k < length; ++k) {
    const int32_t index = list.indices[t * list.width + k];
    if (index == -1) continue;
    absl::StatusOr<std::array<double, kHeadDim>> key = DequantizeSlot(list.pool, index);
    if (!key.ok()) {
      return absl::InvalidArgumentError(
          absl::StrCat(what, "[", t, "][", k, "]: ", key.status().message()));
    }
    keys.push_back(*key);
  }
  return absl::OkStatus();
}

absl::Status CheckKeyList(absl::string_view what, const KeyListInputs& list, int64_t num_tokens) {
  if (list.width < 0) return absl::InvalidArgumentError(absl::StrCat(what, ": negative width"));
  if (list.width == 0) return absl::OkStatus();
  if (absl::Status status =
          CheckSize(absl::StrCat(what, " indices"), list.indices.size(), num_tokens * list.width);
      !status.ok()) {
    return status;
  }
  if (list.lengths.empty()) return absl::OkStatus();
  return CheckSize(absl::StrCat(what, " lengths"), list.lengths.size(), num_tokens);
}

}  // namespace

double Bf16Value(uint16_t bits) {
  const int exponent = (bits >> 7) & 0xff;
  const int mantissa = bits & 0x7f;
  double magnitude;
  if (exponent == 0xff) {
    magnitude = mantissa == 0 ? kInf : std::numeric_limits<double>::quiet_NaN();
  } else if (exponent == 0) {
    magnitude = std::ldexp(mantissa, -133);
  } else {
    magnitude = std::ldexp(128 + mantissa, exponent - 134);
  }
  return (bits & 0x8000) ? -magnitude : magnitude;
}

uint16_t RoundToBf16(double value) {
  const uint16_t sign = std::signbit(value) ? 0x8000 : 0;
  if (std::isnan(value)) return sign | 0x7fc0;
  const double magnitude = std::fabs(value);
  if (magnitude == 0.0) return sign;
  if (std::isinf(magnitude)) return sign | 0x7f80;
  // Count the value in units of its bf16 ulp (8 significant bits, or the
  // subnormal step 2^-133); nearbyint then rounds to nearest even, and an
  // even count is an even mantissa.
  int ulp_exponent = std::max(std::ilogb(magnitude), -126) - 7;
  double units = std::nearbyint(std::ldexp(magnitude, -ulp_exponent));
  if (units == 256.0) {
    units = 128.0;
    ++ulp_exponent;
  }
  if (units < 128.0) return sign | static_cast<uint16_t>(units);  // subnormal or zero
  const int biased = ulp_exponent + 7 + 127;
  if (biased >= 0xff) return sign | 0x7f80;
  return sign | static_cast<uint16_t>(biased << 7) | static_cast<uint16_t>(units - 128.0);
}

uint8_t EncodeE4m3(double value) {
  if (std::isnan(value)) return 0x7f;
  const uint8_t sign = std::signbit(value) ? 0x80 : 0;
  const double magnitude = std::fabs(value);
  const auto& table = Magnitudes().value;
  const auto above = std::lower_bound(table.begin(), table.end(), magnitude);
  int code;
  if (above == table.end()) {
    code = kE4m3FiniteCodes - 1;  // saturate at 448
  } else if (above == table.begin()) {
    code = 0;
  } else {
    const int high = static_cast<int>(above - table.begin());
    const int low = high - 1;
    const double to_high = table[high] - magnitude;
    const double to_low = magnitude - table[low];
    if (to_low < to_high) {
      code = low;
    } else if (to_high < to_low) {
      code = high;
    } else {
      code = (low % 2 == 0) ? low : high;
    }
  }
  return sign | static_cast<uint8_t>(code);
}

double E4m3Value(uint8_t code) {
  const int magnitude_code = code & 0x7f;
  if (magnitude_code == 0x7f) return std::numeric_limits<double>::quiet_NaN();
  const double magnitude = Magnitudes().value[magnitude_code];
  return (code & 0x80) ? -magnitude : magnitude;
}

double ScaledE4m3Value(uint8_t code, uint8_t scale_byte) {
  return E4m3Value(code) * std::ldexp(1.0, scale_byte - kScaleBias);
}

int ScaleExponent(double amax) {
  const double floored = std::max(amax, 1e-4);
  // 448 is between 2^8 and 2^9, so this guess is at most one off; the loops
  // settle it with exact comparisons of 448 * 2^e.
  int exponent = std::ilogb(floored) - 8;
  while (std::ldexp(448.0, exponent) < floored) ++exponent;
  while (std::ldexp(448.0, exponent - 1) >= floored) --exponent;
  return exponent;
}

int64_t DataOffset(int64_t slot) {
  return slot / kBlockTokens * kBlockBytes + slot % kBlockTokens * kTokenDataBytes;
}

int64_t ScaleOffset(int64_t slot) {
  return slot / kBlockTokens * kBlockBytes + int64_t{kBlockTokens} * kTokenDataBytes +
         slot % kBlockTokens * kTokenScaleBytes;
}

int64_t PoolSlots(int64_t pool_bytes) { return pool_bytes / kBlockBytes * kBlockTokens; }

absl::StatusOr<std::array<double, kHeadDim>> DequantizeSlot(absl::Span<const uint8_t> pool,
                                                            int64_t slot) {
  if (absl::Status status = CheckSlot("slot", slot, pool.size()); !status.ok()) return status;
  const uint8_t* data = pool.data() + DataOffset(slot);
  const uint8_t* scales = pool.data() + ScaleOffset(slot);
  std::array<double, kHeadDim> row;
  for (int d = 0; d < kNopeDim; ++d) {
    row[d] = ScaledE4m3Value(data[d], scales[d / kQuantTile]);
  }
  for (int i = 0; i < kRopeDim; ++i) {
    const uint16_t bits =
        static_cast<uint16_t>(data[kNopeDim + 2 * i] | data[kNopeDim + 2 * i + 1] << 8);
    row[kNopeDim + i] = Bf16Value(bits);
  }
  return row;
}

absl::StatusOr<QueryReference> ReferenceQuery(absl::Span<const uint16_t> q,
                                              absl::Span<const int32_t> positions, int num_heads,
                                              int padded_heads, double eps, const RopeTable& rope) {
  if (num_heads < 0 || padded_heads < num_heads) {
    return absl::InvalidArgumentError(
        absl::StrCat("head counts H = ", num_heads, ", Hp = ", padded_heads, " need 0 <= H <= Hp"));
  }
  const int64_t num_tokens = static_cast<int64_t>(positions.size());
  if (absl::Status status = CheckSize("q", q.size(), num_tokens * num_heads * kHeadDim);
      !status.ok()) {
    return status;
  }
  QueryReference result;
  result.num_tokens = num_tokens;
  result.num_heads = num_heads;
  result.padded_heads = padded_heads;
  result.values.assign(num_tokens * padded_heads * kHeadDim, 0.0);
  result.pair_magnitudes.assign(num_tokens * padded_heads * kRopePairs, 0.0);
  for (int64_t t = 0; t < num_tokens; ++t) {
    if (absl::Status status = CheckPosition("query positions", t, positions[t], rope);
        !status.ok()) {
      return status;
    }
    const float* cos_sin = rope.row(positions[t]);
    for (int h = 0; h < num_heads; ++h) {
      const uint16_t* in = q.data() + (t * num_heads + h) * kHeadDim;
      double* x = result.values.data() + (t * padded_heads + h) * kHeadDim;
      double squares = 0.0;
      for (int d = 0; d < kHeadDim; ++d) {
        x[d] = Bf16Value(in[d]);
        squares += x[d] * x[d];
      }
      const double inv_rms = 1.0 / std::sqrt(squares / kHeadDim + eps);
      for (int d = 0; d < kHeadDim; ++d) x[d] *= inv_rms;
      double* magnitudes = result.pair_magnitudes.data() + (t * padded_heads + h) * kRopePairs;
      for (int i = 0; i < kRopePairs; ++i) {
        double& a = x[kNopeDim + 2 * i];
        double& b = x[kNopeDim + 2 * i + 1];
        magnitudes[i] = std::fabs(a) + std::fabs(b);
        Rotate(cos_sin[i], cos_sin[kRopePairs + i], /*inverse=*/false, a, b);
      }
    }
  }
  return result;
}

absl::StatusOr<KvRowReference> ReferenceKvRow(absl::Span<const uint16_t> row, int32_t position,
                                              const RopeTable& rope) {
  if (absl::Status status = CheckSize("kv row", row.size(), kHeadDim); !status.ok()) {
    return status;
  }
  if (absl::Status status = CheckPosition("kv position", 0, position, rope); !status.ok()) {
    return status;
  }
  KvRowReference result;
  for (int d = 0; d < kHeadDim; ++d) result.rotated[d] = Bf16Value(row[d]);
  const float* cos_sin = rope.row(position);
  for (int i = 0; i < kRopePairs; ++i) {
    double& a = result.rotated[kNopeDim + 2 * i];
    double& b = result.rotated[kNopeDim + 2 * i + 1];
    result.pair_magnitudes[i] = std::fabs(a) + std::fabs(b);
    Rotate(cos_sin[i], cos_sin[kRopePairs + i], /*inverse=*/false, a, b);
  }
  for (int d = 0; d < kHeadDim; ++d) result.rounded[d] = Bf16Value(RoundToBf16(result.rotated[d]));

  for (int tile = 0; tile < kNopeTiles; ++tile) {
    const double* values = result.rounded.data() + tile * kQuantTile;
    double amax = 0.0;
    for (int i = 0; i < kQuantTile; ++i) amax = std::max(amax, std::fabs(values[i]));
    const int exponent = ScaleExponent(amax);
    for (int i = 0; i < kQuantTile; ++i) {
      result.data[tile * kQuantTile + i] = EncodeE4m3(std::ldexp(values[i], -exponent));
    }
    result.scales[tile] = static_cast<uint8_t>(std::clamp(exponent + kScaleBias, 0, 255));
  }
  result.scales[kNopeTiles] = 0;
  for (int i = 0; i < kRopeDim; ++i) {
    const uint16_t bits = RoundToBf16(result.rotated[kNopeDim + i]);
    result.data[kNopeDim + 2 * i] = static_cast<uint8_t>(bits & 0xff);
    result.data[kNopeDim + 2 * i + 1] = static_cast<uint8_t>(bits >> 8);
  }
  return result;
}

absl::Status WriteCacheRow(const KvRowReference& row, int64_t slot, absl::Span<uint8_t> pool) {
  if (absl::Status status = CheckSlot("slot", slot, pool.size()); !status.ok()) return status;
  std::copy(row.data.begin(), row.data.end(), pool.begin() + DataOffset(slot));
  std::copy(row.scales.begin(), row.scales.end(), pool.begin() + ScaleOffset(slot));
  return absl::OkStatus();
}

absl::StatusOr<DecodeReference> ReferenceDecode(const DecodeInputs& in) {
  if (in.num_tokens < 0 || in.num_heads < 0 || in.padded_heads < in.num_heads) {
    return absl::InvalidArgumentError(
        absl::StrCat("decode: N = ", in.num_tokens, ", H = ", in.num_heads,
                     ", Hp = ", in.padded_heads, " need N >= 0 and 0 <= H <= Hp"));
  }
  if (absl::Status status =
          CheckSize("decode q", in.q.size(), in.num_tokens * in.padded_heads * kHeadDim);
      !status.ok()) {
    return status;
  }
  if (!in.sinks.empty()) {
    const int64_t expected_sinks =
        in.sinks_per_token ? in.num_tokens * in.num_heads : int64_t{in.num_heads};
    if (absl::Status status = CheckSize("decode sinks", in.sinks.size(), expected_sinks);
        !status.ok()) {
      return status;
    }
  }
  if (absl::Status status = CheckKeyList("decode main", in.main, in.num_tokens); !status.ok()) {
    return status;
  }
  if (absl::Status status = CheckKeyList("decode extra", in.extra, in.num_tokens); !status.ok()) {
    return status;
  }
  if (!in.q_slack.empty()) {
    if (absl::Status status = CheckSize("decode q_slack", in.q_slack.size(), in.q.size());
        !status.ok()) {
      return status;
    }
  }
  if (in.derotate) {
    if (in.rope == nullptr) return absl::InvalidArgumentError("decode: derotate needs a table");
    if (absl::Status status = CheckSize("decode positions", in.positions.size(), in.num_tokens);
        !status.ok()) {
      return status;
    }
  }

  DecodeReference result;
  result.num_tokens = in.num_tokens;
  result.num_heads = in.num_heads;
  result.out.assign(in.num_tokens * in.num_heads * kHeadDim, 0.0);
  result.lse.assign(in.num_tokens * in.num_heads, kInf);
  result.max_abs_values.assign(in.num_tokens, 0.0);
  result.num_keys.assign(in.num_tokens, 0);
  result.composition_deltas.assign(in.num_tokens * in.num_heads, 0.0);

  std::vector<std::array<double, kHeadDim>> keys;
  std::vector<double> scores;
  for (int64_t t = 0; t < in.num_tokens; ++t) {
    keys.clear();
    if (absl::Status status = AppendKeys("decode main indices", in.main, t, keys); !status.ok()) {
      return status;
    }
    if (absl::Status status = AppendKeys("decode extra indices", in.extra, t, keys); !status.ok()) {
      return status;
    }
    const float* cos_sin = nullptr;
    if (in.derotate) {
      if (absl::Status status = CheckPosition("decode positions", t, in.positions[t], *in.rope);
          !status.ok()) {
        return status;
      }
      cos_sin = in.rope->row(in.positions[t]);
    }
    result.num_keys[t] = static_cast<int64_t>(keys.size());
    if (keys.empty()) continue;  // out 0, lse +inf, whatever the sink
    for (const auto& key : keys) {
      for (double v : key)
        result.max_abs_values[t] = std::max(result.max_abs_values[t], std::fabs(v));
    }

    scores.resize(keys.size());
    for (int h = 0; h < in.num_heads; ++h) {
      const uint16_t* q_bits = in.q.data() + (t * in.padded_heads + h) * kHeadDim;
      double q[kHeadDim];
      for (int d = 0; d < kHeadDim; ++d) q[d] = Bf16Value(q_bits[d]);
      double max_score = -kInf;
      for (size_t j = 0; j < keys.size(); ++j) {
        double dot = 0.0;
        for (int d = 0; d < kHeadDim; ++d) dot += q[d] * keys[j][d];
        scores[j] = in.softmax_scale * dot;
        max_score = std::max(max_score, scores[j]);
      }
      double sum = 0.0;
      for (double z : scores) sum += std::exp(z - max_score);
      const double lse = max_score + std::log(sum);
      const double sink =
          in.sinks.empty() ? -kInf
                           : static_cast<double>(
                                 in.sinks[in.sinks_per_token ? t * in.num_heads + h : h]);
      const double sink_factor = 1.0 / (1.0 + std::exp(sink - lse));

      double* o = result.out.data() + (t * in.num_heads + h) * kHeadDim;
      for (size_t j = 0; j < keys.size(); ++j) {
        const double p = std::exp(scores[j] - lse) * sink_factor;
        for (int d = 0; d < kHeadDim; ++d) o[d] += p * keys[j][d];
      }
      if (cos_sin != nullptr) {
        for (int i = 0; i < kRopePairs; ++i) {
          Rotate(cos_sin[i], cos_sin[kRopePairs + i], /*inverse=*/true, o[kNopeDim + 2 * i],
                 o[kNopeDim + 2 * i + 1]);
        }
      }
      result.lse[t * in.num_heads + h] = lse;
      if (!in.q_slack.empty()) {
        const double* slack = in.q_slack.data() + (t * in.padded_heads + h) * kHeadDim;
        double widest = 0.0;
        for (const auto& key : keys) {
          double shift = 0.0;
          for (int d = 0; d < kHeadDim; ++d) shift += slack[d] * std::fabs(key[d]);
          widest = std::max(widest, shift);
        }
        result.composition_deltas[t * in.num_heads + h] = in.softmax_scale * widest;
      }
    }
  }
  return result;
}

}  // namespace reference
}  // namespace mla

// Rotary position embedding tables for DeepSeek-V4 (spec section 2).
//
// RoPE acts on the last 64 dims of a 512-wide row as 32 interleaved (GPT-J)
// pairs (x[448+2i], x[449+2i]). The angle of pair i at position p is one
// float32 multiply float32(p) * f_i with the pinned float32 frequencies f_i of
// the layer's kind; cos and sin of that angle are evaluated in float64 and
// rounded to float32. Row p of a table is [cos(a_0..31) | sin(a_0..31)].
// Both backends read the same table, so they rotate by identical numbers.
#ifndef MLA_OFFLOAD_KERNELS_ROPE_H_
#define MLA_OFFLOAD_KERNELS_ROPE_H_

#include <cstdint>
#include <vector>

#include "absl/strings/string_view.h"
#include "kernels/geometry.h"

namespace mla {

enum class RopeKind {
  kPlain,  // SWA-only layers: theta 10000, no YaRN.
  kYarn,   // C4A and C128A layers: theta 160000 with YaRN (factor 16).
};

absl::string_view RopeKindName(RopeKind kind);

// The settings the pinned frequencies were derived from.
struct RopeSettings {
  double theta;
  bool yarn;
  double yarn_factor;              // 16
  double yarn_original_max;        // 65536
  double yarn_beta_fast;           // 32
  double yarn_beta_slow;           // 1
};

const RopeSettings& SettingsOf(RopeKind kind);

// The pinned float32 frequency f_i of pair i (0..31): DeepSeek's reference
// values, shipped as bit patterns.
float PinnedFrequency(RopeKind kind, int pair);

// The YaRN correction range [low, high] of spec section 2 for a theta,
// both clamped to [0, 63]. For theta 160000 it is [15, 25].
struct YarnRange {
  int low;
  int high;
};
YarnRange YarnCorrectionRange(const RopeSettings& settings);

// f_i evaluated from the settings in float64 (the formula the pinned values
// come from). Only tests use it: kernels rotate with PinnedFrequency.
double FormulaFrequency(const RopeSettings& settings, int pair);

// Writes row `position` of the table: 32 cosines then 32 sines.
void ComputeRopeRow(RopeKind kind, int64_t position, float* cos_sin);

// Rotates the 64 RoPE dims in place (x points at dim 448 of a row) by the
// angles of one table row; `inverse` rotates by the negated angles.
inline void ApplyRope(const float* cos_sin, bool inverse, float* x) {
  const float sign = inverse ? -1.0f : 1.0f;
  for (int i = 0; i < kRopePairs; ++i) {
    const float a = x[2 * i];
    const float b = x[2 * i + 1];
    const float c = cos_sin[i];
    const float s = sign * cos_sin[kRopePairs + i];
    x[2 * i] = a * c - b * s;
    x[2 * i + 1] = a * s + b * c;
  }
}

// A table of rows 0..num_positions-1 for one kind, in host memory.
class RopeTable {
 public:
  RopeTable(RopeKind kind, int64_t num_positions);

  RopeKind kind() const { return kind_; }
  int64_t num_positions() const { return num_positions_; }
  const float* data() const { return data_.data(); }
  const float* row(int64_t position) const { return data_.data() + position * kRopeDim; }
  int64_t bytes() const { return num_positions_ * kRopeDim * int64_t{sizeof(float)}; }

 private:
  RopeKind kind_;
  int64_t num_positions_;
  std::vector<float> data_;
};

}  // namespace mla

#endif  // MLA_OFFLOAD_KERNELS_ROPE_H_

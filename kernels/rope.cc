#include "kernels/rope.h"

#include <algorithm>
#include <cmath>
#include <cstring>

namespace mla {
namespace {

// DeepSeek's reference frequencies (identical to vLLM's), as float32 bits.
constexpr uint32_t kYarnFrequencyBits[kRopePairs] = {
    0x3f800000, 0x3f300a3a, 0x3ef21c1f, 0x3ea67d01, 0x3e64f92e, 0x3e1d7475, 0x3dd88cb4,
    0x3d94e963, 0x3d4ccccd, 0x3d0cd4fb, 0x3cc1b019, 0x3c8530ce, 0x3c372dbf, 0x3bfbed88,
    0x3bad3d5e, 0x3b6e4237, 0x3b147ae1, 0x3ab714e0, 0x3a5ebdb6, 0x3a0530ce, 0x399bb3af,
    0x39305978, 0x38be904d, 0x383e9b5f, 0x37a3d70c, 0x36b443d0, 0x3677eba6, 0x362a7be8,
    0x35ea77ff, 0x35a13bdc, 0x355dbf30, 0x35187c4d};

constexpr uint32_t kPlainFrequencyBits[kRopePairs] = {
    0x3f800000, 0x3f3ff911, 0x3f0ff59a, 0x3ed7e89b, 0x3ea1e89b, 0x3e72d423, 0x3e361887,
    0x3e088d77, 0x3dcccccd, 0x3d99940d, 0x3d6655c2, 0x3d2cba15, 0x3d0186e3, 0x3cc2434f,
    0x3c91ad39, 0x3c5a7bf2, 0x3c23d70a, 0x3bf5b9b0, 0x3bb8449c, 0x3b8a2e77, 0x3b4f3e38,
    0x3b1b690d, 0x3ae91528, 0x3aaec98e, 0x3a83126f, 0x3a44948c, 0x3a136a16, 0x39dd1725,
    0x39a5cb60, 0x3978a815, 0x393a7753, 0x390bd472};

constexpr RopeSettings kYarnSettings = {160000.0, true, 16.0, 65536.0, 32.0, 1.0};
constexpr RopeSettings kPlainSettings = {10000.0, false, 1.0, 0.0, 0.0, 0.0};

// The dimension index at which a frequency completes `rotations` turns over
// the original context (YaRN's correction dimension), in float64.
double CorrectionDim(const RopeSettings& settings, double rotations) {
  return kRopeDim * std::log(settings.yarn_original_max / (rotations * 2.0 * M_PI)) /
         (2.0 * std::log(settings.theta));
}

}  // namespace

absl::string_view RopeKindName(RopeKind kind) {
  return kind == RopeKind::kYarn ? "yarn-160000" : "plain-10000";
}

const RopeSettings& SettingsOf(RopeKind kind) {
  return kind == RopeKind::kYarn ? kYarnSettings : kPlainSettings;
}

float PinnedFrequency(RopeKind kind, int pair) {
  const uint32_t bits =
      kind == RopeKind::kYarn ? kYarnFrequencyBits[pair] : kPlainFrequencyBits[pair];
  float value;
  std::memcpy(&value, &bits, sizeof(value));
  return value;
}

YarnRange YarnCorrectionRange(const RopeSettings& settings) {
  const int low = static_cast<int>(std::floor(CorrectionDim(settings, settings.yarn_beta_fast)));
  const int high = static_cast<int>(std::ceil(CorrectionDim(settings, settings.yarn_beta_slow)));
  return {std::clamp(low, 0, kRopeDim - 1), std::clamp(high, 0, kRopeDim - 1)};
}

double FormulaFrequency(const RopeSettings& settings, int pair) {
  const double base = std::pow(settings.theta, -2.0 * pair / kRopeDim);
  if (!settings.yarn) return base;
  const YarnRange range = YarnCorrectionRange(settings);
  const double ramp =
      std::clamp((pair - range.low) / static_cast<double>(range.high - range.low), 0.0, 1.0);
  return base / settings.yarn_factor * ramp + base * (1.0 - ramp);
}

void ComputeRopeRow(RopeKind kind, int64_t position, float* cos_sin) {
  const float p = static_cast<float>(position);
  for (int i = 0; i < kRopePairs; ++i) {
    const float angle = p * PinnedFrequency(kind, i);
    cos_sin[i] = static_cast<float>(std::cos(static_cast<double>(angle)));
    cos_sin[kRopePairs + i] = static_cast<float>(std::sin(static_cast<double>(angle)));
  }
}

RopeTable::RopeTable(RopeKind kind, int64_t num_positions)
    : kind_(kind), num_positions_(num_positions), data_(num_positions * kRopeDim) {
  for (int64_t p = 0; p < num_positions; ++p) ComputeRopeRow(kind, p, data_.data() + p * kRopeDim);
}

}  // namespace mla

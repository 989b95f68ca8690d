#include "kernels/model_profile.h"

#include <cmath>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "kernels/geometry.h"

namespace mla {
namespace {

// head + [4, 128] * pairs + [4, 0]: the V4 layer pattern, MTP layer last.
std::vector<int> CompressRatios(std::vector<int> head, int pairs) {
  std::vector<int> ratios = std::move(head);
  for (int i = 0; i < pairs; ++i) {
    ratios.push_back(4);
    ratios.push_back(128);
  }
  ratios.push_back(4);
  ratios.push_back(0);
  return ratios;
}

std::vector<ModelProfile> MakeProfiles() {
  const float scale = static_cast<float>(1.0 / std::sqrt(static_cast<double>(kHeadDim)));
  return {
      {"deepseek-v4-flash", 43, 64, 512, 1e-6f, scale, CompressRatios({0, 0}, 20)},
      {"deepseek-v4-pro", 61, 128, 1024, 1e-6f, scale, CompressRatios({128, 128}, 29)},
  };
}

}  // namespace

absl::string_view LayerKindName(LayerKind kind) {
  switch (kind) {
    case LayerKind::kSwaOnly:
      return "swa";
    case LayerKind::kC4A:
      return "c4a";
    case LayerKind::kC128A:
      return "c128a";
  }
  return "unknown";
}

LayerKind ModelProfile::layer_kind(int layer) const {
  switch (compress_ratios[layer]) {
    case 4:
      return LayerKind::kC4A;
    case 128:
      return LayerKind::kC128A;
    default:
      return LayerKind::kSwaOnly;
  }
}

RopeKind ModelProfile::rope_kind(int layer) const {
  return layer_kind(layer) == LayerKind::kSwaOnly ? RopeKind::kPlain : RopeKind::kYarn;
}

const std::vector<ModelProfile>& BuiltInProfiles() {
  static const std::vector<ModelProfile>* profiles = new std::vector<ModelProfile>(MakeProfiles());
  return *profiles;
}

absl::StatusOr<const ModelProfile*> FindModelProfile(absl::string_view name) {
  for (const ModelProfile& profile : BuiltInProfiles()) {
    if (profile.name == name) return &profile;
  }
  return absl::NotFoundError(
      absl::StrCat("unknown model profile '", name, "'; known profiles: ", ModelProfileNames()));
}

std::string ModelProfileNames() {
  std::vector<std::string> names;
  for (const ModelProfile& profile : BuiltInProfiles()) names.push_back(profile.name);
  return absl::StrJoin(names, ", ");
}

}  // namespace mla

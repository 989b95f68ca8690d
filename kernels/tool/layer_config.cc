#include "kernels/tool/layer_config.h"

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"

namespace mla {

std::string LayerConfig::Describe() const {
  return absl::StrCat(profile->name, " layer ", layer, " (", LayerKindName(kind),
                      ", compress ratio ", compress_ratio, ")");
}

absl::StatusOr<LayerConfig> ResolveLayer(absl::string_view model, int layer) {
  absl::StatusOr<const ModelProfile*> profile = FindModelProfile(model);
  if (!profile.ok()) return absl::InvalidArgumentError(profile.status().message());
  const int num_layers = (*profile)->num_attention_layers();
  if (layer == kFirstC4aLayer) {
    for (int l = 0; l < num_layers && layer == kFirstC4aLayer; ++l) {
      if ((*profile)->layer_kind(l) == LayerKind::kC4A) layer = l;
    }
  }
  if (layer < 0 || layer >= num_layers) {
    return absl::InvalidArgumentError(absl::StrCat("--layer=", layer, " is outside ", model,
                                                   "'s layers 0..", num_layers - 1, " (",
                                                   num_layers - 1, " is the MTP layer)"));
  }
  LayerConfig config;
  config.profile = *profile;
  config.layer = layer;
  config.kind = config.profile->layer_kind(layer);
  config.compress_ratio = config.profile->compress_ratio(layer);
  config.rope_kind = config.profile->rope_kind(layer);
  config.softmax_scale = config.profile->softmax_scale;
  config.rms_norm_eps = config.profile->rms_norm_eps;
  return config;
}

}  // namespace mla

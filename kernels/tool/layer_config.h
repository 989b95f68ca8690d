// What the kernel tool needs to know about one layer of one model: the
// constants of kernels/model_profile.h resolved for a layer index.
#ifndef MLA_OFFLOAD_KERNELS_TOOL_LAYER_CONFIG_H_
#define MLA_OFFLOAD_KERNELS_TOOL_LAYER_CONFIG_H_

#include <string>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "kernels/model_profile.h"
#include "kernels/rope.h"

namespace mla {

// Selects the model's first C4A layer, the kind most decode time goes to.
inline constexpr int kFirstC4aLayer = -1;

struct LayerConfig {
  const ModelProfile* profile = nullptr;
  int layer = 0;
  LayerKind kind = LayerKind::kSwaOnly;
  int compress_ratio = 0;  // 0, 4 or 128; compressed row j sits at position j * ratio
  RopeKind rope_kind = RopeKind::kPlain;
  float softmax_scale = 0.0f;
  float rms_norm_eps = 0.0f;

  // "deepseek-v4-flash layer 2 (c4a, compress ratio 4)".
  std::string Describe() const;
};

// InvalidArgument, naming the valid choices, for an unknown model or a layer
// outside [0, num_attention_layers) (the last one is the MTP layer).
absl::StatusOr<LayerConfig> ResolveLayer(absl::string_view model, int layer);

}  // namespace mla

#endif  // MLA_OFFLOAD_KERNELS_TOOL_LAYER_CONFIG_H_

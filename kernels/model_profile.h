// Model profiles: the per-model constants of DeepSeek-V4 (spec section 1).
//
// The server holds no weights; everything it needs to know about a model is
// here, looked up by name. Profiles are immutable and live for the program.
#ifndef MLA_OFFLOAD_KERNELS_MODEL_PROFILE_H_
#define MLA_OFFLOAD_KERNELS_MODEL_PROFILE_H_

#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "kernels/rope.h"

namespace mla {

// What a query attends in a layer, by the layer's compress ratio.
enum class LayerKind {
  kSwaOnly,  // ratio 0: the last 128 positions only.
  kC4A,      // ratio 4: SWA rows + the indexer's top-k compressed rows.
  kC128A,    // ratio 128: SWA rows + every compressed row j < (p+1)/128.
};

absl::string_view LayerKindName(LayerKind kind);

struct ModelProfile {
  std::string name;
  int num_layers;       // main layers, without the MTP layer
  int num_query_heads;  // h_total
  int indexer_topk;     // C4A top-k
  float rms_norm_eps;
  float softmax_scale;  // 512^-0.5
  // One entry per layer including the trailing MTP layer: 0, 4 or 128.
  std::vector<int> compress_ratios;

  // Layers a client may address: the main layers and the MTP layer.
  int num_attention_layers() const { return static_cast<int>(compress_ratios.size()); }
  int compress_ratio(int layer) const { return compress_ratios[layer]; }
  LayerKind layer_kind(int layer) const;
  RopeKind rope_kind(int layer) const;
};

// The built-in profiles: "deepseek-v4-flash" and "deepseek-v4-pro".
const std::vector<ModelProfile>& BuiltInProfiles();

// Finds a built-in profile by name; NotFound names the known ones.
absl::StatusOr<const ModelProfile*> FindModelProfile(absl::string_view name);

// Names of the built-in profiles, comma separated (for --help and errors).
std::string ModelProfileNames();

}  // namespace mla

#endif  // MLA_OFFLOAD_KERNELS_MODEL_PROFILE_H_

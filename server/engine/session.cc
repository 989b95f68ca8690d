#include "server/engine/session.h"

#include <algorithm>
#include <limits>

namespace mla {

float Session::Sink(int layer, int head_offset, int h) const {
  if (sinks.empty()) return -std::numeric_limits<float>::infinity();
  const int column = sink_heads == num_heads ? h : head_offset + h;
  return sinks[static_cast<size_t>(layer) * sink_heads + column];
}

int64_t Session::blocks() const {
  int64_t total = 0;
  for (const LayerKv& layer : layers) {
    total += static_cast<int64_t>(layer.swa_blocks.size() + layer.compressed_blocks.size());
  }
  return total;
}

int32_t Session::next_position() const {
  int32_t lowest = std::numeric_limits<int32_t>::max();
  for (const LayerKv& layer : layers) lowest = std::min(lowest, layer.next_position);
  return layers.empty() ? 0 : lowest;
}

std::vector<int32_t> Session::AllBlocks() const {
  std::vector<int32_t> all;
  for (const LayerKv& layer : layers) {
    all.insert(all.end(), layer.swa_blocks.begin(), layer.swa_blocks.end());
    all.insert(all.end(), layer.compressed_blocks.begin(), layer.compressed_blocks.end());
  }
  return all;
}

}  // namespace mla

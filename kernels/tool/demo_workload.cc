#include "kernels/tool/demo_workload.h"

#include <algorithm>
#include <numeric>
#include <random>

#include "kernels/bf16.h"
#include "kernels/geometry.h"

namespace mla {
namespace {

void AppendRandomBf16(int64_t count, std::mt19937_64& rng, std::vector<uint16_t>& out) {
  std::normal_distribution<float> normal(0.0f, 1.0f);
  for (int64_t i = 0; i < count; ++i) out.push_back(FloatToBf16(normal(rng)));
}

// Each sequence's rows live in its own blocks, handed out in a random order.
class BlockTable {
 public:
  BlockTable(int64_t sequences, int64_t blocks_per_sequence, std::mt19937_64& rng)
      : blocks_per_sequence_(blocks_per_sequence), blocks_(sequences * blocks_per_sequence) {
    std::iota(blocks_.begin(), blocks_.end(), 0);
    std::shuffle(blocks_.begin(), blocks_.end(), rng);
  }

  int64_t num_blocks() const { return static_cast<int64_t>(blocks_.size()); }

  // The global slot of row `row` of sequence `sequence`.
  int32_t Slot(int64_t sequence, int64_t row) const {
    const int64_t block = blocks_[sequence * blocks_per_sequence_ + row / kBlockTokens];
    return static_cast<int32_t>(block * kBlockTokens + row % kBlockTokens);
  }

 private:
  int64_t blocks_per_sequence_;
  std::vector<int64_t> blocks_;
};

void AppendRow(int32_t position, int32_t slot, std::mt19937_64& rng, OwnedInsert& insert) {
  AppendRandomBf16(kHeadDim, rng, insert.rows);
  insert.positions.push_back(position);
  insert.slots.push_back(slot);
}

}  // namespace

DemoWorkload MakeDemoWorkload(const WorkloadShape& shape) {
  std::mt19937_64 rng(shape.seed);
  DemoWorkload w;
  w.shape = shape;
  const int64_t batch = shape.batch;
  const int ratio = shape.layer.compress_ratio;
  w.rope_rows = shape.context;

  std::uniform_int_distribution<int64_t> position_of(
      shape.context - std::max<int64_t>(1, shape.context / 4), shape.context - 1);
  for (int64_t s = 0; s < batch; ++s) w.positions.push_back(static_cast<int32_t>(position_of(rng)));
  AppendRandomBf16(batch * shape.num_heads * kHeadDim, rng, w.q);
  std::normal_distribution<float> normal(0.0f, 1.0f);
  for (int h = 0; h < shape.num_heads; ++h) w.sinks.push_back(normal(rng));

  // SWA: a ring of kSwaWindow slots per sequence, position x at row x % window.
  const BlockTable swa_table(batch, kSwaWindow / kBlockTokens, rng);
  w.swa_blocks = swa_table.num_blocks();
  w.main_width = kSwaWindow;
  for (int64_t s = 0; s < batch; ++s) {
    const int32_t p = w.positions[s];
    for (int32_t x = std::max(0, p - kSwaWindow + 1); x < p; ++x) {
      AppendRow(x, swa_table.Slot(s, x % kSwaWindow), rng, w.history_swa);
    }
    AppendRow(p, swa_table.Slot(s, p % kSwaWindow), rng, w.new_swa);
    for (int32_t x = p - kSwaWindow + 1; x <= p; ++x) {
      w.main_indices.push_back(x < 0 ? -1 : swa_table.Slot(s, x % kSwaWindow));
      w.keys_read += x >= 0;
    }
  }
  if (ratio == 0) return w;

  // Compressed rows j < (p+1)/r, row j of a sequence at its row j.
  std::vector<int64_t> rows_of(batch);
  for (int64_t s = 0; s < batch; ++s) rows_of[s] = (w.positions[s] + 1) / ratio;
  const int64_t most_rows = *std::max_element(rows_of.begin(), rows_of.end());
  const BlockTable compressed_table(batch, (most_rows + kBlockTokens - 1) / kBlockTokens, rng);
  w.compressed_blocks = compressed_table.num_blocks();
  const bool top_k = shape.layer.kind == LayerKind::kC4A;
  w.extra_width = top_k ? shape.layer.profile->indexer_topk : static_cast<int>(most_rows);
  for (int64_t s = 0; s < batch; ++s) {
    for (int64_t j = 0; j < rows_of[s]; ++j) {
      AppendRow(static_cast<int32_t>(j * ratio), compressed_table.Slot(s, j), rng,
                w.history_compressed);
    }
    // The indexer's choice: random distinct rows (a partial shuffle).
    std::vector<int64_t> chosen(rows_of[s]);
    std::iota(chosen.begin(), chosen.end(), 0);
    const int64_t valid = std::min<int64_t>(rows_of[s], w.extra_width);
    for (int64_t k = 0; top_k && k < valid; ++k) {
      std::uniform_int_distribution<int64_t> pick(k, rows_of[s] - 1);
      std::swap(chosen[k], chosen[pick(rng)]);
    }
    for (int64_t k = 0; k < w.extra_width; ++k) {
      w.extra_indices.push_back(k < valid ? compressed_table.Slot(s, chosen[k]) : -1);
    }
    w.extra_lengths.push_back(static_cast<int32_t>(valid));
    w.keys_read += valid;
  }
  return w;
}

HostPrologue DemoWorkload::HistoryPrologue() const {
  HostPrologue host;
  host.num_heads = shape.num_heads;
  host.rms_norm_eps = shape.layer.rms_norm_eps;
  host.swa = history_swa.view();
  host.compressed = history_compressed.view();
  return host;
}

HostPrologue DemoWorkload::StepPrologue() const {
  HostPrologue host;
  host.num_heads = shape.num_heads;
  host.q = q;
  host.positions = positions;
  host.rms_norm_eps = shape.layer.rms_norm_eps;
  host.swa = new_swa.view();
  return host;
}

HostDecode DemoWorkload::StepDecode(absl::Span<const uint16_t> q_out, int padded_heads,
                                    bool derotate) const {
  HostDecode host;
  host.num_heads = shape.num_heads;
  host.padded_heads = padded_heads;
  host.q = q_out;
  host.softmax_scale = shape.layer.softmax_scale;
  host.sinks = sinks;
  host.main = {main_width, main_indices, {}};
  host.extra = {extra_width, extra_indices, extra_lengths};
  host.derotate = derotate;
  host.positions = positions;
  return host;
}

}  // namespace mla

#include "server/engine/testing/messages.h"

#include <algorithm>
#include <utility>

#include "gtest/gtest.h"
#include "kernels/geometry.h"
#include "server/engine/testing/rows.h"
#include "server/engine/testing/spec_models.h"

namespace mla::engine_testing {
namespace {

// One C4A top-k row for a token at `position`: valid rows j < (p+1)/4 (the
// newest and row 0 often), duplicates, -1 inside and -1 pads at the end.
void FillTopk(Random& rng, int32_t position, int width, int32_t* row) {
  const int32_t visible = (position + 1) / 4;
  for (int k = 0; k < width; ++k) {
    if (visible == 0 || k >= width - width / 5 || rng.Chance(0.1)) {
      row[k] = -1;
    } else if (k > 0 && rng.Chance(0.12)) {
      row[k] = row[rng.Uniform(0, k - 1)];
    } else if (rng.Chance(0.15)) {
      row[k] = rng.Chance(0.5) ? visible - 1 : 0;
    } else {
      row[k] = static_cast<int32_t>(rng.Uniform(0, visible - 1));
    }
  }
}

}  // namespace

std::unique_ptr<Message> Build(int layer, const std::vector<SegmentSpec>& segments,
                               const MessageOptions& options) {
  auto m = std::make_unique<Message>();
  const Seq& first = *segments.front().seq;
  const int ratio = first.ratio(layer);
  Random rng(options.seed);
  m->heads = first.heads;
  for (const SegmentSpec& segment : segments) {
    wire::SegmentView input;
    input.session_id = segment.seq->id;
    input.position = segment.position;
    input.num_tokens = segment.tokens;
    for (int32_t p = segment.position; p < segment.position + segment.tokens; ++p) {
      m->token_seq.push_back(segment.seq);
      m->token_position.push_back(p);
      if (options.kv) {
        const std::vector<uint16_t> row = options.garbage != 0 ? Rows(Mix(options.garbage, p), 1)
                                                               : segment.seq->Row(layer, false, p);
        m->kv.insert(m->kv.end(), row.begin(), row.end());
      }
    }
    if (ratio != 0 && segment.rows) {
      input.first_compressed_row = segment.position / ratio;
      input.num_compressed_rows =
          (segment.position + segment.tokens) / ratio - input.first_compressed_row;
      for (int32_t j = input.first_compressed_row;
           j < input.first_compressed_row + input.num_compressed_rows; ++j) {
        const std::vector<uint16_t> row = options.garbage != 0
                                              ? Rows(Mix(options.garbage, 100000 + j), 1)
                                              : segment.seq->Row(layer, true, j);
        m->compressed.insert(m->compressed.end(), row.begin(), row.end());
      }
    }
    m->input.segments.push_back(input);
  }
  const int64_t tokens = m->tokens();
  m->q = Rows(rng.Next(), tokens * m->heads);
  if (ratio == 4 && options.topk_width > 0) {
    m->topk_width = options.topk_width;
    m->topk.resize(tokens * m->topk_width);
    for (int64_t t = 0; t < tokens; ++t) {
      FillTopk(rng, m->token_position[t], m->topk_width, m->topk.data() + t * m->topk_width);
    }
  }
  wire::AttendRequestView& input = m->input;
  input.request_id = options.seed;
  input.layer = layer;
  input.head_offset = options.head_offset;
  input.q = Tensor(wire::DType::kBf16, {tokens, m->heads, kHeadDim}, m->q, rng.Next());
  if (options.kv) input.kv = Tensor(wire::DType::kBf16, {tokens, kHeadDim}, m->kv, rng.Next());
  if (!m->compressed.empty()) {
    input.compressed_kv = Tensor(wire::DType::kBf16,
                                 {static_cast<int64_t>(m->compressed.size() / kHeadDim), kHeadDim},
                                 m->compressed, rng.Next());
  }
  if (m->topk_width > 0) {
    input.topk = Tensor(wire::DType::kI32, {tokens, m->topk_width}, m->topk, rng.Next());
  }
  input.return_lse = options.lse;
  input.derotate_output = options.derotate;
  input.fp8_output = options.fp8;
  return m;
}

std::unique_ptr<Message> CorrectMessage(Seq& seq, int layer, int32_t p, uint64_t seed) {
  MessageOptions o;
  o.seed = seed;
  o.head_offset = 60;
  o.derotate = true;
  return Build(layer, {{&seq, p}}, o);
}

std::unique_ptr<Message> GarbageMessage(Seq& seq, int layer, int32_t p, uint64_t seed,
                                        int32_t tokens) {
  MessageOptions o;
  o.seed = seed;
  o.head_offset = 60;
  o.garbage = kGarbageRows;
  return Build(layer, {{&seq, p, tokens}}, o);
}

void Advance(const Message& m) {
  for (const wire::SegmentView& segment : m.input.segments) {
    for (int64_t t = 0; t < m.tokens(); ++t) {
      if (m.token_seq[t]->id != segment.session_id) continue;
      int32_t& next = m.token_seq[t]->next[m.input.layer];
      next = std::max(next, segment.position + segment.num_tokens);
    }
  }
}

std::unique_ptr<AppendRequest> BuildAppend(const Seq& seq, int32_t first, int32_t count,
                                           uint64_t seed) {
  auto request = std::make_unique<AppendRequest>();
  const int layers = seq.spec->layers();
  std::vector<int> order(layers);
  for (int layer = 0; layer < layers; ++layer) order[layer] = layer;
  Random rng(seed);
  for (int i = layers - 1; i > 0; --i) std::swap(order[i], order[rng.Uniform(0, i)]);
  request->swa.resize(layers);
  request->compressed.resize(layers);
  request->input.session_id = seq.id;
  request->input.first_position = first;
  request->input.num_positions = count;
  for (int e = 0; e < layers; ++e) {
    const int layer = order[e];
    wire::LayerRowsView rows;
    rows.layer = layer;
    for (int32_t p = first; p < first + count; ++p) {
      const std::vector<uint16_t> row = seq.Row(layer, false, p);
      request->swa[e].insert(request->swa[e].end(), row.begin(), row.end());
    }
    rows.swa_kv = Tensor(wire::DType::kBf16, {count, kHeadDim}, request->swa[e], Mix(seed, e));
    const int ratio = seq.ratio(layer);
    if (ratio != 0) {
      const int32_t from = first / ratio;
      const int32_t to = (first + count) / ratio;
      for (int32_t j = from; j < to; ++j) {
        const std::vector<uint16_t> row = seq.Row(layer, true, j);
        request->compressed[e].insert(request->compressed[e].end(), row.begin(), row.end());
      }
      rows.first_compressed_row = from;
      // An empty [0, 512] tensor is sent for some layers, none for others.
      if (to > from || layer % 2 == 1) {
        rows.compressed_kv = Tensor(wire::DType::kBf16, {to - from, kHeadDim},
                                    request->compressed[e], Mix(seed, 1000 + e));
      }
    }
    request->input.layers.push_back(std::move(rows));
  }
  return request;
}

std::function<void(AppendRequest&)> GarbageFirstCompressedRows(std::vector<int> ratios) {
  return [ratios = std::move(ratios)](AppendRequest& r) {
    const std::vector<int32_t> garbage = {0, kInt32Max, -1, kInt32Min, 12345};
    for (wire::LayerRowsView& rows : r.input.layers) {
      const int ratio = Spec(kFlash).ratios[rows.layer];
      if (std::find(ratios.begin(), ratios.end(), ratio) != ratios.end()) {
        rows.first_compressed_row = garbage[rows.layer % garbage.size()];
      }
    }
  };
}

absl::Status AppendSeq(AppendFn append, Seq& seq, int32_t first, int32_t count,
                       const std::function<void(AppendRequest&)>& change) {
  const std::unique_ptr<AppendRequest> request =
      BuildAppend(seq, first, count, Mix(seq.salt, first));
  if (change) change(*request);
  absl::StatusOr<AppendResult> result = append(request->input);
  if (!result.ok()) return result.status();
  for (int32_t& next : seq.next) next = first + count;
  EXPECT_EQ(result->next_position, first + count);
  EXPECT_EQ(result->session_blocks, seq.ExpectedBlocks());
  return absl::OkStatus();
}

}  // namespace mla::engine_testing

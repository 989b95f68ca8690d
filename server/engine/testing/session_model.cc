#include "server/engine/testing/session_model.h"

#include <algorithm>

#include "gtest/gtest.h"
#include "server/engine/testing/rows.h"

namespace mla::engine_testing {

std::vector<uint16_t> Seq::Row(int layer, bool compressed, int32_t index) const {
  return Rows(Mix(Mix(salt, layer * 2 + (compressed ? 1 : 0)), static_cast<uint64_t>(index)), 1);
}

float Seq::Sink(int layer, int head_offset, int h) const {
  if (sinks.empty()) return -kInf;
  if (sink_heads == spec->h_total) return sinks[layer * sink_heads + head_offset + h];
  return sinks[layer * sink_heads + h];
}

int32_t Seq::NextPosition() const { return *std::min_element(next.begin(), next.end()); }

int64_t Seq::ExpectedBlocks() const {
  int64_t blocks = 0;
  for (int layer = 0; layer < spec->layers(); ++layer) {
    blocks += 4;
    if (ratio(layer) != 0) blocks += (next[layer] / ratio(layer) + 63) / 64;
  }
  return blocks;
}

std::unique_ptr<Seq> CreateSeq(CreateSessionFn create, absl::string_view model, int heads,
                               SinkMode sinks, uint64_t salt, int idle_ttl_seconds,
                               const std::vector<float>& sink_values) {
  auto seq = std::make_unique<Seq>();
  seq->spec = &Spec(model);
  seq->heads = heads;
  seq->salt = salt;
  seq->next.assign(seq->spec->layers(), 0);
  wire::CreateSessionRequestView input;
  input.model = std::string(model);
  input.num_heads = heads;
  input.idle_ttl_seconds = idle_ttl_seconds;
  if (sinks != SinkMode::kNone) {
    seq->sink_heads = sinks == SinkMode::kWhole ? seq->spec->h_total : heads;
    seq->sinks = sink_values.empty()
                     ? RandomSinks(Mix(salt, 77), int64_t{seq->spec->layers()} * seq->sink_heads)
                     : sink_values;
    input.sinks =
        Tensor(wire::DType::kF32, {seq->spec->layers(), seq->sink_heads}, seq->sinks, salt);
  }
  absl::StatusOr<CreateSessionResult> created = create(input);
  EXPECT_TRUE(created.ok()) << created.status();
  if (!created.ok()) return nullptr;
  EXPECT_EQ(created->num_heads, heads);
  EXPECT_EQ(created->padded_heads, SpecPadded(heads));
  EXPECT_FALSE(created->session_id.empty());
  seq->id = created->session_id;
  return seq;
}

void ExpectListed(const std::vector<SessionSummary>& list, int64_t used_blocks,
                  const std::vector<const Seq*>& seqs) {
  ASSERT_EQ(list.size(), seqs.size());
  int64_t used = 0;
  for (const Seq* seq : seqs) {
    used += seq->ExpectedBlocks();
    auto it = std::find_if(list.begin(), list.end(),
                           [&](const SessionSummary& s) { return s.session_id == seq->id; });
    ASSERT_NE(it, list.end()) << seq->id;
    EXPECT_EQ(it->model, seq->spec->name);
    EXPECT_EQ(it->num_heads, seq->heads);
    EXPECT_EQ(it->next_position, seq->NextPosition());
    EXPECT_EQ(it->blocks, seq->ExpectedBlocks());
  }
  EXPECT_EQ(used_blocks, used);
}

std::ostream& operator<<(std::ostream& os, const Snapshot& s) {
  os << "used " << s.used << ", sessions " << s.sessions << ":";
  for (const auto& [id, model, heads, next, blocks, idle] : s.list) {
    os << " {" << id.substr(0, 6) << " " << model << " H" << heads << " next " << next << " blocks "
       << blocks << " idle " << idle << "}";
  }
  return os;
}

Snapshot Snap(int64_t used_blocks, int64_t sessions, const std::vector<SessionSummary>& list) {
  Snapshot snapshot{used_blocks, sessions, {}};
  for (const SessionSummary& s : list) {
    snapshot.list.emplace_back(s.session_id, s.model, s.num_heads, s.next_position, s.blocks,
                               s.idle_seconds);
  }
  return snapshot;
}

}  // namespace mla::engine_testing

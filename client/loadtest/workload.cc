#include "client/loadtest/workload.h"

#include <cmath>
#include <limits>
#include <random>

#include "kernels/bf16.h"
#include "kernels/geometry.h"

namespace mla::loadtest {
namespace {

uint64_t SplitMix(uint64_t x) {
  x += 0x9e3779b97f4a7c15ull;
  x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ull;
  x = (x ^ (x >> 27)) * 0x94d049bb133111ebull;
  return x ^ (x >> 31);
}

// Kinds of identity, so a SWA row and a compressed row of the same numbers differ.
enum Kind : uint64_t { kSwa = 1, kCompressed = 2, kQuery = 3, kTopK = 4, kSink = 5, kSession = 6 };

}  // namespace

uint64_t Mix(uint64_t a, uint64_t b) { return SplitMix(a ^ SplitMix(b ^ 0x5851f42d4c957f2dull)); }

Workload::Workload(const ModelProfile& model, int64_t pool_rows, uint64_t seed)
    : model_(model), pool_(static_cast<size_t>(pool_rows) * kHeadDim) {
  std::mt19937_64 rng(seed);
  std::normal_distribution<float> normal(0.0f, 1.0f);
  for (size_t tile = 0; tile < pool_.size() / kQuantTile; ++tile) {
    const float scale = std::ldexp(1.0f, static_cast<int>(rng() % 5) - 3);
    for (int i = 0; i < kQuantTile; ++i) {
      uint16_t bits = FloatToBf16(normal(rng) * scale);
      if ((bits & 0x7fff) == 0) bits = FloatToBf16(1e-3f);
      pool_[tile * kQuantTile + i] = bits;
    }
  }
}

uint64_t Workload::SessionSalt(uint64_t run_seed, int node, int session) {
  return Mix(Mix(Mix(run_seed, kSession), node), session);
}

uint64_t Workload::MessageKey(uint64_t run_seed, int node, int64_t step, int layer, int server) {
  return Mix(Mix(Mix(Mix(Mix(run_seed, kQuery), node), step), layer), server);
}

const uint16_t* Workload::Row(uint64_t key) const {
  return pool_.data() + static_cast<size_t>(key % pool_rows()) * kHeadDim;
}

const uint16_t* Workload::SwaRow(uint64_t salt, int layer, int32_t position) const {
  return Row(Mix(Mix(Mix(salt, kSwa), layer), position));
}

const uint16_t* Workload::CompressedRow(uint64_t salt, int layer, int32_t row) const {
  return Row(Mix(Mix(Mix(salt, kCompressed), layer), row));
}

absl::Span<const uint16_t> Workload::Query(uint64_t message_key, int64_t tokens, int heads) const {
  const int64_t rows = tokens * heads;
  const int64_t start = static_cast<int64_t>(Mix(message_key, kQuery) % (pool_rows() - rows + 1));
  return absl::MakeConstSpan(pool_.data() + start * kHeadDim, rows * kHeadDim);
}

absl::Span<const uint8_t> Workload::Bytes(uint64_t key, size_t size) const {
  const size_t total = pool_.size() * sizeof(uint16_t);
  const size_t start = static_cast<size_t>(Mix(key, kQuery) % (total - size + 1));
  return absl::MakeConstSpan(reinterpret_cast<const uint8_t*>(pool_.data()) + start, size);
}

void Workload::AppendTopK(uint64_t salt, int layer, int32_t position,
                          std::vector<int32_t>* out) const {
  const int width = model_.indexer_topk;
  const int64_t rows = (int64_t{position} + 1) / 4;
  const int64_t valid = std::min<int64_t>(rows, width);
  // Row i of the valid ones: offset + floor(i * rows / valid), modulo rows;
  // strictly increasing before the modulo and spanning less than `rows`, so
  // the rows are distinct.
  const int64_t offset =
      rows > 0 ? static_cast<int64_t>(Mix(Mix(Mix(salt, kTopK), layer), position) % rows) : 0;
  for (int64_t i = 0; i < width; ++i) {
    out->push_back(i < valid ? static_cast<int32_t>((offset + i * rows / valid) % rows) : -1);
  }
}

float Workload::Sink(uint64_t salt, int layer, int head) const {
  const uint64_t index = static_cast<uint64_t>(layer) * model_.num_query_heads + head;
  if (index % 13 == 5) return -std::numeric_limits<float>::infinity();
  const uint64_t bits = Mix(Mix(salt, kSink), index);
  return 2.0f + 5.0f * static_cast<float>((bits >> 40) * 0x1.0p-24);
}

std::vector<float> Workload::Sinks(uint64_t salt) const {
  std::vector<float> sinks;
  sinks.reserve(static_cast<size_t>(model_.num_attention_layers()) * model_.num_query_heads);
  for (int layer = 0; layer < model_.num_attention_layers(); ++layer) {
    for (int head = 0; head < model_.num_query_heads; ++head)
      sinks.push_back(Sink(salt, layer, head));
  }
  return sinks;
}

}  // namespace mla::loadtest

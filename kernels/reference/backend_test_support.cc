// Implementation of kernels/reference/backend_test_support.h: the inputs,
// runs and comparisons shared by the backend tests.
#include "kernels/reference/backend_test_support.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <iterator>
#include <limits>
#include <string>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/types/span.h"
#include "gtest/gtest.h"
#include "kernels/head_padding.h"
#include "kernels/reference/reference_f64.h"
#include "kernels/reference/tolerance.h"

namespace mla {
namespace backend_test {

using reference::CompareCacheRows;
using reference::CompareDecodeOut;
using reference::CompareDecodeOutFp8;
using reference::CompareLse;
using reference::CompareQueryOut;
using reference::ComparisonReport;
using reference::DecodeInputs;
using reference::DecodeReference;
using reference::KvRowReference;
using reference::QueryReference;

const RopeTable& SharedTable(RopeKind kind) {
  static const RopeTable* plain = new RopeTable(RopeKind::kPlain, kMaxPosition + 1);
  static const RopeTable* yarn = new RopeTable(RopeKind::kYarn, kMaxPosition + 1);
  return kind == RopeKind::kYarn ? *yarn : *plain;
}

std::string LayerCase::Name() const {
  const std::string& name = profile->name;
  return absl::StrCat(name.substr(name.rfind('-') + 1), "_", LayerKindName(kind));
}

std::vector<LayerCase> LayerCases() {
  std::vector<LayerCase> cases;
  for (const ModelProfile& profile : BuiltInProfiles()) {
    for (LayerKind kind : {LayerKind::kSwaOnly, LayerKind::kC4A, LayerKind::kC128A}) {
      for (int layer = 0; layer < profile.num_attention_layers(); ++layer) {
        if (profile.layer_kind(layer) != kind) continue;
        cases.push_back(
            {&profile, layer, kind, profile.compress_ratio(layer), profile.rope_kind(layer)});
        break;
      }
    }
  }
  return cases;
}

InsertBatch MakeInsert(Random& rng, std::vector<int32_t> positions, int64_t num_blocks) {
  InsertBatch batch;
  batch.positions = std::move(positions);
  batch.num_blocks = num_blocks;
  batch.rows = rng.Rows(batch.num_rows());
  batch.slots = rng.InsertSlots(batch.num_rows(), num_blocks * kBlockTokens);
  batch.pool = rng.Garbage(num_blocks * kBlockBytes);
  return batch;
}

KvInsertParams PutInsert(DeviceArena& arena, const InsertBatch& batch, uint8_t* pool) {
  KvInsertParams params;
  params.num_rows = batch.num_rows();
  if (batch.num_rows() == 0) return params;
  params.rows = arena.Put(batch.rows);
  params.positions = arena.Put(batch.positions);
  params.slots = arena.Put(batch.slots);
  params.pool = {pool != nullptr ? pool : arena.Put(batch.pool), batch.num_blocks};
  return params;
}

std::vector<KvRowReference> ReferenceRows(const InsertBatch& batch, const RopeTable& table) {
  std::vector<KvRowReference> rows;
  for (int64_t r = 0; r < batch.num_rows(); ++r) {
    absl::StatusOr<KvRowReference> row = reference::ReferenceKvRow(
        absl::MakeConstSpan(batch.rows).subspan(r * kHeadDim, kHeadDim), batch.positions[r], table);
    EXPECT_TRUE(row.ok()) << row.status();
    if (row.ok()) rows.push_back(*row);
  }
  return rows;
}

// The inserted rows match the reference, and no other byte of the pool moved.
void ExpectInserted(const InsertBatch& batch, const std::vector<uint8_t>& after,
                    const RopeTable& table, absl::string_view subject) {
  const ComparisonReport report =
      CompareCacheRows(after, batch.slots, ReferenceRows(batch, table), subject);
  EXPECT_TRUE(report.ok()) << report.ToString();

  std::vector<bool> written(after.size(), false);
  for (int32_t slot : batch.slots) {
    if (slot == -1) continue;
    std::fill_n(written.begin() + reference::DataOffset(slot), kTokenDataBytes, true);
    std::fill_n(written.begin() + reference::ScaleOffset(slot), kTokenScaleBytes, true);
  }
  int64_t moved = 0;
  int64_t first_moved = -1;
  for (size_t i = 0; i < after.size(); ++i) {
    if (!written[i] && after[i] != batch.pool[i]) {
      if (moved++ == 0) first_moved = static_cast<int64_t>(i);
    }
  }
  EXPECT_EQ(moved, 0) << subject << ": " << moved
                      << " bytes outside the inserted rows changed, the first at offset "
                      << first_moved;
}

std::vector<PrologueCase> PrologueCases() {
  std::vector<PrologueCase> cases;
  const int tokens_for_heads[] = {64, 33, 17, 11, 7, 5, 3, 2, 1};
  static_assert(std::size(tokens_for_heads) == std::size(kHeadCounts));
  for (const LayerCase& layer : LayerCases()) {
    for (size_t i = 0; i < std::size(kHeadCounts); ++i) {
      cases.push_back({layer, kHeadCounts[i], tokens_for_heads[i], 1000 + cases.size()});
    }
  }
  return cases;
}

// gtest prints a parameter on failure: its name, not its bytes.
void PrintTo(const LayerCase& c, std::ostream* os) { *os << c.Name(); }
void PrintTo(const PrologueCase& c, std::ostream* os) {
  *os << c.layer.Name() << " H=" << c.heads << " N=" << c.tokens << " seed " << c.seed;
}

PrologueRandomInputs MakePrologueInputs(const PrologueCase& c) {
  Random rng(c.seed);
  const int64_t n = c.tokens;
  PrologueRandomInputs in;
  in.q = rng.Rows(n * c.heads);
  in.positions.resize(n);
  for (int32_t& p : in.positions) p = static_cast<int32_t>(rng.Uniform(0, kMaxPosition));
  in.positions[0] = kMaxPosition;
  if (n > 1) in.positions[1] = 0;

  // One new SWA row per token at its position; compressed rows at j * r.
  in.swa = MakeInsert(rng, in.positions, 2 + n / kBlockTokens);
  std::vector<int32_t> compressed_positions;
  if (c.layer.ratio > 0) {
    const int64_t max_j = kMaxPosition / c.layer.ratio;
    compressed_positions = {0, static_cast<int32_t>(max_j * c.layer.ratio)};
    while (static_cast<int64_t>(compressed_positions.size()) < 2 + n / 3) {
      compressed_positions.push_back(static_cast<int32_t>(rng.Uniform(0, max_j) * c.layer.ratio));
    }
  }
  // Enough blocks for distinct slots (the large cases insert hundreds of rows;
  // up to 64 tokens this is one block).
  in.compressed = MakeInsert(rng, compressed_positions,
                             1 + static_cast<int64_t>(compressed_positions.size()) / kBlockTokens);
  return in;
}

PrologueParams PutPrologue(DeviceArena& arena, const PrologueCase& c,
                           const PrologueRandomInputs& in) {
  const int padded = *PaddedHeadCount(c.heads);
  const int64_t n = c.tokens;
  PrologueParams params;
  params.num_tokens = n;
  params.num_heads = c.heads;
  params.padded_heads = padded;
  params.q = arena.Put(in.q);
  params.positions = arena.Put(in.positions);
  params.q_out = arena.Put(std::vector<uint16_t>(n * padded * kHeadDim, kPoisonBf16));
  params.rms_norm_eps = c.layer.profile->rms_norm_eps;
  params.rope = arena.PutTable(SharedTable(c.layer.rope));
  params.swa = PutInsert(arena, in.swa);
  params.compressed = PutInsert(arena, in.compressed);
  return params;
}

void RunPrologueCase(ComputeBackend& backend, const PrologueCase& c,
                     const PrologueCheck& also_check) {
  const PrologueRandomInputs in = MakePrologueInputs(c);
  const RopeTable& table = SharedTable(c.layer.rope);
  const int padded = *PaddedHeadCount(c.heads);
  const int64_t n = c.tokens;

  DeviceArena arena(backend);
  const PrologueParams params = PutPrologue(arena, c, in);
  const absl::Status status = backend.Prologue(params);
  ASSERT_TRUE(status.ok()) << status;
  ASSERT_TRUE(backend.Synchronize().ok());

  absl::StatusOr<QueryReference> expected =
      reference::ReferenceQuery(in.q, in.positions, c.heads, padded, params.rms_norm_eps, table);
  ASSERT_TRUE(expected.ok()) << expected.status();
  const ComparisonReport report =
      CompareQueryOut(arena.Get(params.q_out, n * padded * kHeadDim), *expected);
  EXPECT_TRUE(report.ok()) << report.ToString();
  ExpectInserted(in.swa, arena.Get(params.swa.pool.base, in.swa.pool.size()), table, "swa pool");
  if (in.compressed.num_rows() > 0) {
    ExpectInserted(in.compressed, arena.Get(params.compressed.pool.base, in.compressed.pool.size()),
                   table, "compressed pool");
  }
  if (also_check) also_check(in, arena, params);
}

absl::string_view SinkModeName(SinkMode mode) {
  switch (mode) {
    case SinkMode::kNone:
      return "nosink";
    case SinkMode::kNegativeInfinity:
      return "sinkneginf";
    case SinkMode::kZero:
      return "sink0";
    case SinkMode::kLarge:
      return "sink30";
    case SinkMode::kMixed:
      return "sinkmixed";
    case SinkMode::kPerToken:
      return "sinkpertoken";
  }
  return "unknown";
}

// Sinks of H heads ([N, H] for kPerToken, a different logit for every token
// and head); empty for kNone (the backend then gets a null pointer).
std::vector<float> MakeSinks(Random& rng, SinkMode mode, int heads, int64_t tokens) {
  std::vector<float> sinks;
  if (mode == SinkMode::kNone) return sinks;
  if (mode == SinkMode::kPerToken) {
    // Each head's sink changes from token to token between no effect, a
    // dominant sink and a moderate one, so a backend reading token 0's sinks
    // for every token is far off.
    for (int64_t t = 0; t < tokens; ++t) {
      for (int h = 0; h < heads; ++h) {
        const float choices[] = {-kInf, 30.0f, static_cast<float>(3 * rng.Normal())};
        sinks.push_back(choices[(t + h) % 3]);
      }
    }
    return sinks;
  }
  for (int h = 0; h < heads; ++h) {
    switch (mode) {
      case SinkMode::kNegativeInfinity:
        sinks.push_back(-kInf);
        break;
      case SinkMode::kZero:
        sinks.push_back(0.0f);
        break;
      case SinkMode::kLarge:
        sinks.push_back(30.0f);
        break;
      default: {
        const float choices[] = {-kInf, 0.0f, 30.0f, static_cast<float>(3 * rng.Normal())};
        sinks.push_back(choices[h % 4]);
      }
    }
  }
  return sinks;
}

// A pool of `num_blocks` whose every slot holds a reference row of random
// data; rows of compressed pools are rotated at multiples of the ratio.
std::vector<uint8_t> MakePool(Random& rng, int64_t num_blocks, int ratio, const RopeTable& table) {
  std::vector<uint8_t> pool(num_blocks * kBlockBytes, 0);
  const int64_t slots = num_blocks * kBlockTokens;
  const std::vector<uint16_t> rows = rng.Rows(slots);
  const int64_t step = std::max(ratio, 1);
  for (int64_t s = 0; s < slots; ++s) {
    const int64_t last = (table.num_positions() - 1) / step;
    const int32_t position = static_cast<int32_t>(rng.Uniform(0, last) * step);
    absl::StatusOr<KvRowReference> row = reference::ReferenceKvRow(
        absl::MakeConstSpan(rows).subspan(s * kHeadDim, kHeadDim), position, table);
    EXPECT_TRUE(row.ok()) << row.status();
    if (!row.ok()) break;
    EXPECT_TRUE(reference::WriteCacheRow(*row, s, absl::MakeSpan(pool)).ok());
  }
  return pool;
}
// Fills row t with `length` used entries (the width without explicit
// lengths) over the list's pool: -1 entries and repeated slots mixed in. The
// entries past the length hold values that would be invalid if read. An
// empty row is length 0, or all -1 without explicit lengths.
void FillKeyRow(Random& rng, KeyList& list, int64_t t, int length, bool empty) {
  const int64_t pool_slots = list.num_blocks * kBlockTokens;
  int32_t* row = list.indices.data() + t * list.width;
  const bool explicit_lengths = !list.lengths.empty();
  if (!explicit_lengths) length = list.width;
  if (empty && explicit_lengths) length = 0;
  if (explicit_lengths) list.lengths[t] = length;
  for (int k = 0; k < list.width; ++k) {
    if (k >= length) {
      const int32_t invalid[] = {-2, -1000, static_cast<int32_t>(pool_slots),
                                 std::numeric_limits<int32_t>::max()};
      row[k] = invalid[rng.Uniform(0, 3)];
    } else if (empty || rng.Chance(0.08)) {
      row[k] = -1;
    } else if (k > 0 && rng.Chance(0.1)) {
      row[k] = row[rng.Uniform(0, k - 1)];
    } else {
      row[k] = static_cast<int32_t>(rng.Uniform(0, pool_slots - 1));
    }
  }
}

KeyListParams PutKeyList(DeviceArena& arena, const KeyList& list) {
  KeyListParams params;
  params.width = list.width;
  if (list.width == 0) return params;
  params.indices = arena.Put(list.indices);
  params.lengths = list.lengths.empty() ? nullptr : arena.Put(list.lengths);
  params.pool = {arena.Put(list.pool), list.num_blocks};
  return params;
}

reference::KeyListInputs KeyListInputsOf(const KeyList& list) {
  return {list.width, list.indices, list.lengths, list.pool};
}

std::string DecodeCase::Name() const {
  return absl::StrCat(layer.Name(), "_h", heads, "_n", tokens, "_", SinkModeName(sinks),
                      derotate ? "_derotate" : "", want_lse ? "" : "_nolse",
                      explicit_lengths ? "" : "_nolengths",
                      out_offset == 0 ? "" : absl::StrCat("_outoffset", out_offset),
                      fp8_output ? "_fp8" : "");
}

std::vector<DecodeCase> DecodeCases() {
  std::vector<DecodeCase> cases;
  const int tokens_for_heads[] = {64, 24, 12, 9, 5, 4, 3, 2, 2};
  static_assert(std::size(tokens_for_heads) == std::size(kHeadCounts));
  const SinkMode modes[] = {SinkMode::kNone,  SinkMode::kNegativeInfinity,
                            SinkMode::kZero,  SinkMode::kLarge,
                            SinkMode::kMixed, SinkMode::kPerToken};
  for (const LayerCase& layer : LayerCases()) {
    for (size_t i = 0; i < std::size(kHeadCounts); ++i) {
      const int index = static_cast<int>(cases.size());
      // The mode turns with the layer too, so that every mode meets every
      // head count and token count rather than always the same one.
      const SinkMode mode = modes[(index + index / 6) % 6];
      cases.push_back({layer, kHeadCounts[i], tokens_for_heads[i], mode, index % 2 == 1,
                       index % 4 != 1, index % 3 != 2, 2000 + static_cast<uint64_t>(index)});
    }
  }
  // A batch of one token.
  cases.push_back({LayerCases()[1], 16, 1, SinkMode::kMixed, true, true, true, 2100});
  // An output view that starts 4 bytes into its buffer.
  cases.push_back({LayerCases()[4], 8, 3, SinkMode::kZero, true, true, true, 2110, 2});
  return cases;
}

std::vector<DecodeCase> Fp8DecodeCases() {
  std::vector<DecodeCase> cases;
  const std::vector<LayerCase> layers = LayerCases();
  const int tokens_for_heads[] = {64, 24, 12, 9, 5, 4, 3, 2, 2};
  static_assert(std::size(tokens_for_heads) == std::size(kHeadCounts));
  const SinkMode modes[] = {SinkMode::kMixed, SinkMode::kNone,     SinkMode::kPerToken,
                            SinkMode::kLarge, SinkMode::kZero, SinkMode::kNegativeInfinity};
  for (size_t l = 0; l < layers.size(); ++l) {
    for (int j = 0; j < 2; ++j) {
      // Layer l takes head counts 2l and 2l + 1 of kHeadCounts (wrapping), so
      // the six kinds cover every count, the first three twice.
      const int i = static_cast<int>((2 * l + j) % std::size(kHeadCounts));
      const int index = static_cast<int>(cases.size());
      cases.push_back({layers[l], kHeadCounts[i], tokens_for_heads[i], modes[index % 6], j == 1,
                       index % 3 != 1, index % 4 != 3, 2200 + static_cast<uint64_t>(index), 0,
                       true});
    }
  }
  cases.push_back({layers[1], 16, 1, SinkMode::kMixed, true, true, true, 2300, 0, true});
  cases.push_back({layers[4], 8, 3, SinkMode::kZero, false, true, true, 2310, 16, true});
  return cases;
}

void PrintTo(const DecodeCase& c, std::ostream* os) { *os << c.Name() << " seed " << c.seed; }

// Into `out`, the `view` elements at `offset` of `whole`, a buffer poisoned
// with `poison` whose elements around the view must still hold it.
template <typename T>
::testing::AssertionResult ViewInsidePoison(const std::vector<T>& whole, int64_t offset,
                                            int64_t view, T poison, absl::string_view what,
                                            std::vector<T>& out) {
  for (int64_t i = 0; i < static_cast<int64_t>(whole.size()); ++i) {
    if (i >= offset && i < offset + view) continue;
    if (whole[i] != poison) {
      return ::testing::AssertionFailure()
             << "decode wrote " << (i < offset ? "before" : "past") << " the " << what
             << " view, element " << (i < offset ? i : i - offset - view);
    }
  }
  out.assign(whole.begin() + offset, whole.begin() + offset + view);
  return ::testing::AssertionSuccess();
}

void RunDecodeCase(ComputeBackend& backend, const DecodeCase& c) {
  Random rng(c.seed);
  const RopeTable& table = SharedTable(c.layer.rope);
  const int padded = *PaddedHeadCount(c.heads);
  const int64_t n = c.tokens;

  std::vector<int32_t> positions(n);
  for (int32_t& p : positions) p = static_cast<int32_t>(rng.Uniform(0, kMaxPosition));
  positions[0] = kMaxPosition;

  // Queries as the prologue makes them: normalised, rotated, padding heads 0.
  absl::StatusOr<QueryReference> query = reference::ReferenceQuery(
      rng.Rows(n * c.heads), positions, c.heads, padded, c.layer.profile->rms_norm_eps, table);
  ASSERT_TRUE(query.ok()) << query.status();
  std::vector<uint16_t> q(query->values.size());
  for (size_t i = 0; i < q.size(); ++i) q[i] = reference::RoundToBf16(query->values[i]);

  KeyList main;
  main.width = kSwaWindow;
  main.num_blocks = 3;
  KeyList extra;
  if (c.layer.kind == LayerKind::kC4A) {
    extra.width = c.layer.profile->indexer_topk;
    extra.num_blocks = 5;
  } else if (c.layer.kind == LayerKind::kC128A) {
    for (int32_t p : positions) extra.width = std::max(extra.width, (p + 1) / 128);
    extra.num_blocks = (extra.width + kBlockTokens - 1) / kBlockTokens;
  }
  for (KeyList* list : {&main, &extra}) {
    if (list->width == 0) continue;
    list->indices.resize(n * list->width);
    if (c.explicit_lengths) list->lengths.resize(n);
    list->pool = MakePool(rng, list->num_blocks, list == &extra ? c.layer.ratio : 0, table);
  }
  // Token 1 attends nothing, token 2 no SWA row, token 3 no compressed row.
  for (int64_t t = 0; t < n; ++t) {
    const int main_length =
        static_cast<int>(rng.Chance(0.5) ? main.width : rng.Uniform(1, main.width));
    FillKeyRow(rng, main, t, main_length, t == 1 || t == 2);
    if (extra.width == 0) continue;
    const int extra_length = c.layer.kind == LayerKind::kC128A
                                 ? (positions[t] + 1) / 128
                                 : static_cast<int>(rng.Uniform(1, extra.width));
    FillKeyRow(rng, extra, t, extra_length, t == 1 || t == 3);
  }
  const std::vector<float> sinks = MakeSinks(rng, c.sinks, c.heads, n);

  DeviceArena arena(backend);
  DecodeParams params;
  params.num_tokens = n;
  params.num_heads = c.heads;
  params.padded_heads = padded;
  params.q = arena.Put(q);
  params.softmax_scale = c.layer.profile->softmax_scale;
  params.sinks = sinks.empty() ? nullptr : arena.Put(sinks);
  params.sinks_per_token = c.sinks == SinkMode::kPerToken;
  params.main = PutKeyList(arena, main);
  params.extra = PutKeyList(arena, extra);
  params.derotate = c.derotate;
  if (c.derotate) {
    params.positions = arena.Put(positions);
    params.rope = arena.PutTable(table);
  }
  // Poison before the views (c.out_offset elements) and after them (a guard).
  constexpr int kGuard = 64;
  const int64_t view = n * c.heads * kHeadDim;
  const int64_t scales_view = n * c.heads * kOutputQuantBlocks;
  const int scales_offset = c.out_offset / 4;
  uint16_t* out_buffer = nullptr;
  uint8_t* e4m3_buffer = nullptr;
  uint8_t* scales_buffer = nullptr;
  if (c.fp8_output) {
    e4m3_buffer = arena.Put(std::vector<uint8_t>(c.out_offset + view + kGuard, kPoisonE4m3));
    scales_buffer =
        arena.Put(std::vector<uint8_t>(scales_offset + scales_view + kGuard, kPoisonScale));
    params.out_e4m3 = e4m3_buffer + c.out_offset;
    params.out_scales = scales_buffer + scales_offset;
  } else {
    out_buffer = arena.Put(std::vector<uint16_t>(c.out_offset + view + kGuard, kPoisonBf16));
    params.out = out_buffer + c.out_offset;
  }
  if (c.want_lse) {
    params.lse =
        arena.Put(std::vector<float>(n * c.heads, std::numeric_limits<float>::quiet_NaN()));
  }
  const absl::Status status = backend.Decode(params);
  ASSERT_TRUE(status.ok()) << status;
  ASSERT_TRUE(backend.Synchronize().ok());

  DecodeInputs inputs;
  inputs.num_tokens = n;
  inputs.num_heads = c.heads;
  inputs.padded_heads = padded;
  inputs.q = q;
  inputs.softmax_scale = params.softmax_scale;
  inputs.sinks = sinks;
  inputs.sinks_per_token = params.sinks_per_token;
  inputs.main = KeyListInputsOf(main);
  inputs.extra = KeyListInputsOf(extra);
  inputs.derotate = c.derotate;
  inputs.positions = positions;
  inputs.rope = &table;
  absl::StatusOr<DecodeReference> expected = reference::ReferenceDecode(inputs);
  ASSERT_TRUE(expected.ok()) << expected.status();

  if (c.fp8_output) {
    std::vector<uint8_t> e4m3, scales;
    ASSERT_TRUE(ViewInsidePoison(arena.Get(e4m3_buffer, c.out_offset + view + kGuard),
                                 c.out_offset, view, kPoisonE4m3, "e4m3 output", e4m3));
    ASSERT_TRUE(ViewInsidePoison(arena.Get(scales_buffer, scales_offset + scales_view + kGuard),
                                 scales_offset, scales_view, kPoisonScale, "scales output",
                                 scales));
    // Empty key sets are checked in it: 0x00 codes, the amax floor's scale.
    const ComparisonReport out_report = CompareDecodeOutFp8(e4m3, scales, *expected);
    EXPECT_TRUE(out_report.ok()) << out_report.ToString();
  } else {
    std::vector<uint16_t> out;
    ASSERT_TRUE(ViewInsidePoison(arena.Get(out_buffer, c.out_offset + view + kGuard),
                                 c.out_offset, view, kPoisonBf16, "output", out));
    const ComparisonReport out_report = CompareDecodeOut(out, *expected);
    EXPECT_TRUE(out_report.ok()) << out_report.ToString();
    // An empty key set gives exactly 0, whatever the sink (spec section 5).
    for (int64_t t = 0; t < n; ++t) {
      if (expected->num_keys[t] != 0) continue;
      for (int64_t i = t * c.heads * kHeadDim; i < (t + 1) * c.heads * kHeadDim; ++i) {
        ASSERT_EQ(reference::Bf16Value(out[i]), 0.0) << "token " << t << " element " << i;
      }
    }
  }
  if (c.want_lse) {
    const ComparisonReport lse_report = CompareLse(arena.Get(params.lse, n * c.heads), *expected);
    EXPECT_TRUE(lse_report.ok()) << lse_report.ToString();
  }
  if (n > 1) {
    EXPECT_EQ(expected->num_keys[1], 0) << "the test meant token 1 to attend nothing";
  }
  for (const KeyList* list : {&main, &extra}) {
    if (list->width == 0) continue;
    const KeyListParams& device = list == &main ? params.main : params.extra;
    EXPECT_TRUE(arena.Get(device.pool.base, list->pool.size()) == list->pool)
        << "decode wrote into a pool";
  }
}

void RunLayerStep(ComputeBackend& backend, const LayerCase& layer) {
  const ModelProfile& profile = *layer.profile;
  Random rng(3000 + layer.layer + 100 * profile.num_query_heads);
  const RopeTable& table = SharedTable(layer.rope);
  const int heads = profile.num_query_heads / 8;  // TP8
  const int padded = *PaddedHeadCount(heads);
  constexpr int64_t kTokens = 4;
  const int32_t first = kMaxPosition - kTokens + 1;

  // SWA slot of position x: x - (first - kSwaWindow), history then the step.
  const int32_t swa_base = first - kSwaWindow;
  std::vector<int32_t> history_positions;
  for (int32_t x = swa_base; x < first; ++x) history_positions.push_back(x);
  std::vector<int32_t> step_positions;
  for (int32_t x = first; x < first + kTokens; ++x) step_positions.push_back(x);
  const int64_t swa_blocks = (kSwaWindow + kTokens + kBlockTokens - 1) / kBlockTokens;
  InsertBatch swa_history = MakeInsert(rng, history_positions, swa_blocks);
  InsertBatch swa_step = MakeInsert(rng, step_positions, swa_blocks);
  for (int32_t i = 0; i < kSwaWindow; ++i) swa_history.slots[i] = i;
  for (int32_t i = 0; i < kTokens; ++i) swa_step.slots[i] = kSwaWindow + i;

  // Compressed rows: row k of the pool holds j = compressed_j[k].
  std::vector<int32_t> compressed_j;
  if (layer.kind == LayerKind::kC128A) {
    for (int32_t j = 0; j < (first + kTokens) / 128; ++j) compressed_j.push_back(j);
  } else if (layer.kind == LayerKind::kC4A) {
    std::vector<int32_t> visible((first + 1) / 4);
    for (size_t j = 0; j < visible.size(); ++j) visible[j] = static_cast<int32_t>(j);
    rng.Shuffle(visible);
    compressed_j.assign(visible.begin(), visible.begin() + profile.indexer_topk + kBlockTokens);
  }
  std::vector<int32_t> compressed_positions;
  for (int32_t j : compressed_j) compressed_positions.push_back(j * layer.ratio);
  const int64_t compressed_blocks =
      std::max<int64_t>(1, (compressed_j.size() + kBlockTokens - 1) / kBlockTokens);
  InsertBatch compressed = MakeInsert(rng, compressed_positions, compressed_blocks);
  for (size_t k = 0; k < compressed_j.size(); ++k) compressed.slots[k] = static_cast<int32_t>(k);

  const std::vector<uint16_t> q = rng.Rows(kTokens * heads);
  DeviceArena arena(backend);
  const RopeTableView rope = arena.PutTable(table);
  uint8_t* swa_pool = arena.Put(swa_history.pool);
  uint8_t* compressed_pool = arena.Put(compressed.pool);

  PrologueParams history;
  history.num_heads = heads;
  history.padded_heads = padded;
  history.rope = rope;
  history.swa = PutInsert(arena, swa_history, swa_pool);
  history.compressed = PutInsert(arena, compressed, compressed_pool);
  absl::Status status = backend.Prologue(history);
  ASSERT_TRUE(status.ok()) << status;

  PrologueParams step;
  step.num_tokens = kTokens;
  step.num_heads = heads;
  step.padded_heads = padded;
  step.q = arena.Put(q);
  step.positions = arena.Put(step_positions);
  step.q_out = arena.Put(std::vector<uint16_t>(kTokens * padded * kHeadDim, kPoisonBf16));
  step.rms_norm_eps = profile.rms_norm_eps;
  step.rope = rope;
  step.swa = PutInsert(arena, swa_step, swa_pool);
  status = backend.Prologue(step);
  ASSERT_TRUE(status.ok()) << status;

  const std::vector<uint16_t> q_out = arena.Get(step.q_out, kTokens * padded * kHeadDim);
  absl::StatusOr<QueryReference> expected_q =
      reference::ReferenceQuery(q, step_positions, heads, padded, profile.rms_norm_eps, table);
  ASSERT_TRUE(expected_q.ok()) << expected_q.status();
  const ComparisonReport q_report = CompareQueryOut(q_out, *expected_q);
  EXPECT_TRUE(q_report.ok()) << q_report.ToString();
  const std::vector<uint8_t> swa_bytes = arena.Get(swa_pool, swa_history.pool.size());
  const std::vector<uint8_t> compressed_bytes = arena.Get(compressed_pool, compressed.pool.size());
  for (const InsertBatch* batch : {&swa_history, &swa_step}) {
    const ComparisonReport report =
        CompareCacheRows(swa_bytes, batch->slots, ReferenceRows(*batch, table), "swa pool");
    EXPECT_TRUE(report.ok()) << report.ToString();
  }
  if (compressed.num_rows() > 0) {
    const ComparisonReport report = CompareCacheRows(
        compressed_bytes, compressed.slots, ReferenceRows(compressed, table), "compressed pool");
    EXPECT_TRUE(report.ok()) << report.ToString();
  }

  // Keys: the SWA window of each token and the compressed rows it attends.
  KeyList main;
  main.width = kSwaWindow;
  main.num_blocks = swa_blocks;
  main.pool = swa_bytes;
  KeyList extra;
  extra.pool = compressed_bytes;
  extra.num_blocks = compressed_blocks;
  if (layer.kind == LayerKind::kC128A) {
    extra.width = static_cast<int>(compressed_j.size());
    extra.lengths.resize(kTokens);
  } else if (layer.kind == LayerKind::kC4A) {
    extra.width = profile.indexer_topk;
  }
  for (int64_t t = 0; t < kTokens; ++t) {
    const int32_t p = step_positions[t];
    for (int32_t k = 0; k < kSwaWindow; ++k)
      main.indices.push_back(p - kSwaWindow + 1 + k - swa_base);
    if (layer.kind == LayerKind::kC128A) {
      extra.lengths[t] = (p + 1) / 128;
      for (int32_t k = 0; k < extra.width; ++k)
        extra.indices.push_back(k < extra.lengths[t] ? k : -1);
    } else if (layer.kind == LayerKind::kC4A) {
      std::vector<int32_t> rows(compressed_j.size());
      for (size_t k = 0; k < rows.size(); ++k) rows[k] = static_cast<int32_t>(k);
      rng.Shuffle(rows);
      extra.indices.insert(extra.indices.end(), rows.begin(), rows.begin() + extra.width);
    }
  }
  std::vector<float> sinks(heads);
  for (float& s : sinks) s = static_cast<float>(rng.Normal() * 2);

  DecodeParams decode;
  decode.num_tokens = kTokens;
  decode.num_heads = heads;
  decode.padded_heads = padded;
  decode.q = step.q_out;
  decode.softmax_scale = profile.softmax_scale;
  decode.sinks = arena.Put(sinks);
  decode.main = PutKeyList(arena, main);
  decode.main.pool.base = swa_pool;
  decode.extra = PutKeyList(arena, extra);
  if (extra.width > 0) decode.extra.pool.base = compressed_pool;
  decode.derotate = true;
  decode.positions = step.positions;
  decode.rope = rope;
  decode.out = arena.Put(std::vector<uint16_t>(kTokens * heads * kHeadDim, kPoisonBf16));
  decode.lse =
      arena.Put(std::vector<float>(kTokens * heads, std::numeric_limits<float>::quiet_NaN()));
  status = backend.Decode(decode);
  ASSERT_TRUE(status.ok()) << status;
  // The same decode into the FP8 output, its lse poisoned again.
  DecodeParams fp8 = decode;
  fp8.out = nullptr;
  fp8.out_e4m3 = arena.Put(std::vector<uint8_t>(kTokens * heads * kHeadDim, kPoisonE4m3));
  fp8.out_scales =
      arena.Put(std::vector<uint8_t>(kTokens * heads * kOutputQuantBlocks, kPoisonScale));
  fp8.lse = arena.Put(std::vector<float>(kTokens * heads, std::numeric_limits<float>::quiet_NaN()));
  status = backend.Decode(fp8);
  ASSERT_TRUE(status.ok()) << status;

  DecodeInputs inputs;
  inputs.num_tokens = kTokens;
  inputs.num_heads = heads;
  inputs.padded_heads = padded;
  inputs.q = q_out;
  inputs.softmax_scale = profile.softmax_scale;
  inputs.sinks = sinks;
  inputs.main = KeyListInputsOf(main);
  inputs.extra = KeyListInputsOf(extra);
  inputs.derotate = true;
  inputs.positions = step_positions;
  inputs.rope = &table;
  absl::StatusOr<DecodeReference> expected = reference::ReferenceDecode(inputs);
  ASSERT_TRUE(expected.ok()) << expected.status();
  const ComparisonReport out_report =
      CompareDecodeOut(arena.Get(decode.out, kTokens * heads * kHeadDim), *expected);
  EXPECT_TRUE(out_report.ok()) << out_report.ToString();
  const ComparisonReport lse_report = CompareLse(arena.Get(decode.lse, kTokens * heads), *expected);
  EXPECT_TRUE(lse_report.ok()) << lse_report.ToString();
  const ComparisonReport fp8_report =
      CompareDecodeOutFp8(arena.Get(fp8.out_e4m3, kTokens * heads * kHeadDim),
                          arena.Get(fp8.out_scales, kTokens * heads * kOutputQuantBlocks), *expected);
  EXPECT_TRUE(fp8_report.ok()) << fp8_report.ToString();
  const ComparisonReport fp8_lse_report =
      CompareLse(arena.Get(fp8.lse, kTokens * heads), *expected);
  EXPECT_TRUE(fp8_lse_report.ok()) << "with the FP8 output: " << fp8_lse_report.ToString();
}

PrologueInputs::PrologueInputs() : rng(42), table(RopeKind::kYarn, 1000) {
  q = rng.Rows(kTokens * kRoomHeads);
  positions = {999, 0, 500};
  swa = MakeInsert(rng, {999, 0, 500}, 1);
  swa.slots = {5, 63, 0};
  compressed = MakeInsert(rng, {0, 128}, 1);
  compressed.slots = {7, 8};
}

absl::Status RunBrokenPrologue(const BackendFactory& make_backend, const PrologueInputs& inputs,
                               const std::function<void(PrologueParams&)>& mutate) {
  absl::StatusOr<std::unique_ptr<ComputeBackend>> made = make_backend();
  if (!made.ok()) return made.status();
  ComputeBackend& backend = **made;
  DeviceArena arena(backend);
  const std::vector<uint16_t> poison(PrologueInputs::kTokens * 256 * kHeadDim, kPoisonBf16);
  PrologueParams params;
  params.num_tokens = PrologueInputs::kTokens;
  params.num_heads = PrologueInputs::kHeads;
  params.padded_heads = PrologueInputs::kHeads;
  params.q = arena.Put(inputs.q);
  params.positions = arena.Put(inputs.positions);
  params.q_out = arena.Put(poison);
  params.rope = arena.PutTable(inputs.table);
  params.swa = PutInsert(arena, inputs.swa);
  params.compressed = PutInsert(arena, inputs.compressed);
  uint16_t* q_out = params.q_out;
  uint8_t* swa_pool = params.swa.pool.base;
  uint8_t* compressed_pool = params.compressed.pool.base;
  mutate(params);
  const absl::Status status = backend.Prologue(params);
  if (!status.ok()) {
    EXPECT_TRUE(arena.Get(q_out, poison.size()) == poison) << "q_out written by: " << status;
    EXPECT_TRUE(arena.Get(swa_pool, inputs.swa.pool.size()) == inputs.swa.pool)
        << "swa pool written by: " << status;
    EXPECT_TRUE(arena.Get(compressed_pool, inputs.compressed.pool.size()) == inputs.compressed.pool)
        << "compressed pool written by: " << status;
  }
  return status;
}

void ExpectPrologueRejected(const BackendFactory& make_backend, const PrologueInputs& inputs,
                            const std::function<void(PrologueParams&)>& mutate,
                            absl::string_view what) {
  const absl::Status status = RunBrokenPrologue(make_backend, inputs, mutate);
  EXPECT_EQ(status.code(), absl::StatusCode::kInvalidArgument) << what << ": " << status;
}

void NoChange(PrologueParams&) {}

void ExpectPrologueRejectsBadHeadCounts(const BackendFactory& make_backend) {
  const PrologueInputs inputs;
  ExpectPrologueRejected(
      make_backend, inputs, [](PrologueParams& p) { p.padded_heads = 12; }, "Hp 12");
  ExpectPrologueRejected(
      make_backend, inputs, [](PrologueParams& p) { p.padded_heads = 256; }, "Hp 256");
  ExpectPrologueRejected(
      make_backend, inputs, [](PrologueParams& p) { p.padded_heads = 8; }, "Hp < H");
  ExpectPrologueRejected(
      make_backend, inputs, [](PrologueParams& p) { p.num_heads = 0; }, "H 0");
  ExpectPrologueRejected(
      make_backend, inputs, [](PrologueParams& p) { p.num_heads = -1; }, "H -1");
  ExpectPrologueRejected(
      make_backend, inputs,
      [](PrologueParams& p) {
        p.num_heads = 129;
        p.padded_heads = 128;
      },
      "H 129");
}

void ExpectPrologueRejectsNullPointersAndNegativeCounts(const BackendFactory& make_backend) {
  const PrologueInputs inputs;
  ExpectPrologueRejected(
      make_backend, inputs, [](PrologueParams& p) { p.q = nullptr; }, "q");
  ExpectPrologueRejected(
      make_backend, inputs, [](PrologueParams& p) { p.positions = nullptr; }, "positions");
  ExpectPrologueRejected(
      make_backend, inputs, [](PrologueParams& p) { p.q_out = nullptr; }, "q_out");
  ExpectPrologueRejected(
      make_backend, inputs, [](PrologueParams& p) { p.rope.data = nullptr; }, "rope");
  ExpectPrologueRejected(
      make_backend, inputs, [](PrologueParams& p) { p.swa.rows = nullptr; }, "swa rows");
  ExpectPrologueRejected(
      make_backend, inputs, [](PrologueParams& p) { p.swa.positions = nullptr; }, "swa positions");
  ExpectPrologueRejected(
      make_backend, inputs, [](PrologueParams& p) { p.swa.slots = nullptr; }, "swa slots");
  ExpectPrologueRejected(
      make_backend, inputs, [](PrologueParams& p) { p.swa.pool.base = nullptr; }, "swa pool");
  ExpectPrologueRejected(
      make_backend, inputs, [](PrologueParams& p) { p.compressed.slots = nullptr; },
      "compressed slots");
  ExpectPrologueRejected(
      make_backend, inputs, [](PrologueParams& p) { p.num_tokens = -1; }, "N -1");
  ExpectPrologueRejected(
      make_backend, inputs, [](PrologueParams& p) { p.swa.num_rows = -1; }, "swa rows -1");
  ExpectPrologueRejected(
      make_backend, inputs, [](PrologueParams& p) { p.compressed.num_rows = -1; },
      "compressed rows -1");
}

DecodeInputsForRejects::DecodeInputsForRejects() : rng(43), table(RopeKind::kPlain, 1000) {
  q = rng.Rows(kTokens * kRoomHeads);
  positions = {999, 3, 0};
  sinks.assign(kRoomHeads, 0.5f);
  for (KeyList* list : {&main, &extra}) {
    list->width = list == &main ? 8 : 4;
    list->num_blocks = 1;
    list->pool = MakePool(rng, 1, 0, table);
    list->indices.resize(kTokens * list->width);
    list->lengths.assign(kTokens, list->width);
    for (int64_t t = 0; t < kTokens; ++t) FillKeyRow(rng, *list, t, list->width, false);
  }
}

absl::Status RunBrokenDecode(const BackendFactory& make_backend,
                             const DecodeInputsForRejects& inputs,
                             const std::function<void(DecodeParams&)>& mutate,
                             DecodeOutputs* outputs) {
  absl::StatusOr<std::unique_ptr<ComputeBackend>> made = make_backend();
  if (!made.ok()) return made.status();
  ComputeBackend& backend = **made;
  DeviceArena arena(backend);
  const int room = DecodeInputsForRejects::kTokens * DecodeInputsForRejects::kRoomHeads;
  const std::vector<uint16_t> out_poison(room * kHeadDim, kPoisonBf16);
  const std::vector<float> lse_poison(room, std::numeric_limits<float>::quiet_NaN());
  DecodeParams params;
  params.num_tokens = DecodeInputsForRejects::kTokens;
  params.num_heads = DecodeInputsForRejects::kHeads;
  params.padded_heads = DecodeInputsForRejects::kHeads;
  params.q = arena.Put(inputs.q);
  params.softmax_scale = 0.0441941738f;
  params.sinks = arena.Put(inputs.sinks);
  params.main = PutKeyList(arena, inputs.main);
  params.extra = PutKeyList(arena, inputs.extra);
  params.derotate = true;
  params.positions = arena.Put(inputs.positions);
  params.rope = arena.PutTable(inputs.table);
  params.out = arena.Put(out_poison);
  params.lse = arena.Put(lse_poison);
  uint16_t* out = params.out;
  float* lse = params.lse;
  uint8_t* main_pool = params.main.pool.base;
  mutate(params);
  const absl::Status status = backend.Decode(params);
  if (!status.ok()) {
    EXPECT_TRUE(arena.Get(out, out_poison.size()) == out_poison) << "out written by: " << status;
    const std::vector<float> lse_after = arena.Get(lse, lse_poison.size());
    EXPECT_EQ(std::memcmp(lse_after.data(), lse_poison.data(), lse_poison.size() * sizeof(float)),
              0)
        << "lse written by: " << status;
    EXPECT_TRUE(arena.Get(main_pool, inputs.main.pool.size()) == inputs.main.pool)
        << "pool written by: " << status;
    return status;
  }
  if (outputs == nullptr) return status;
  if (absl::Status synced = backend.Synchronize(); !synced.ok()) return synced;
  outputs->out = arena.Get(out, out_poison.size());
  outputs->lse = arena.Get(lse, lse_poison.size());
  return status;
}

void ExpectDecodeRejected(const BackendFactory& make_backend, const DecodeInputsForRejects& inputs,
                          const std::function<void(DecodeParams&)>& mutate,
                          absl::string_view what) {
  const absl::Status status = RunBrokenDecode(make_backend, inputs, mutate);
  EXPECT_EQ(status.code(), absl::StatusCode::kInvalidArgument) << what << ": " << status;
}

void NoDecodeChange(DecodeParams&) {}

void ExpectDecodeRejectsBadHeadCounts(const BackendFactory& make_backend) {
  const DecodeInputsForRejects inputs;
  ExpectDecodeRejected(
      make_backend, inputs, [](DecodeParams& p) { p.padded_heads = 12; }, "Hp 12");
  ExpectDecodeRejected(
      make_backend, inputs, [](DecodeParams& p) { p.padded_heads = 8; }, "Hp < H");
  ExpectDecodeRejected(
      make_backend, inputs, [](DecodeParams& p) { p.num_heads = 0; }, "H 0");
  ExpectDecodeRejected(
      make_backend, inputs,
      [](DecodeParams& p) {
        p.num_heads = 129;
        p.padded_heads = 128;
      },
      "H 129");
}

void ExpectDecodeRejectsNullPointersAndNegativeCounts(const BackendFactory& make_backend) {
  const DecodeInputsForRejects inputs;
  ExpectDecodeRejected(
      make_backend, inputs, [](DecodeParams& p) { p.q = nullptr; }, "q");
  ExpectDecodeRejected(
      make_backend, inputs, [](DecodeParams& p) { p.out = nullptr; }, "out");
  // The FP8 output's places lie in out's poisoned buffer (room for both):
  // a rejected decode writes none of it.
  const auto fp8_places = [](DecodeParams& p) {
    p.out_e4m3 = reinterpret_cast<uint8_t*>(p.out);
    p.out_scales = p.out_e4m3 + p.num_tokens * p.num_heads * kFp8RowBytes;
  };
  ExpectDecodeRejected(
      make_backend, inputs, [&](DecodeParams& p) { fp8_places(p); }, "out and the FP8 output");
  ExpectDecodeRejected(
      make_backend, inputs,
      [&](DecodeParams& p) {
        fp8_places(p);
        p.out = nullptr;
        p.out_scales = nullptr;
      },
      "out_e4m3 without out_scales");
  ExpectDecodeRejected(
      make_backend, inputs,
      [&](DecodeParams& p) {
        fp8_places(p);
        p.out = nullptr;
        p.out_e4m3 = nullptr;
      },
      "out_scales without out_e4m3");
  const absl::Status fp8_alone = RunBrokenDecode(make_backend, inputs, [&](DecodeParams& p) {
    fp8_places(p);
    p.out = nullptr;
  });
  EXPECT_TRUE(fp8_alone.ok()) << "the FP8 output alone: " << fp8_alone;
  ExpectDecodeRejected(
      make_backend, inputs, [](DecodeParams& p) { p.main.indices = nullptr; }, "main indices");
  ExpectDecodeRejected(
      make_backend, inputs, [](DecodeParams& p) { p.main.pool.base = nullptr; }, "main pool");
  ExpectDecodeRejected(
      make_backend, inputs, [](DecodeParams& p) { p.extra.indices = nullptr; }, "extra indices");
  ExpectDecodeRejected(
      make_backend, inputs, [](DecodeParams& p) { p.extra.pool.base = nullptr; }, "extra pool");
  ExpectDecodeRejected(
      make_backend, inputs, [](DecodeParams& p) { p.positions = nullptr; }, "derotate positions");
  ExpectDecodeRejected(
      make_backend, inputs, [](DecodeParams& p) { p.rope.data = nullptr; }, "derotate rope");
  ExpectDecodeRejected(
      make_backend, inputs, [](DecodeParams& p) { p.rope.num_positions = 0; },
      "derotate rope without rows");
  ExpectDecodeRejected(
      make_backend, inputs,
      [](DecodeParams& p) { p.extra.width = static_cast<int>(kMaxKeysPerToken) - p.main.width + 1; },
      "one key past kMaxKeysPerToken");
  ExpectDecodeRejected(
      make_backend, inputs, [](DecodeParams& p) { p.main.width = 2147483583; },
      "a width near INT_MAX");
  ExpectDecodeRejected(
      make_backend, inputs, [](DecodeParams& p) { p.num_tokens = -1; }, "N -1");
  ExpectDecodeRejected(
      make_backend, inputs, [](DecodeParams& p) { p.main.width = -1; }, "main width -1");
  ExpectDecodeRejected(
      make_backend, inputs, [](DecodeParams& p) { p.extra.width = -1; }, "extra width -1");
}

void ExpectDecodeRejectsMisalignedOutputs(const BackendFactory& make_backend) {
  const DecodeInputsForRejects inputs;
  // Every place lies inside out's poisoned buffer (room for 129 heads), so
  // a rejected decode can be seen to write none of it.
  const auto shifted = [](void* base, int64_t bytes) {
    return reinterpret_cast<uint8_t*>(base) + bytes;
  };
  ExpectDecodeRejected(
      make_backend, inputs,
      [&](DecodeParams& p) { p.out = reinterpret_cast<uint16_t*>(shifted(p.out, 2)); },
      "out 2 bytes past a word");
  const auto fp8_at = [&](DecodeParams& p, int64_t e4m3_shift, int64_t scales_shift) {
    uint8_t* base = reinterpret_cast<uint8_t*>(p.out);
    p.out = nullptr;
    p.out_e4m3 = shifted(base, e4m3_shift);
    p.out_scales = shifted(base, 16 + p.num_tokens * p.num_heads * kFp8RowBytes + scales_shift);
  };
  ExpectDecodeRejected(
      make_backend, inputs, [&](DecodeParams& p) { fp8_at(p, 4, 0); }, "out_e4m3 at 4 of 16");
  ExpectDecodeRejected(
      make_backend, inputs, [&](DecodeParams& p) { fp8_at(p, 1, 0); }, "out_e4m3 at 1 of 16");
  ExpectDecodeRejected(
      make_backend, inputs, [&](DecodeParams& p) { fp8_at(p, 16, 2); }, "out_scales at 2 of 4");
  ExpectDecodeRejected(
      make_backend, inputs,
      [&](DecodeParams& p) { p.lse = reinterpret_cast<float*>(shifted(p.lse, 2)); },
      "lse 2 bytes past a word");
  // The alignments asked for themselves are accepted.
  const absl::Status fp8_aligned =
      RunBrokenDecode(make_backend, inputs, [&](DecodeParams& p) { fp8_at(p, 16, 4); });
  EXPECT_TRUE(fp8_aligned.ok()) << "out_e4m3 at 16, out_scales at 4: " << fp8_aligned;
  const absl::Status word = RunBrokenDecode(make_backend, inputs, [&](DecodeParams& p) {
    p.out = reinterpret_cast<uint16_t*>(shifted(p.out, 4));
  });
  EXPECT_TRUE(word.ok()) << "out 4 bytes in: " << word;
}

void ExpectDecodeIgnoresEntriesPastTheLength(const BackendFactory& make_backend) {
  // Entries past a token's length that are not slots at all (-2, 2^30):
  // the decode must neither read them nor let them change its result, which
  // must be the result with those entries -1.
  DecodeInputsForRejects junk;
  junk.main.lengths[0] = 2;
  junk.extra.lengths[2] = 0;
  DecodeInputsForRejects skipped = junk;
  junk.main.indices[2] = -2;
  junk.extra.indices[2 * junk.extra.width] = 1 << 30;
  skipped.main.indices[2] = -1;
  skipped.extra.indices[2 * skipped.extra.width] = -1;
  DecodeOutputs with_junk, with_skipped;
  const absl::Status status = RunBrokenDecode(make_backend, junk, NoDecodeChange, &with_junk);
  ASSERT_TRUE(status.ok()) << status;
  ASSERT_TRUE(RunBrokenDecode(make_backend, skipped, NoDecodeChange, &with_skipped).ok());
  EXPECT_TRUE(with_junk.out == with_skipped.out) << "out differs with entries past the length";
  EXPECT_EQ(std::memcmp(with_junk.lse.data(), with_skipped.lse.data(),
                        with_junk.lse.size() * sizeof(float)),
            0)
      << "lse differs with entries past the length";
  // And the decode wrote every real head of every token.
  for (int64_t t = 0; t < DecodeInputsForRejects::kTokens; ++t) {
    for (int h = 0; h < DecodeInputsForRejects::kHeads; ++h) {
      const int64_t row = t * DecodeInputsForRejects::kHeads + h;
      ASSERT_FALSE(std::isnan(with_junk.lse[row])) << "lse of token " << t << " head " << h;
    }
  }
}

}  // namespace backend_test
}  // namespace mla

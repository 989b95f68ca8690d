#include "client/loadtest/verifier.h"

#include <algorithm>
#include <cmath>
#include <map>

#include "absl/strings/str_cat.h"
#include "kernels/cache_format.h"
#include "kernels/geometry.h"
#include "kernels/head_padding.h"
#include "kernels/reference/tolerance.h"

namespace mla::loadtest {
namespace {

// Rows to insert into the local pool: their bf16 values, RoPE positions and slots.
struct Inserts {
  std::vector<uint16_t> rows;
  std::vector<int32_t> positions;
  std::vector<int32_t> slots;

  void Add(const uint16_t* row, int32_t position, int32_t slot) {
    rows.insert(rows.end(), row, row + kHeadDim);
    positions.push_back(position);
    slots.push_back(slot);
  }
};

}  // namespace

Verifier::Verifier(const Workload& workload, int cpu_threads)
    : workload_(workload), backend_(cpu_threads) {}

const RopeTable& Verifier::Table(RopeKind kind, int32_t position) {
  std::unique_ptr<RopeTable>& table = kind == RopeKind::kYarn ? yarn_ : plain_;
  if (table == nullptr || table->num_positions() <= position) {
    int64_t size = 4096;
    while (size <= position) size *= 2;
    table = std::make_unique<RopeTable>(kind, size);
  }
  return *table;
}

absl::StatusOr<int> Verifier::PaddedHeads(const SentToken& token) const {
  const ModelProfile& model = workload_.model();
  if (token.layer < 0 || token.layer >= model.num_attention_layers()) {
    return absl::InvalidArgumentError(
        absl::StrCat("layer ", token.layer, " is not a layer of ", model.name));
  }
  absl::StatusOr<int> padded = PaddedHeadCount(token.heads);
  if (!padded.ok()) return padded.status();
  if (token.q.size() != static_cast<size_t>(token.heads) * kHeadDim) {
    return absl::InvalidArgumentError("the query is not [H, 512]");
  }
  return padded;
}

absl::StatusOr<LocalAnswer> Verifier::Recompute(const SentToken& token) {
  absl::StatusOr<int> padded = PaddedHeads(token);
  if (!padded.ok()) return padded.status();
  const ModelProfile& model = workload_.model();
  const RopeTable& table = Table(model.rope_kind(token.layer), token.position);

  std::vector<uint16_t> q_out(static_cast<size_t>(*padded) * kHeadDim, 0xffff);
  PrologueParams prologue;
  prologue.num_tokens = 1;
  prologue.num_heads = token.heads;
  prologue.padded_heads = *padded;
  prologue.q = token.q.data();
  prologue.positions = &token.position;
  prologue.q_out = q_out.data();
  prologue.rms_norm_eps = model.rms_norm_eps;
  prologue.rope = {table.data(), table.num_positions()};
  if (absl::Status status = backend_.Prologue(prologue); !status.ok()) return status;
  return RecomputeWith(token, q_out);
}

absl::StatusOr<LocalAnswer> Verifier::RecomputeWith(const SentToken& token,
                                                    absl::Span<const uint16_t> q_out) {
  absl::StatusOr<int> padded = PaddedHeads(token);
  if (!padded.ok()) return padded.status();
  if (q_out.size() != static_cast<size_t>(*padded) * kHeadDim) {
    return absl::InvalidArgumentError(absl::StrCat("q_out is not [", *padded, ", 512]"));
  }
  const ModelProfile& model = workload_.model();
  const int32_t p = token.position;
  const int ratio = model.compress_ratio(token.layer);
  const RopeTable& table = Table(model.rope_kind(token.layer), p);
  const RopeTableView rope{table.data(), table.num_positions()};

  // The keys, in the server's order: SWA rows of the window ascending, then
  // the compressed rows (C4A: the top-k as sent, -1 kept; C128A: every row).
  Inserts inserts;
  const int32_t first = std::max(0, p - kSwaWindow + 1);
  std::vector<int32_t> main_indices(kSwaWindow, -1);
  for (int32_t w = first; w <= p; ++w) {
    main_indices[w - first] = static_cast<int32_t>(inserts.slots.size());
    inserts.Add(workload_.SwaRow(token.salt, token.layer, w), w, main_indices[w - first]);
  }
  const int32_t main_length = p - first + 1;
  std::vector<int32_t> extra_indices;
  std::map<int32_t, int32_t> compressed_slots;  // row -> slot
  auto compressed_slot = [&](int32_t row) {
    auto [it, fresh] = compressed_slots.emplace(row, static_cast<int32_t>(inserts.slots.size()));
    if (fresh)
      inserts.Add(workload_.CompressedRow(token.salt, token.layer, row), row * ratio, it->second);
    return it->second;
  };
  if (ratio == 4) {
    for (int32_t row : token.topk) extra_indices.push_back(row < 0 ? -1 : compressed_slot(row));
  } else if (ratio == 128) {
    for (int32_t j = 0; j < (p + 1) / 128; ++j) extra_indices.push_back(compressed_slot(j));
  }
  const int32_t extra_length = static_cast<int32_t>(extra_indices.size());

  const int64_t blocks =
      (static_cast<int64_t>(inserts.slots.size()) + kBlockTokens - 1) / kBlockTokens;
  std::vector<uint8_t> pool(static_cast<size_t>(blocks) * kBlockBytes, 0);
  const CachePoolView pool_view{pool.data(), blocks};

  PrologueParams insert;
  insert.num_heads = *padded;
  insert.padded_heads = *padded;
  insert.rope = rope;
  insert.swa = {static_cast<int64_t>(inserts.slots.size()), inserts.rows.data(),
                inserts.positions.data(), inserts.slots.data(), pool_view};
  if (absl::Status status = backend_.Prologue(insert); !status.ok()) return status;

  std::vector<float> sinks;
  for (int h = 0; h < token.heads; ++h)
    sinks.push_back(workload_.Sink(token.salt, token.layer, token.head_offset + h));

  LocalAnswer answer;
  answer.q_out.assign(q_out.begin(), q_out.end());
  answer.lse.assign(token.heads, std::nanf(""));
  DecodeParams decode;
  decode.num_tokens = 1;
  decode.num_heads = token.heads;
  decode.padded_heads = *padded;
  decode.q = answer.q_out.data();
  decode.softmax_scale = model.softmax_scale;
  decode.sinks = sinks.data();
  decode.main = {kSwaWindow, main_indices.data(), &main_length, pool_view};
  decode.extra = {extra_length, extra_length > 0 ? extra_indices.data() : nullptr,
                  extra_length > 0 ? &extra_length : nullptr, pool_view};
  decode.derotate = token.derotate;
  decode.positions = &p;
  decode.rope = rope;
  if (token.fp8_output) {
    answer.e4m3.assign(static_cast<size_t>(token.heads) * kFp8RowBytes, 0x7f);
    answer.scales.assign(static_cast<size_t>(token.heads) * kFp8ScaleRowBytes, 0xff);
    decode.out_e4m3 = answer.e4m3.data();
    decode.out_scales = answer.scales.data();
  } else {
    answer.out.assign(static_cast<size_t>(token.heads) * kHeadDim, 0xffff);
    decode.out = answer.out.data();
  }
  decode.lse = answer.lse.data();
  if (absl::Status status = backend_.Decode(decode); !status.ok()) return status;

  // The server's q_out is its own, not this one: the composition clause of
  // spec section 7 widens the check where the float64 q_out lies at a bf16
  // rounding tie (only this side is known).
  absl::StatusOr<reference::QueryReference> query = reference::ReferenceQuery(
      token.q, absl::MakeConstSpan(&p, 1), token.heads, *padded, model.rms_norm_eps, table);
  if (!query.ok()) return query.status();
  const std::vector<double> q_slack = reference::TieQuerySlack(*query);

  reference::DecodeInputs inputs;
  inputs.num_tokens = 1;
  inputs.num_heads = token.heads;
  inputs.padded_heads = *padded;
  inputs.q = answer.q_out;
  inputs.softmax_scale = 1.0 / std::sqrt(static_cast<double>(kHeadDim));
  inputs.sinks = sinks;
  inputs.main = {kSwaWindow, main_indices, absl::MakeConstSpan(&main_length, 1), pool};
  inputs.extra = {extra_length, extra_indices, absl::MakeConstSpan(&extra_length, 1), pool};
  inputs.derotate = token.derotate;
  inputs.positions = absl::MakeConstSpan(&p, 1);
  inputs.rope = &table;
  inputs.q_slack = q_slack;
  absl::StatusOr<reference::DecodeReference> ref = reference::ReferenceDecode(inputs);
  if (!ref.ok()) return ref.status();
  answer.reference = *std::move(ref);
  return answer;
}

TokenVerdict Verifier::Verdict(const reference::ComparisonReport& out_report,
                               absl::Span<const float> lse, const LocalAnswer& local,
                               bool bit_identical) {
  TokenVerdict verdict;
  verdict.ok = out_report.ok();
  verdict.max_excess = out_report.max_excess();
  if (!out_report.ok()) verdict.failure = out_report.ToString();
  if (!lse.empty()) {
    const reference::ComparisonReport lse_report = reference::CompareLse(lse, local.reference);
    verdict.max_excess = std::max(verdict.max_excess, lse_report.max_excess());
    if (!lse_report.ok()) {
      verdict.ok = false;
      absl::StrAppend(&verdict.failure, verdict.failure.empty() ? "" : "; ", lse_report.ToString());
    }
  }
  verdict.bit_identical = bit_identical;
  return verdict;
}

absl::StatusOr<TokenVerdict> Verifier::Check(const SentToken& token, absl::Span<const uint16_t> out,
                                             absl::Span<const float> lse) {
  absl::StatusOr<LocalAnswer> local = Recompute(token);
  if (!local.ok()) return local.status();
  return Verdict(reference::CompareDecodeOut(out, local->reference), lse, *local,
                 std::equal(out.begin(), out.end(), local->out.begin(), local->out.end()));
}

absl::StatusOr<TokenVerdict> Verifier::CheckFp8(const SentToken& token,
                                                absl::Span<const uint8_t> e4m3,
                                                absl::Span<const uint8_t> scales,
                                                absl::Span<const float> lse) {
  if (!token.fp8_output) {
    return absl::InvalidArgumentError("CheckFp8 of a token that did not ask for the FP8 output");
  }
  absl::StatusOr<LocalAnswer> local = Recompute(token);
  if (!local.ok()) return local.status();
  return Verdict(reference::CompareDecodeOutFp8(e4m3, scales, local->reference), lse, *local,
                 std::equal(e4m3.begin(), e4m3.end(), local->e4m3.begin(), local->e4m3.end()) &&
                     std::equal(scales.begin(), scales.end(), local->scales.begin(),
                                local->scales.end()));
}

}  // namespace mla::loadtest

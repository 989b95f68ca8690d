#include "server/engine/attend_plan.h"

#include <algorithm>
#include <map>
#include <string>

#include "absl/strings/str_cat.h"
#include "kernels/geometry.h"

namespace mla {
namespace {

// An AttendResponse's bytes besides out and lse: request id, tensor headers,
// timing and status, well below this.
constexpr int64_t kAnswerFramingBytes = 1024;

// Whether segment `s` writes its rows (it continues the session layer at
// its next position) or repeats the last step (another rank wrote them).
absl::StatusOr<bool> Inserts(const wire::SegmentView& segment, size_t s, int32_t layer,
                             const LayerKv& state) {
  if (segment.position == state.next_position) return true;
  if (segment.position + segment.num_tokens == state.next_position) return false;
  return absl::FailedPreconditionError(absl::StrCat(
      "segments[", s, "].position: layer ", layer, " of session ",
      EchoClientText(segment.session_id), " expects position ", state.next_position, " next (or ",
      state.next_position - segment.num_tokens, " from a rank repeating the last step), got ",
      segment.position));
}

// The compressed rows segment `s` brings: exactly the missing ones when it
// inserts, at most the last ones when it repeats a step.
absl::Status CheckCompressedRows(const wire::SegmentView& segment, size_t s, int32_t layer,
                                 int ratio, bool insert, int32_t rows_now, int32_t rows_after) {
  // Formatted only for an error: this runs for every segment of every message.
  const auto field = [s] { return absl::StrCat("segments[", s, "]"); };
  const int32_t end = segment.position + segment.num_tokens;
  if (ratio == 0 && segment.num_compressed_rows != 0) {
    return absl::InvalidArgumentError(absl::StrCat(
        field(), ".num_compressed_rows: layer ", layer, " is SWA-only and has none"));
  }
  // Both counts are non-negative here, so the differences cannot
  // overflow; first_compressed_row matters only when rows come.
  if (ratio != 0 && insert &&
      (segment.num_compressed_rows != rows_after - rows_now ||
       (segment.num_compressed_rows > 0 && segment.first_compressed_row != rows_now))) {
    return absl::InvalidArgumentError(absl::StrCat(
        field(), ".first_compressed_row/num_compressed_rows: after position ", end - 1, " layer ",
        layer, " (compress ratio ", ratio, ") has ", rows_after, " compressed rows and ",
        rows_now, " exist, so the message must bring rows ", rows_now, "..", rows_after - 1,
        "; it brings ", segment.num_compressed_rows, " from row ",
        segment.first_compressed_row));
  }
  if (ratio != 0 && !insert && segment.num_compressed_rows != 0 &&
      segment.first_compressed_row != rows_after - segment.num_compressed_rows) {
    return absl::InvalidArgumentError(absl::StrCat(
        field(), ".first_compressed_row: a repeated step may resend rows only up to row ",
        rows_after - 1));
  }
  return absl::OkStatus();
}

// The regions an answer goes into hold exactly its out ([T, H, 512] bf16,
// or e4m3fn and then its out_scales, [T, H, 4] UE8M0) and, when asked, its
// lse ([T, H] f32). T and H are bounded here (tokens by the message limit,
// heads by the model), so the products fit.
absl::Status CheckAnswerRegions(const wire::AttendRequestView& input, const AttendPlan& plan) {
  const int64_t values = plan.num_tokens * plan.num_heads;
  const auto check = [&](const char* field, const RegionSlice& slice, int64_t bytes,
                         const char* tensor) -> absl::Status {
    if (slice.bytes == bytes) return absl::OkStatus();
    return absl::InvalidArgumentError(absl::StrCat(
        field, ".byte_size: the answer's ", tensor, " is ", bytes, " bytes (T = ",
        plan.num_tokens, ", H = ", plan.num_heads, "); the reference names ", slice.bytes,
        ": name exactly ", bytes));
  };
  const absl::Status out =
      input.fp8_output
          ? check("out_region", plan.answer_regions->out, values * kFp8RowBytes,
                  "out [T, H, 512] e4m3fn")
          : check("out_region", plan.answer_regions->out, values * kRowBytes,
                  "out [T, H, 512] bf16");
  if (!out.ok()) return out;
  if (input.fp8_output) {
    if (absl::Status status = check("out_scales_region", plan.answer_regions->scales,
                                    values * kFp8ScaleRowBytes, "out_scales [T, H, 4] UE8M0");
        !status.ok()) {
      return status;
    }
  }
  if (!input.return_lse) return absl::OkStatus();
  return check("lse_region", plan.answer_regions->lse, values * 4, "lse [T, H] f32");
}

// Per segment: does it insert, and how many compressed rows follow its step.
// Defers the plan, and stops, at a session layer this wave writes already.
absl::Status CheckPositions(const wire::AttendRequestView& input, const WrittenLayers& written,
                            AttendPlan& plan) {
  const int ratio = plan.profile->compress_ratio(input.layer);
  for (size_t s = 0; s < input.segments.size(); ++s) {
    const wire::SegmentView& segment = input.segments[s];
    const LayerKv& state = plan.sessions[s]->layers[input.layer];
    if (written.contains(SessionLayer{plan.sessions[s], input.layer})) {
      plan.defer = true;
      return absl::OkStatus();
    }
    absl::StatusOr<bool> insert = Inserts(segment, s, input.layer, state);
    if (!insert.ok()) return insert.status();
    const int32_t end = segment.position + segment.num_tokens;
    const int32_t rows_after = ratio == 0 ? 0 : end / ratio;
    if (absl::Status status = CheckCompressedRows(segment, s, input.layer, ratio, *insert,
                                                  state.compressed_rows, rows_after);
        !status.ok()) {
      return status;
    }
    plan.inserts.push_back(*insert);
    plan.rows_after.push_back(rows_after);
  }
  return absl::OkStatus();
}

// kv when any segment inserts (or the message sends it anyway), and
// compressed_kv holding every segment's compressed rows.
absl::Status CheckRowTensors(const wire::AttendRequestView& input, const AttendPlan& plan) {
  const bool any_insert = std::find(plan.inserts.begin(), plan.inserts.end(), true) !=
                          plan.inserts.end();
  if (any_insert || input.kv.has_value()) {
    if (absl::Status status =
            wire::CheckTensor(input.kv, "kv", wire::DType::kBf16, {plan.num_tokens, kHeadDim});
        !status.ok()) {
      return status;
    }
  }
  int64_t compressed_rows = 0;
  for (const wire::SegmentView& segment : input.segments) {
    compressed_rows += segment.num_compressed_rows;
  }
  if (compressed_rows > 0 || input.compressed_kv.has_value()) {
    return wire::CheckTensor(input.compressed_kv, "compressed_kv", wire::DType::kBf16,
                             {compressed_rows, kHeadDim});
  }
  return absl::OkStatus();
}

// Row t of a [T, width] int32 tensor: in the message's memory when the
// tensor is one aligned piece (the usual case), else copied into `scratch`
// (width entries).
const int32_t* Int32Row(const wire::TensorView& tensor, int64_t t, int64_t width,
                        int32_t* scratch) {
  const int64_t at = t * width * 4;
  if (tensor.pieces.size() == 1 && reinterpret_cast<uintptr_t>(tensor.pieces[0].data()) % 4 == 0) {
    return reinterpret_cast<const int32_t*>(tensor.pieces[0].data() + at);
  }
  tensor.CopyRange(at, width * 4, scratch);
  return scratch;
}

// Top-k entries a message must have before its check is spread over the
// host threads (a thread's wake-up costs more than checking fewer).
constexpr int64_t kParallelTopkEntries = int64_t{1} << 16;

// Every top-k entry is -1 or a compressed row that exists at its token's
// position. Read where the message holds it (the launcher copies it once,
// into the staging); a large top-k in token ranges on the host threads. The
// error names the first bad entry in token order, however it was split.
absl::Status CheckTopkRows(const wire::AttendRequestView& input, const AttendPlan& plan,
                           ThreadPool& threads) {
  const int ratio = plan.profile->compress_ratio(input.layer);
  const int64_t width = plan.topk_width;
  const int64_t tokens = plan.num_tokens;
  std::vector<int32_t> position(tokens);
  std::vector<int32_t> segment_of(tokens);
  int64_t t = 0;
  for (size_t s = 0; s < input.segments.size(); ++s) {
    for (int32_t i = 0; i < input.segments[s].num_tokens; ++i, ++t) {
      position[t] = input.segments[s].position + i;
      segment_of[t] = static_cast<int32_t>(s);
    }
  }
  // The first token in [begin, end) with an entry out of range, or -1.
  const auto first_bad = [&](int64_t begin, int64_t end) -> int64_t {
    std::vector<int32_t> scratch(width);
    for (int64_t t = begin; t < end; ++t) {
      const int32_t* row_of = Int32Row(*input.topk, t, width, scratch.data());
      // -1..rows-1 are the unsigned values 0..rows of row + 1: one
      // branchless comparison an entry (a loop that vectorises).
      const uint32_t limit = static_cast<uint32_t>((position[t] + 1) / ratio) + 1u;
      bool bad = false;
      for (int64_t k = 0; k < width; ++k) bad |= static_cast<uint32_t>(row_of[k]) + 1u >= limit;
      if (bad) return t;
    }
    return -1;
  };
  int64_t bad = -1;
  const int64_t ranges = tokens * width >= kParallelTopkEntries
                             ? std::min<int64_t>(threads.num_threads(), tokens)
                             : 1;
  if (ranges <= 1) {
    bad = first_bad(0, tokens);
  } else {
    std::vector<int64_t> found(ranges, -1);
    const int64_t per = (tokens + ranges - 1) / ranges;
    threads.ParallelFor(ranges, [&](int64_t r) {
      found[r] = first_bad(std::min(tokens, r * per), std::min(tokens, (r + 1) * per));
    });
    for (int64_t f : found) {
      if (f >= 0) {
        bad = f;
        break;
      }
    }
  }
  if (bad < 0) return absl::OkStatus();
  std::vector<int32_t> scratch(width);
  const int32_t* row_of = Int32Row(*input.topk, bad, width, scratch.data());
  const int32_t rows = (position[bad] + 1) / ratio;
  int64_t k = 0;
  while (row_of[k] >= -1 && row_of[k] < rows) ++k;
  return absl::InvalidArgumentError(absl::StrCat(
      "topk[", bad, "][", k, "]: ", row_of[k], " is not -1 and not a compressed row of ",
      "session ", EchoClientText(input.segments[segment_of[bad]].session_id), " at position ",
      position[bad], " (rows 0..", rows - 1, " exist)"));
}

// A C4A layer's queries attend the message's top-k; no other layer takes one.
absl::Status CheckTopk(const wire::AttendRequestView& input, AttendPlan& plan,
                       ThreadPool& threads) {
  const ModelProfile& profile = *plan.profile;
  const LayerKind kind = profile.layer_kind(input.layer);
  if (!input.topk.has_value() && kind == LayerKind::kC4A) {
    return absl::InvalidArgumentError(absl::StrCat(
        "topk: layer ", input.layer, " is C4A; its queries attend the indexer's top-k "
        "compressed rows, so the message must carry them ([T, K] int32, -1 pads)"));
  }
  if (!input.topk.has_value()) return absl::OkStatus();
  if (kind != LayerKind::kC4A) {
    return absl::InvalidArgumentError(absl::StrCat(
        "topk: layer ", input.layer, " is ", LayerKindName(kind),
        "; only C4A layers take the indexer's top-k (the server lists C128A rows itself)"));
  }
  if (absl::Status status =
          wire::CheckTensor(input.topk, "topk", wire::DType::kI32, {plan.num_tokens, -1});
      !status.ok()) {
    return status;
  }
  const int64_t width = input.topk->shape[1];
  if (width < 1 || width > profile.indexer_topk) {
    return absl::InvalidArgumentError(absl::StrCat("topk: width ", width, " is outside 1..",
                                                   profile.indexer_topk, " for ", profile.name));
  }
  plan.topk_width = static_cast<int>(width);
  return CheckTopkRows(input, plan, threads);
}

}  // namespace

absl::StatusOr<AttendPlan> AttendPlanner::Plan(const ReceivedAttend& received,
                                               WrittenLayers& written) {
  const wire::AttendRequestView& input = received.request;
  AttendPlan plan;
  plan.input = &input;
  if (received.answer_regions.has_value()) plan.answer_regions = &*received.answer_regions;
  if (absl::Status status = CheckSegments(input, plan); !status.ok()) return status;
  if (absl::Status status = CheckHeadsAndSize(input, plan); !status.ok()) return status;
  if (absl::Status status = wire::CheckTensor(input.q, "q", wire::DType::kBf16,
                                              {plan.num_tokens, plan.num_heads, kHeadDim});
      !status.ok()) {
    return status;
  }
  if (absl::Status status = CheckPositions(input, written, plan); !status.ok()) return status;
  if (plan.defer) return plan;
  if (absl::Status status = CheckRowTensors(input, plan); !status.ok()) return status;
  if (absl::Status status = CheckTopk(input, plan, threads_); !status.ok()) return status;
  // Last: take the pages the new compressed rows need, so that a message
  // that fails takes nothing.
  for (size_t s = 0; s < input.segments.size(); ++s) {
    if (plan.inserts[s]) plan.pages.Need(plan.sessions[s]->layers[input.layer], plan.rows_after[s]);
  }
  if (received.admit_pages && plan.pages.missing() > 0) {
    if (absl::Status status = received.admit_pages(
            plan.pages.missing(), [&] { return sessions_.List(received.arrival); });
        !status.ok()) {
      return status;
    }
  }
  if (absl::Status status = plan.pages.Take(pool_); !status.ok()) return status;
  for (size_t s = 0; s < input.segments.size(); ++s) {
    if (plan.inserts[s]) written.insert(SessionLayer{plan.sessions[s], input.layer});
  }
  return plan;
}

// Each segment names a session of this server, once; all of one model and
// head count; token counts and positions within bounds.
absl::Status AttendPlanner::CheckSegments(const wire::AttendRequestView& input, AttendPlan& plan) {
  if (input.segments.empty()) {
    return absl::InvalidArgumentError("segments: a message needs at least one segment of tokens");
  }
  absl::flat_hash_set<const Session*> seen;
  seen.reserve(input.segments.size());
  plan.sessions.reserve(input.segments.size());
  plan.inserts.reserve(input.segments.size());
  plan.rows_after.reserve(input.segments.size());
  for (size_t s = 0; s < input.segments.size(); ++s) {
    const wire::SegmentView& segment = input.segments[s];
    absl::StatusOr<Session*> session = sessions_.Find(segment.session_id);
    if (!session.ok()) return InSegment(s, session.status());
    if (!seen.insert(*session).second) {
      return absl::InvalidArgumentError(absl::StrCat(
          "segments[", s, "]: session ", EchoClientText(segment.session_id),
          " appears twice in one message; send its tokens as one segment"));
    }
    if (s == 0) {
      plan.profile = (*session)->profile;
      plan.num_heads = (*session)->num_heads;
      plan.padded_heads = (*session)->padded_heads;
    } else if ((*session)->profile != plan.profile || (*session)->num_heads != plan.num_heads) {
      return absl::InvalidArgumentError(absl::StrCat(
          "segments[", s, "]: every session of a message must have the same model and head "
          "count; send sessions of other models or head counts in their own messages"));
    }
    if (segment.first_compressed_row < 0 || segment.num_compressed_rows < 0) {
      return absl::InvalidArgumentError(absl::StrCat(
          "segments[", s, "].first_compressed_row/num_compressed_rows: must not be negative (got ",
          segment.first_compressed_row, ", ", segment.num_compressed_rows, ")"));
    }
    if (segment.num_tokens < 1 || segment.num_tokens > kMaxSegmentTokens) {
      return absl::InvalidArgumentError(absl::StrCat("segments[", s, "].num_tokens: ",
                                                     segment.num_tokens, " is outside 1..",
                                                     kMaxSegmentTokens));
    }
    if (segment.position < 0 ||
        int64_t{segment.position} + segment.num_tokens > limits_.max_position) {
      return absl::InvalidArgumentError(
          absl::StrCat("segments[", s, "].position: positions ", segment.position, "..",
                       int64_t{segment.position} + segment.num_tokens - 1, " must lie in 0..",
                       limits_.max_position - 1, " (the server's --max_position)"));
    }
    plan.sessions.push_back(*session);
    plan.num_tokens += segment.num_tokens;
  }
  return absl::OkStatus();
}

// The message's tokens, layer and heads exist, and its answer fits a message
// (or, answered into regions, exactly those regions).
absl::Status AttendPlanner::CheckHeadsAndSize(const wire::AttendRequestView& input,
                                              const AttendPlan& plan) const {
  const ModelProfile& profile = *plan.profile;
  const int64_t tokens = plan.num_tokens;
  if (tokens > limits_.max_tokens_per_message) {
    return absl::InvalidArgumentError(absl::StrCat("segments: ", tokens,
                                                   " tokens exceed the server's limit of ",
                                                   limits_.max_tokens_per_message,
                                                   " per message; split the message"));
  }
  if (input.layer < 0 || input.layer >= profile.num_attention_layers()) {
    return absl::InvalidArgumentError(absl::StrCat("layer: ", input.layer, " is outside 0..",
                                                   profile.num_attention_layers() - 1, " of ",
                                                   profile.name));
  }
  if (input.head_offset < 0 ||
      int64_t{input.head_offset} + plan.num_heads > profile.num_query_heads) {
    return absl::InvalidArgumentError(absl::StrCat(
        "head_offset: heads ", input.head_offset, "..",
        int64_t{input.head_offset} + plan.num_heads - 1, " are outside the model's ",
        profile.num_query_heads, " query heads"));
  }
  if (plan.answer_regions != nullptr) return CheckAnswerRegions(input, plan);
  const int64_t head_bytes = (input.fp8_output ? kFp8RowBytes + kFp8ScaleRowBytes : kRowBytes) +
                             (input.return_lse ? 4 : 0);
  const int64_t answer_bytes = tokens * plan.num_heads * head_bytes + kAnswerFramingBytes;
  if (limits_.max_answer_bytes > 0 && answer_bytes > limits_.max_answer_bytes) {
    return absl::ResourceExhaustedError(absl::StrCat(
        "the answer to this message would be about ", answer_bytes, " bytes (", tokens,
        " tokens x ", plan.num_heads, " heads), above the server's limit of ",
        limits_.max_answer_bytes, " bytes (--max_message_mb); send fewer tokens a message"));
  }
  return absl::OkStatus();
}

void AttendPlanner::Commit(const AttendPlan& plan, absl::Time now) {
  for (size_t s = 0; s < plan.sessions.size(); ++s) {
    LayerKv& state = plan.sessions[s]->layers[plan.input->layer];
    const wire::SegmentView& segment = plan.input->segments[s];
    state.next_position = std::max(state.next_position, segment.position + segment.num_tokens);
    state.compressed_rows = std::max(state.compressed_rows, plan.rows_after[s]);
    plan.sessions[s]->last_used = now;
  }
}

std::vector<LaunchGroup> GroupForLaunch(absl::Span<const AttendPlan> plans) {
  std::map<LaunchGroupKey, LaunchGroup> groups;
  for (const AttendPlan& plan : plans) {
    const RopeKind rope = plan.profile->rope_kind(plan.input->layer);
    const bool derotate = plan.input->derotate_output;
    const bool fp8_output = plan.input->fp8_output;
    LaunchGroup& group =
        groups[{plan.profile->name, plan.padded_heads, plan.num_heads, rope, derotate, fp8_output}];
    group.num_heads = plan.num_heads;
    group.padded_heads = plan.padded_heads;
    group.rope = rope;
    group.derotate = derotate;
    group.fp8_output = fp8_output;
    group.num_tokens += plan.num_tokens;
    group.plans.push_back(&plan);
  }
  std::vector<LaunchGroup> launches;
  launches.reserve(groups.size());
  for (auto& [key, group] : groups) launches.push_back(std::move(group));
  return launches;
}

}  // namespace mla

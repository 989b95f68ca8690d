#include "server/engine.h"

#include <algorithm>
#include <chrono>
#include <map>
#include <tuple>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "absl/types/span.h"
#include "kernels/geometry.h"
#include "server/packed_arrays.h"
#include "server/page_reservation.h"

namespace mla {
namespace {

// An AttendResponse's bytes besides out and lse: request id, tensor headers,
// timing and status, well below this.
constexpr int64_t kAnswerFramingBytes = 1024;

double MicrosSince(std::chrono::steady_clock::time_point start) {
  return std::chrono::duration<double, std::micro>(std::chrono::steady_clock::now() - start)
      .count();
}

std::string TouchKey(const std::string& session_id, int32_t layer) {
  return absl::StrCat(session_id, "#", layer);
}

}  // namespace

// One Attend message, validated, with what its launch needs to know.
struct Engine::Plan {
  int index = 0;  // in the batch
  const AttendInput* input = nullptr;
  const ModelProfile* profile = nullptr;
  std::vector<Session*> sessions;  // per segment
  std::vector<bool> inserts;       // per segment: write its rows (else another rank did)
  std::vector<int32_t> rows_after;  // per segment: compressed rows after this step
  PageReservation pages;  // given back if its launch fails
  int num_heads = 0;
  int padded_heads = 0;
  int64_t num_tokens = 0;
  int topk_width = 0;
  bool defer = false;  // touches a session layer an earlier message of this wave changed
};

struct Engine::LaunchGroup {
  std::vector<Plan*> plans;
  int num_heads = 0;
  int padded_heads = 0;
  RopeKind rope = RopeKind::kPlain;
  bool derotate = false;
};

absl::StatusOr<std::unique_ptr<Engine>> Engine::Create(std::unique_ptr<ComputeBackend> backend,
                                                       const EngineOptions& options) {
  if (options.models.empty()) return absl::InvalidArgumentError("the engine needs a model");
  if (options.max_position <= 0) {
    return absl::InvalidArgumentError("max_position must be positive");
  }
  absl::StatusOr<KvBlockPool> pool = KvBlockPool::Create(*backend, options.kv_blocks);
  if (!pool.ok()) return pool.status();
  std::unique_ptr<Engine> engine(new Engine(std::move(backend), *std::move(pool), options));
  if (absl::Status status = engine->UploadRopeTables(); !status.ok()) return status;
  return engine;
}

Engine::Engine(std::unique_ptr<ComputeBackend> backend, KvBlockPool pool,
               const EngineOptions& options)
    : backend_(std::move(backend)),
      pool_(std::move(pool)),
      options_(options),
      sessions_(pool_, options.models, options.default_idle_ttl),
      arena_(std::make_unique<DeviceArena>(*backend_)) {}

Engine::~Engine() = default;

absl::Status Engine::Drained(const absl::Status& launched) {
  const absl::Status synced = backend_->Synchronize();
  return launched.ok() ? synced : launched;
}

absl::Status Engine::UploadRopeTables() {
  for (RopeKind kind : {RopeKind::kPlain, RopeKind::kYarn}) {
    const RopeTable table(kind, options_.max_position);
    absl::StatusOr<DeviceBuffer> buffer = backend_->Allocate(table.bytes());
    if (!buffer.ok()) return buffer.status();
    if (absl::Status status = backend_->CopyToDevice(buffer->data(), table.data(), table.bytes());
        !status.ok()) {
      return status;
    }
    rope_tables_[static_cast<int>(kind)] = *std::move(buffer);
  }
  return absl::OkStatus();
}

RopeTableView Engine::rope_view(RopeKind kind) const {
  return {rope_tables_[static_cast<int>(kind)].as<float>(), options_.max_position};
}

absl::StatusOr<CreateSessionResult> Engine::CreateSession(const CreateSessionInput& input,
                                                          absl::Time now) {
  return sessions_.Create(input, now);
}

absl::StatusOr<int64_t> Engine::CloseSession(const std::string& session_id) {
  return sessions_.Close(session_id);
}

std::vector<SessionSummary> Engine::ListSessions(absl::Time now) const {
  return sessions_.List(now);
}

std::vector<std::string> Engine::ExpireIdle(absl::Time now) { return sessions_.ExpireIdle(now); }

absl::StatusOr<AppendResult> Engine::AppendKV(const AppendInput& input, absl::Time now) {
  absl::StatusOr<Session*> found = sessions_.Find(input.session_id);
  if (!found.ok()) return found.status();
  Session& session = **found;
  const ModelProfile& profile = *session.profile;
  const int layers = profile.num_attention_layers();
  const int32_t first = input.first_position;
  const int32_t count = input.num_positions;
  if (count < 1 || first < 0 || int64_t{first} + count > options_.max_position) {
    return absl::InvalidArgumentError(absl::StrCat(
        "num_positions/first_position: positions ", first, "..", int64_t{first} + count - 1,
        " must be non-empty and below the server's max position ", options_.max_position));
  }
  for (int layer = 0; layer < layers; ++layer) {
    if (session.layers[layer].next_position != first) {
      return absl::FailedPreconditionError(absl::StrCat(
          "first_position: layer ", layer, " of session ", session.id, " expects position ",
          session.layers[layer].next_position, " next, not ", first,
          " (AppendKV continues every layer at once)"));
    }
  }
  if (static_cast<int>(input.layers.size()) != layers) {
    return absl::InvalidArgumentError(absl::StrCat("layers: ", profile.name, " needs ", layers,
                                                   " entries (one per attention layer), got ",
                                                   input.layers.size()));
  }
  std::vector<const LayerRowsInput*> by_layer(layers, nullptr);
  PageReservation pages;  // given back if a launch fails
  for (const LayerRowsInput& rows : input.layers) {
    const std::string field = absl::StrCat("layers[layer=", rows.layer, "]");
    if (rows.layer < 0 || rows.layer >= layers || by_layer[rows.layer] != nullptr) {
      return absl::InvalidArgumentError(absl::StrCat(
          field, ": each layer 0..", layers - 1, " must appear exactly once"));
    }
    by_layer[rows.layer] = &rows;
    if (absl::Status status = CheckTensor(rows.swa_kv, field + ".swa_kv", DType::kBf16,
                                          {count, kHeadDim});
        !status.ok()) {
      return status;
    }
    const int ratio = profile.compress_ratio(rows.layer);
    const LayerKv& state = session.layers[rows.layer];
    const int32_t rows_after = ratio == 0 ? 0 : (first + count) / ratio;
    const int32_t expected = rows_after - state.compressed_rows;
    // first_compressed_row matters only when the layer brings rows.
    if (ratio == 0 ? rows.compressed_kv.present && rows.compressed_kv.bytes() > 0
                   : expected > 0 && rows.first_compressed_row != state.compressed_rows) {
      return absl::InvalidArgumentError(absl::StrCat(
          field, ".compressed_kv: ",
          ratio == 0 ? "an SWA-only layer has no compressed rows"
                     : absl::StrCat("rows must continue at row ", state.compressed_rows,
                                    ", not ", rows.first_compressed_row)));
    }
    if (ratio != 0 && (expected > 0 || rows.compressed_kv.present)) {
      if (absl::Status status = CheckTensor(rows.compressed_kv, field + ".compressed_kv",
                                            DType::kBf16, {expected, kHeadDim});
          !status.ok()) {
        return absl::InvalidArgumentError(absl::StrCat(
            status.message(), "; positions up to ", first + count - 1, " at compress ratio ",
            ratio, " make ", rows_after, " rows, of which ", state.compressed_rows,
            " exist"));
      }
    }
    pages.Need(session.layers[rows.layer], rows_after);
  }
  if (absl::Status status = pages.Take(pool_); !status.ok()) return status;

  // Only the last ring's worth of SWA rows can ever be attended again.
  const int32_t swa_from = std::max(first, first + count - kSwaRingRows);
  for (RopeKind rope : {RopeKind::kPlain, RopeKind::kYarn}) {
    std::vector<uint8_t> swa_rows, compressed_rows;
    std::vector<int32_t> swa_positions, swa_slots, compressed_positions, compressed_slots;
    for (int layer = 0; layer < layers; ++layer) {
      if (profile.rope_kind(layer) != rope) continue;
      const LayerRowsInput& rows = *by_layer[layer];
      LayerKv& state = session.layers[layer];
      const int ratio = profile.compress_ratio(layer);
      const int32_t rows_after = ratio == 0 ? 0 : (first + count) / ratio;
      const size_t swa_offset = swa_rows.size();
      swa_rows.resize(swa_offset + (first + count - swa_from) * kRowBytes);
      rows.swa_kv.CopyRange((swa_from - first) * kRowBytes, (first + count - swa_from) * kRowBytes,
                            swa_rows.data() + swa_offset);
      for (int32_t p = swa_from; p < first + count; ++p) {
        swa_positions.push_back(p);
        swa_slots.push_back(state.SwaSlot(p));
      }
      const int32_t new_rows = rows_after - state.compressed_rows;
      if (new_rows > 0) {
        const size_t offset = compressed_rows.size();
        compressed_rows.resize(offset + new_rows * kRowBytes);
        rows.compressed_kv.CopyTo(compressed_rows.data() + offset);
        for (int32_t j = state.compressed_rows; j < rows_after; ++j) {
          compressed_positions.push_back(j * ratio);
          compressed_slots.push_back(state.CompressedSlot(j));
        }
      }
    }
    if (swa_slots.empty() && compressed_slots.empty()) continue;
    PrologueParams params;
    params.num_heads = session.num_heads;
    params.padded_heads = session.padded_heads;
    params.rope = rope_view(rope);
    auto upload_insert = [&](KvInsertParams& insert, const std::vector<uint8_t>& rows,
                             const std::vector<int32_t>& positions,
                             const std::vector<int32_t>& slots, DeviceArena::Slot row_slot,
                             DeviceArena::Slot position_slot,
                             DeviceArena::Slot slot_slot) -> absl::Status {
      insert.num_rows = static_cast<int64_t>(slots.size());
      insert.pool = pool_.view();
      absl::StatusOr<uint8_t*> device_rows = arena_->Upload(row_slot, rows);
      absl::StatusOr<int32_t*> device_positions = arena_->Upload(position_slot, positions);
      absl::StatusOr<int32_t*> device_slots = arena_->Upload(slot_slot, slots);
      for (const absl::Status& status :
           {device_rows.status(), device_positions.status(), device_slots.status()}) {
        if (!status.ok()) return status;
      }
      insert.rows = reinterpret_cast<const uint16_t*>(*device_rows);
      insert.positions = *device_positions;
      insert.slots = *device_slots;
      return absl::OkStatus();
    };
    absl::Status status = upload_insert(params.swa, swa_rows, swa_positions, swa_slots,
                                        DeviceArena::kKv, DeviceArena::kPositions,
                                        DeviceArena::kSwaSlots);
    if (status.ok()) {
      status = upload_insert(params.compressed, compressed_rows, compressed_positions,
                             compressed_slots, DeviceArena::kCompressedRows,
                             DeviceArena::kCompressedPositions, DeviceArena::kCompressedSlots);
    }
    if (status.ok()) status = backend_->Prologue(params);
    status = Drained(status);
    if (!status.ok()) {
      // Nothing written counts (no position advanced); the pages go back.
      pages.ReturnPages(pool_);
      return absl::InternalError(absl::StrCat("AppendKV failed in the backend: ", status.message()));
    }
  }
  for (int layer = 0; layer < layers; ++layer) {
    LayerKv& state = session.layers[layer];
    state.next_position = first + count;
    const int ratio = profile.compress_ratio(layer);
    if (ratio != 0) state.compressed_rows = (first + count) / ratio;
  }
  session.last_used = now;
  return AppendResult{first + count, session.blocks()};
}

absl::StatusOr<Engine::Plan> Engine::PlanAttend(const AttendInput& input,
                                                absl::flat_hash_set<std::string>& touched) {
  Plan plan;
  plan.input = &input;
  if (input.segments.empty()) {
    return absl::InvalidArgumentError("segments: a message needs at least one segment of tokens");
  }
  for (size_t s = 0; s < input.segments.size(); ++s) {
    const SegmentInput& segment = input.segments[s];
    absl::StatusOr<Session*> session = sessions_.Find(segment.session_id);
    if (!session.ok()) {
      return absl::Status(session.status().code(),
                          absl::StrCat("segments[", s, "]: ", session.status().message()));
    }
    for (size_t earlier = 0; earlier < s; ++earlier) {
      if (input.segments[earlier].session_id == segment.session_id) {
        return absl::InvalidArgumentError(absl::StrCat(
            "segments[", s, "]: session ", EchoClientText(segment.session_id),
            " appears twice in one message; send its tokens as one segment"));
      }
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
        int64_t{segment.position} + segment.num_tokens > options_.max_position) {
      return absl::InvalidArgumentError(
          absl::StrCat("segments[", s, "].position: positions ", segment.position, "..",
                       int64_t{segment.position} + segment.num_tokens - 1,
                       " must lie in 0..", options_.max_position - 1,
                       " (the server's --max_position)"));
    }
    plan.sessions.push_back(*session);
    plan.num_tokens += segment.num_tokens;
  }
  const ModelProfile& profile = *plan.profile;
  const int64_t tokens = plan.num_tokens;
  if (tokens > options_.max_tokens_per_message) {
    return absl::InvalidArgumentError(absl::StrCat("segments: ", tokens,
                                                   " tokens exceed the server's limit of ",
                                                   options_.max_tokens_per_message,
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
  const int64_t answer_bytes =
      tokens * plan.num_heads * (kRowBytes + (input.return_lse ? 4 : 0)) + kAnswerFramingBytes;
  if (options_.max_answer_bytes > 0 && answer_bytes > options_.max_answer_bytes) {
    return absl::ResourceExhaustedError(absl::StrCat(
        "the answer to this message would be about ", answer_bytes, " bytes (", tokens,
        " tokens x ", plan.num_heads, " heads), above the server's limit of ",
        options_.max_answer_bytes, " bytes (--max_message_mb); send fewer tokens a message"));
  }
  if (absl::Status status =
          CheckTensor(input.q, "q", DType::kBf16, {tokens, plan.num_heads, kHeadDim});
      !status.ok()) {
    return status;
  }

  const int ratio = profile.compress_ratio(input.layer);
  int64_t compressed_rows = 0;
  bool any_insert = false;
  for (size_t s = 0; s < input.segments.size(); ++s) {
    const SegmentInput& segment = input.segments[s];
    const LayerKv& state = plan.sessions[s]->layers[input.layer];
    const int32_t end = segment.position + segment.num_tokens;
    auto touch = touched.find(TouchKey(segment.session_id, input.layer));
    bool insert;
    if (touch != touched.end()) {
      // An earlier message of this wave writes rows of this session layer.
      // Launch groups run in no particular order, so anything that would
      // read those rows (the next step, or another rank repeating this one)
      // waits for the next wave.
      plan.defer = true;
      return plan;
    } else if (segment.position == state.next_position) {
      insert = true;
    } else if (end == state.next_position) {
      insert = false;  // another rank already wrote these rows
    } else {
      return absl::FailedPreconditionError(absl::StrCat(
          "segments[", s, "].position: layer ", input.layer, " of session ",
          EchoClientText(segment.session_id), " expects position ", state.next_position, " next (or ",
          state.next_position - segment.num_tokens,
          " from a rank repeating the last step), got ", segment.position));
    }
    const int32_t rows_after = ratio == 0 ? 0 : end / ratio;
    const int32_t rows_now = state.compressed_rows;
    const std::string field = absl::StrCat("segments[", s, "]");
    if (ratio == 0 && segment.num_compressed_rows != 0) {
      return absl::InvalidArgumentError(absl::StrCat(
          field, ".num_compressed_rows: layer ", input.layer, " is SWA-only and has none"));
    }
    // Both counts are non-negative here, so the differences cannot
    // overflow; first_compressed_row matters only when rows come.
    if (ratio != 0 && insert &&
        (segment.num_compressed_rows != rows_after - rows_now ||
         (segment.num_compressed_rows > 0 && segment.first_compressed_row != rows_now))) {
      return absl::InvalidArgumentError(absl::StrCat(
          field, ".first_compressed_row/num_compressed_rows: after position ", end - 1,
          " layer ", input.layer, " (compress ratio ", ratio, ") has ", rows_after,
          " compressed rows and ", rows_now, " exist, so the message must bring rows ",
          rows_now, "..", rows_after - 1, "; it brings ", segment.num_compressed_rows,
          " from row ", segment.first_compressed_row));
    }
    if (ratio != 0 && !insert && segment.num_compressed_rows != 0 &&
        segment.first_compressed_row != rows_after - segment.num_compressed_rows) {
      return absl::InvalidArgumentError(absl::StrCat(
          field, ".first_compressed_row: a repeated step may resend rows only up to row ",
          rows_after - 1));
    }
    plan.inserts.push_back(insert);
    plan.rows_after.push_back(rows_after);
    compressed_rows += segment.num_compressed_rows;
    any_insert |= insert;
  }
  if (any_insert || input.kv.present) {
    if (absl::Status status = CheckTensor(input.kv, "kv", DType::kBf16, {tokens, kHeadDim});
        !status.ok()) {
      return status;
    }
  }
  if (compressed_rows > 0 || input.compressed_kv.present) {
    if (absl::Status status = CheckTensor(input.compressed_kv, "compressed_kv", DType::kBf16,
                                          {compressed_rows, kHeadDim});
        !status.ok()) {
      return status;
    }
  }
  if (!input.topk.present && profile.layer_kind(input.layer) == LayerKind::kC4A) {
    return absl::InvalidArgumentError(absl::StrCat(
        "topk: layer ", input.layer, " is C4A; its queries attend the indexer's top-k "
        "compressed rows, so the message must carry them ([T, K] int32, -1 pads)"));
  }
  if (input.topk.present) {
    if (profile.layer_kind(input.layer) != LayerKind::kC4A) {
      return absl::InvalidArgumentError(absl::StrCat(
          "topk: layer ", input.layer, " is ", LayerKindName(profile.layer_kind(input.layer)),
          "; only C4A layers take the indexer's top-k (the server lists C128A rows itself)"));
    }
    if (absl::Status status = CheckTensor(input.topk, "topk", DType::kI32, {tokens, -1});
        !status.ok()) {
      return status;
    }
    const int64_t width = input.topk.shape[1];
    if (width < 1 || width > profile.indexer_topk) {
      return absl::InvalidArgumentError(absl::StrCat("topk: width ", width, " is outside 1..",
                                                     profile.indexer_topk, " for ",
                                                     profile.name));
    }
    plan.topk_width = static_cast<int>(width);
    std::vector<int32_t> topk(tokens * width);
    input.topk.CopyTo(topk.data());
    int64_t t = 0;
    for (const SegmentInput& segment : input.segments) {
      for (int32_t i = 0; i < segment.num_tokens; ++i, ++t) {
        const int32_t rows = (segment.position + i + 1) / ratio;
        for (int64_t k = 0; k < width; ++k) {
          const int32_t row = topk[t * width + k];
          if (row < -1 || row >= rows) {
            return absl::InvalidArgumentError(absl::StrCat(
                "topk[", t, "][", k, "]: ", row, " is not -1 and not a compressed row of ",
                "session ", EchoClientText(segment.session_id), " at position ", segment.position + i,
                " (rows 0..", rows - 1, " exist)"));
          }
        }
      }
    }
  }
  // Last: take the pages the new compressed rows need, so that a message
  // that fails takes nothing.
  for (size_t s = 0; s < input.segments.size(); ++s) {
    if (plan.inserts[s]) plan.pages.Need(plan.sessions[s]->layers[input.layer], plan.rows_after[s]);
  }
  if (absl::Status status = plan.pages.Take(pool_); !status.ok()) return status;
  for (size_t s = 0; s < input.segments.size(); ++s) {
    if (plan.inserts[s]) touched.insert(TouchKey(input.segments[s].session_id, input.layer));
  }
  return plan;
}

std::vector<AttendResult> Engine::Attend(const std::vector<const AttendInput*>& batch,
                                         absl::Time now) {
  std::vector<AttendResult> results(batch.size());
  std::vector<int> pending(batch.size());
  for (size_t i = 0; i < batch.size(); ++i) {
    pending[i] = static_cast<int>(i);
    results[i].request_id = batch[i]->request_id;
    results[i].timing.queue_us = absl::ToDoubleMicroseconds(now - batch[i]->arrival);
  }
  while (!pending.empty()) {
    absl::flat_hash_set<std::string> touched;
    std::vector<Plan> plans;
    plans.reserve(pending.size());
    std::vector<int> deferred;
    for (int index : pending) {
      absl::StatusOr<Plan> plan = PlanAttend(*batch[index], touched);
      if (!plan.ok()) {
        results[index].status = plan.status();
      } else if (plan->defer) {
        deferred.push_back(index);
      } else {
        plan->index = index;
        plans.push_back(*std::move(plan));
      }
    }
    // One launch per model, head counts, RoPE kind and output flags (eps and
    // softmax scale come from the model).
    std::map<std::tuple<std::string, int, int, int, bool>, LaunchGroup> groups;
    for (Plan& plan : plans) {
      const RopeKind rope = plan.profile->rope_kind(plan.input->layer);
      LaunchGroup& group = groups[{plan.profile->name, plan.padded_heads, plan.num_heads,
                                   static_cast<int>(rope), plan.input->derotate_output}];
      group.num_heads = plan.num_heads;
      group.padded_heads = plan.padded_heads;
      group.rope = rope;
      group.derotate = plan.input->derotate_output;
      group.plans.push_back(&plan);
    }
    for (auto& [key, group] : groups) RunGroup(group, results);
    for (Plan& plan : plans) {
      if (!results[plan.index].status.ok()) {
        plan.pages.ReturnPages(pool_);
        continue;
      }
      for (size_t s = 0; s < plan.sessions.size(); ++s) {
        LayerKv& state = plan.sessions[s]->layers[plan.input->layer];
        const SegmentInput& segment = plan.input->segments[s];
        state.next_position =
            std::max(state.next_position, segment.position + segment.num_tokens);
        state.compressed_rows = std::max(state.compressed_rows, plan.rows_after[s]);
        plan.sessions[s]->last_used = now;
      }
    }
    pending = std::move(deferred);
  }
  return results;
}

void Engine::RunGroup(LaunchGroup& group, std::vector<AttendResult>& results) {
  const int heads = group.num_heads;
  const int padded = group.padded_heads;
  int64_t tokens = 0;
  int extra_width = 0;
  bool any_sinks = false;
  int64_t compressed_rows = 0;
  for (const Plan* plan : group.plans) {
    tokens += plan->num_tokens;
    const int ratio = plan->profile->compress_ratio(plan->input->layer);
    if (plan->profile->layer_kind(plan->input->layer) == LayerKind::kC4A) {
      extra_width = std::max(extra_width, plan->topk_width);
    } else if (ratio != 0) {
      for (int32_t rows : plan->rows_after) extra_width = std::max(extra_width, rows);
    }
    for (const Session* session : plan->sessions) any_sinks |= !session->sinks.empty();
    for (size_t s = 0; s < plan->sessions.size(); ++s) {
      if (plan->inserts[s]) compressed_rows += plan->input->segments[s].num_compressed_rows;
    }
  }

  // Host-side arrays of the launch, in token order of the group, in one
  // buffer that goes to the device in one copy.
  PackedArrays packed;
  const auto positions_p = packed.Reserve<int32_t>(tokens, 0);
  const auto swa_slots_p = packed.Reserve<int32_t>(tokens, -1);
  const auto main_indices_p = packed.Reserve<int32_t>(tokens * kSwaWindow, -1);
  const auto main_lengths_p = packed.Reserve<int32_t>(tokens, 0);
  const auto extra_indices_p = packed.Reserve<int32_t>(tokens * extra_width, -1);
  const auto extra_lengths_p = packed.Reserve<int32_t>(tokens, 0);
  const auto sinks_p = packed.Reserve<float>(any_sinks ? tokens * heads : 0, 0.0f);
  const auto compressed_positions_p = packed.Reserve<int32_t>(compressed_rows, 0);
  const auto compressed_slots_p = packed.Reserve<int32_t>(compressed_rows, -1);
  const auto compressed_kv_p = packed.Reserve<uint8_t>(compressed_rows * kRowBytes, 0);
  packed.Allocate();
  absl::Span<int32_t> positions = packed.Array(positions_p);
  absl::Span<int32_t> swa_slots = packed.Array(swa_slots_p);
  absl::Span<int32_t> main_indices = packed.Array(main_indices_p);
  absl::Span<int32_t> main_lengths = packed.Array(main_lengths_p);
  absl::Span<int32_t> extra_indices = packed.Array(extra_indices_p);
  absl::Span<int32_t> extra_lengths = packed.Array(extra_lengths_p);
  absl::Span<float> sinks = packed.Array(sinks_p);
  absl::Span<int32_t> compressed_positions = packed.Array(compressed_positions_p);
  absl::Span<int32_t> compressed_slots = packed.Array(compressed_slots_p);
  absl::Span<uint8_t> compressed_kv = packed.Array(compressed_kv_p);
  // Host staging for a backend without host access: uninitialised (every
  // byte is written below), not zero-filled.
  std::unique_ptr<uint8_t[]> q_host, kv_host;
  const bool host = backend_->host_accessible();

  absl::StatusOr<uint8_t*> q_device = arena_->Reserve(DeviceArena::kQ, tokens * heads * kRowBytes);
  absl::StatusOr<uint8_t*> kv_device = arena_->Reserve(DeviceArena::kKv, tokens * kRowBytes);
  absl::Status status = q_device.ok() ? kv_device.status() : q_device.status();
  if (!host) {
    q_host.reset(new uint8_t[tokens * heads * kRowBytes]);
    kv_host.reset(new uint8_t[tokens * kRowBytes]);
  }
  uint8_t* q_target = host && status.ok() ? *q_device : q_host.get();
  uint8_t* kv_target = host && status.ok() ? *kv_device : kv_host.get();

  int64_t t0 = 0;
  int64_t compressed_offset = 0;
  for (const Plan* plan : group.plans) {
    const AttendInput& input = *plan->input;
    const int32_t layer = input.layer;
    const ModelProfile& profile = *plan->profile;
    const int ratio = profile.compress_ratio(layer);
    const bool c4a = profile.layer_kind(layer) == LayerKind::kC4A;
    if (status.ok()) {
      input.q.CopyTo(q_target + t0 * heads * kRowBytes);
      if (input.kv.present) input.kv.CopyTo(kv_target + t0 * kRowBytes);
    }
    std::vector<int32_t> topk;
    if (c4a && plan->topk_width > 0) {
      topk.resize(plan->num_tokens * plan->topk_width);
      input.topk.CopyTo(topk.data());
    }
    int64_t message_compressed_offset = 0;
    int64_t t = t0;
    for (size_t s = 0; s < input.segments.size(); ++s) {
      const SegmentInput& segment = input.segments[s];
      const Session& session = *plan->sessions[s];
      const LayerKv& state = session.layers[layer];
      if (plan->inserts[s] && segment.num_compressed_rows > 0) {
        input.compressed_kv.CopyRange(message_compressed_offset * kRowBytes,
                                      segment.num_compressed_rows * kRowBytes,
                                      compressed_kv.data() + compressed_offset * kRowBytes);
        for (int32_t i = 0; i < segment.num_compressed_rows; ++i) {
          const int32_t j = segment.first_compressed_row + i;
          compressed_positions[compressed_offset + i] = j * ratio;
          compressed_slots[compressed_offset + i] = state.CompressedSlot(j);
        }
        compressed_offset += segment.num_compressed_rows;
      }
      message_compressed_offset += segment.num_compressed_rows;
      for (int32_t i = 0; i < segment.num_tokens; ++i, ++t) {
        const int32_t p = segment.position + i;
        positions[t] = p;
        if (plan->inserts[s]) swa_slots[t] = state.SwaSlot(p);
        const int32_t first = std::max(0, p - kSwaWindow + 1);
        main_lengths[t] = p - first + 1;
        for (int32_t w = first; w <= p; ++w) main_indices[t * kSwaWindow + (w - first)] = state.SwaSlot(w);
        int32_t* extra = extra_indices.data() + t * extra_width;
        if (c4a) {
          for (int k = 0; k < plan->topk_width; ++k) {
            const int32_t row = topk[(t - t0) * plan->topk_width + k];
            extra[k] = row < 0 ? -1 : state.CompressedSlot(row);
          }
          extra_lengths[t] = plan->topk_width;
        } else if (ratio != 0) {
          // C128A: every compressed row j < (p + 1) / 128.
          const int32_t visible = (p + 1) / ratio;
          for (int32_t j = 0; j < visible; ++j) extra[j] = state.CompressedSlot(j);
          extra_lengths[t] = visible;
        }
        for (int h = 0; h < (any_sinks ? heads : 0); ++h) {
          sinks[t * heads + h] = session.Sink(layer, input.head_offset, h);
        }
      }
    }
    t0 = t;
  }

  // The output lives in host memory shared by the responses of this group;
  // a host-accessible backend writes it in place.
  // Uninitialised: the decode (or the copy back) writes every byte of out and lse.
  std::shared_ptr<uint8_t[]> output(new uint8_t[tokens * heads * (kRowBytes + 4)]);
  uint8_t* out_host = output.get();
  uint8_t* lse_host = out_host + tokens * heads * kRowBytes;

  const auto prologue_start = std::chrono::steady_clock::now();
  PrologueParams prologue;
  DecodeParams decode;
  if (status.ok() && !host) {
    status = backend_->CopyToDevice(*q_device, q_host.get(), tokens * heads * kRowBytes);
    if (status.ok()) status = backend_->CopyToDevice(*kv_device, kv_host.get(), tokens * kRowBytes);
  }
  // The compressed arrays were sized before the loop that fills them.
  if (status.ok() && compressed_offset != compressed_rows) {
    status = absl::InternalError(absl::StrCat("batch holds ", compressed_offset,
                                              " compressed rows, sized for ", compressed_rows));
  }
  uint8_t* arrays = nullptr;
  if (status.ok()) {
    absl::StatusOr<uint8_t*> reserved = arena_->Reserve(DeviceArena::kBatchArrays, packed.bytes());
    status = reserved.status();
    if (status.ok()) status = backend_->CopyToDevice(*reserved, packed.data(), packed.bytes());
    if (status.ok()) arrays = *reserved;
  }
  int32_t* positions_d = PackedArrays::In(arrays, positions_p);
  int32_t* swa_slots_d = PackedArrays::In(arrays, swa_slots_p);
  int32_t* main_indices_d = PackedArrays::In(arrays, main_indices_p);
  int32_t* main_lengths_d = PackedArrays::In(arrays, main_lengths_p);
  int32_t* extra_indices_d = PackedArrays::In(arrays, extra_indices_p);
  int32_t* extra_lengths_d = PackedArrays::In(arrays, extra_lengths_p);
  float* sinks_d = PackedArrays::In(arrays, sinks_p);
  int32_t* compressed_positions_d = PackedArrays::In(arrays, compressed_positions_p);
  int32_t* compressed_slots_d = PackedArrays::In(arrays, compressed_slots_p);
  uint8_t* compressed_kv_d = PackedArrays::In(arrays, compressed_kv_p);
  absl::StatusOr<uint8_t*> q_out = arena_->Reserve(DeviceArena::kQOut, tokens * padded * kRowBytes);
  if (status.ok()) status = q_out.status();
  if (status.ok()) {
    const RopeTableView rope = rope_view(group.rope);
    prologue.num_tokens = tokens;
    prologue.num_heads = heads;
    prologue.padded_heads = padded;
    prologue.q = reinterpret_cast<const uint16_t*>(*q_device);
    prologue.positions = positions_d;
    prologue.q_out = reinterpret_cast<uint16_t*>(*q_out);
    prologue.rms_norm_eps = group.plans.front()->profile->rms_norm_eps;
    prologue.rope = rope;
    prologue.swa = {tokens, reinterpret_cast<const uint16_t*>(*kv_device), positions_d,
                    swa_slots_d, pool_.view()};
    prologue.compressed = {static_cast<int64_t>(compressed_slots.size()),
                           reinterpret_cast<const uint16_t*>(compressed_kv_d),
                           compressed_positions_d, compressed_slots_d, pool_.view()};
    status = Drained(backend_->Prologue(prologue));
  }
  const double prologue_us = MicrosSince(prologue_start);

  const auto decode_start = std::chrono::steady_clock::now();
  if (status.ok()) {
    absl::StatusOr<uint8_t*> out_d = host ? absl::StatusOr<uint8_t*>(out_host)
                                          : arena_->Reserve(DeviceArena::kOut, tokens * heads * kRowBytes);
    absl::StatusOr<uint8_t*> lse_d = host ? absl::StatusOr<uint8_t*>(lse_host)
                                          : arena_->Reserve(DeviceArena::kLse, tokens * heads * 4);
    status = out_d.ok() ? lse_d.status() : out_d.status();
    if (status.ok()) {
      decode.num_tokens = tokens;
      decode.num_heads = heads;
      decode.padded_heads = padded;
      decode.q = reinterpret_cast<const uint16_t*>(*q_out);
      decode.softmax_scale = group.plans.front()->profile->softmax_scale;
      decode.sinks = any_sinks ? sinks_d : nullptr;
      decode.sinks_per_token = any_sinks;
      decode.main = {kSwaWindow, main_indices_d, main_lengths_d, pool_.view()};
      decode.extra = {extra_width, extra_indices_d, extra_lengths_d, pool_.view()};
      decode.derotate = group.derotate;
      decode.positions = positions_d;
      decode.rope = rope_view(group.rope);
      decode.out = reinterpret_cast<uint16_t*>(*out_d);
      decode.lse = reinterpret_cast<float*>(*lse_d);
      status = Drained(backend_->Decode(decode));
      if (status.ok() && !host) {
        status = backend_->CopyToHost(out_host, *out_d, tokens * heads * kRowBytes);
        if (status.ok()) status = backend_->CopyToHost(lse_host, *lse_d, tokens * heads * 4);
      }
    }
  }
  const double decode_us = MicrosSince(decode_start);

  int64_t offset = 0;
  for (const Plan* plan : group.plans) {
    AttendResult& result = results[plan->index];
    result.timing.prologue_us = prologue_us;
    result.timing.decode_us = decode_us;
    result.timing.batch_tokens = static_cast<int32_t>(tokens);
    if (!status.ok()) {
      result.status = absl::InternalError(
          absl::StrCat("the compute backend failed on this batch: ", status.message()));
    } else {
      result.num_tokens = plan->num_tokens;
      result.num_heads = heads;
      result.out = out_host + offset * heads * kRowBytes;
      if (plan->input->return_lse) result.lse = lse_host + offset * heads * 4;
      result.keep_alive = output;
    }
    offset += plan->num_tokens;
  }
}

}  // namespace mla

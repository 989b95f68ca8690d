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

namespace mla {
namespace {

double MicrosSince(std::chrono::steady_clock::time_point start) {
  return std::chrono::duration<double, std::micro>(std::chrono::steady_clock::now() - start)
      .count();
}

}  // namespace

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
      attend_planner_(sessions_, pool_,
               {options.max_position, options.max_tokens_per_message, options.max_answer_bytes}),
      append_planner_(sessions_, pool_, options.max_position),
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
  absl::StatusOr<AppendPlan> plan = append_planner_.Plan(input);
  if (!plan.ok()) return plan.status();
  if (absl::Status status = WriteAppend(*plan); !status.ok()) {
    // Nothing written counts (no position advanced); the pages go back.
    append_planner_.ReturnPages(*plan);
    return absl::InternalError(absl::StrCat("AppendKV failed in the backend: ", status.message()));
  }
  return AppendPlanner::Commit(*plan, now);
}

absl::Status Engine::WriteAppend(const AppendPlan& plan) {
  Session& session = *plan.session;
  const ModelProfile& profile = *session.profile;
  const int layers = profile.num_attention_layers();
  const int32_t first = plan.first;
  const int32_t count = plan.end - plan.first;
  const int32_t swa_from = plan.SwaFrom();
  for (RopeKind rope : {RopeKind::kPlain, RopeKind::kYarn}) {
    std::vector<uint8_t> swa_rows, compressed_rows;
    std::vector<int32_t> swa_positions, swa_slots, compressed_positions, compressed_slots;
    for (int layer = 0; layer < layers; ++layer) {
      if (profile.rope_kind(layer) != rope) continue;
      const LayerRowsInput& rows = *plan.by_layer[layer];
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
    if (!status.ok()) return status;
  }
  return absl::OkStatus();
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
  while (!pending.empty()) pending = RunWave(batch, pending, now, results);
  return results;
}

std::vector<int> Engine::RunWave(const std::vector<const AttendInput*>& batch,
                                 const std::vector<int>& pending, absl::Time now,
                                 std::vector<AttendResult>& results) {
  WrittenLayers written;
  std::vector<AttendPlan> plans;
  plans.reserve(pending.size());
  std::vector<int> deferred;
  for (int index : pending) {
    absl::StatusOr<AttendPlan> plan = attend_planner_.Plan(*batch[index], written);
    if (!plan.ok()) {
      results[index].status = plan.status();
    } else if (plan->defer) {
      deferred.push_back(index);
    } else {
      plan->index = index;
      plans.push_back(*std::move(plan));
    }
  }
  for (const LaunchGroup& group : GroupForLaunch(plans)) RunGroup(group, results);
  for (AttendPlan& plan : plans) {
    if (results[plan.index].status.ok()) {
      AttendPlanner::Commit(plan, now);
    } else {
      attend_planner_.ReturnPages(plan);
    }
  }
  return deferred;
}

void Engine::RunGroup(const LaunchGroup& group, std::vector<AttendResult>& results) {
  const int heads = group.num_heads;
  const int padded = group.padded_heads;
  int64_t tokens = 0;
  int extra_width = 0;
  bool any_sinks = false;
  int64_t compressed_rows = 0;
  for (const AttendPlan* plan : group.plans) {
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
  for (const AttendPlan* plan : group.plans) {
    const AttendInput& input = *plan->input;
    const int32_t layer = input.layer;
    const ModelProfile& profile = *plan->profile;
    const int ratio = profile.compress_ratio(layer);
    const bool c4a = profile.layer_kind(layer) == LayerKind::kC4A;
    if (status.ok()) {
      input.q.CopyTo(q_target + t0 * heads * kRowBytes);
      if (input.kv.present) input.kv.CopyTo(kv_target + t0 * kRowBytes);
    }
    const std::vector<int32_t>& topk = plan->topk;
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
  for (const AttendPlan* plan : group.plans) {
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

#include "server/launcher.h"

#include <algorithm>
#include <chrono>
#include <utility>
#include <vector>

#include "absl/functional/function_ref.h"
#include "absl/types/span.h"
#include "kernels/geometry.h"
#include "kernels/model_profile.h"

namespace mla {
namespace {

// Runs `step`, setting `micros` to the time it took.
absl::Status Timed(double& micros, absl::FunctionRef<absl::Status()> step) {
  const auto start = std::chrono::steady_clock::now();
  absl::Status status = step();
  micros =
      std::chrono::duration<double, std::micro>(std::chrono::steady_clock::now() - start).count();
  return status;
}

// The sizes of one group's launch.
struct GroupShape {
  int64_t tokens = 0;
  int extra_width = 0;          // entries of a token's compressed key list
  bool any_sinks = false;       // some session has sinks: every token gets its own
  int64_t compressed_rows = 0;  // new compressed rows the prologue writes
};

GroupShape ShapeOf(const LaunchGroup& group) {
  GroupShape shape;
  shape.tokens = group.num_tokens;
  for (const AttendPlan* plan : group.plans) {
    const int32_t layer = plan->input->layer;
    if (plan->profile->layer_kind(layer) == LayerKind::kC4A) {
      shape.extra_width = std::max(shape.extra_width, plan->topk_width);
    } else if (plan->profile->compress_ratio(layer) != 0) {
      for (int32_t rows : plan->rows_after) shape.extra_width = std::max(shape.extra_width, rows);
    }
    for (size_t s = 0; s < plan->sessions.size(); ++s) {
      shape.any_sinks |= !plan->sessions[s]->sinks.empty();
      if (plan->inserts[s]) shape.compressed_rows += plan->input->segments[s].num_compressed_rows;
    }
  }
  return shape;
}

}  // namespace

// The launch of one group, step by step. The host arrays of the launch, in
// token order of the group, live in one PackedArrays that goes to the device
// in one copy; q and kv are staged apart (in place when the backend has host
// access), and so is the output, which the group's answers share.
class Launcher::GroupLaunch {
 public:
  GroupLaunch(Launcher& launcher, const LaunchGroup& group);

  absl::Status Stage();
  // The host-to-device copies of what Stage wrote, where the backend has no
  // host access; the device's scratch for the prologue.
  absl::Status Upload();
  absl::Status Prologue();
  absl::Status Decode();
  absl::Status ReadBack();
  GroupAnswer answer() const { return {output_, out_host_, lse_host_}; }

 private:
  // Copies a message's q and kv and fills its tokens' arrays, from token t0 on.
  void StageMessage(const AttendPlan& plan, int64_t t0);
  // Token t, the message's token m, at position p of segment s: its SWA slot,
  // both key lists and its sinks.
  void StageToken(const AttendPlan& plan, size_t s, int64_t t, int64_t m, int32_t p);
  // Points `into` at the arena's `slot`, at least `bytes` of it.
  absl::Status Reserve(DeviceArena::Slot slot, int64_t bytes, uint8_t*& into) {
    absl::StatusOr<uint8_t*> memory = launcher_.arena_.Reserve(slot, bytes);
    if (!memory.ok()) return memory.status();
    into = *memory;
    return absl::OkStatus();
  }
  template <typename T>
  T* Device(const PackedArrays::Place<T>& place) const {
    return PackedArrays::In(arrays_, place);
  }

  Launcher& launcher_;
  ComputeBackend& backend_;
  const LaunchGroup& group_;
  const GroupShape shape_;
  const bool host_;  // the backend's memory is host memory

  PackedArrays packed_;
  const PackedArrays::Place<int32_t> positions_p_;
  const PackedArrays::Place<int32_t> swa_slots_p_;
  const PackedArrays::Place<int32_t> main_indices_p_;
  const PackedArrays::Place<int32_t> main_lengths_p_;
  const PackedArrays::Place<int32_t> extra_indices_p_;
  const PackedArrays::Place<int32_t> extra_lengths_p_;
  const PackedArrays::Place<float> sinks_p_;
  RowInsert compressed_;
  absl::Span<int32_t> positions_, swa_slots_, main_indices_, main_lengths_, extra_indices_,
      extra_lengths_;
  absl::Span<float> sinks_;
  uint8_t* arrays_ = nullptr;  // the device's copy of packed_

  // Host staging for a backend without host access: uninitialised (every
  // byte is written by Stage), not zero-filled.
  uint8_t* q_host_ = nullptr;  // staging without host access (the arena's)
  uint8_t* kv_host_ = nullptr;
  uint8_t* q_device_ = nullptr;
  uint8_t* kv_device_ = nullptr;
  uint8_t* q_out_ = nullptr;  // the prologue's [N, Hp, 512]
  // The output lives in host memory shared by the answers of this group; a
  // host-accessible backend writes it in place. Uninitialised: the decode
  // (or the read back) writes every byte of out and lse.
  std::shared_ptr<uint8_t[]> output_;
  uint8_t* out_host_ = nullptr;
  uint8_t* lse_host_ = nullptr;
  uint8_t* out_device_ = nullptr;
  uint8_t* lse_device_ = nullptr;
};

Launcher::GroupLaunch::GroupLaunch(Launcher& launcher, const LaunchGroup& group)
    : launcher_(launcher),
      backend_(launcher.backend_),
      group_(group),
      shape_(ShapeOf(group)),
      host_(backend_.host_accessible()),
      positions_p_(packed_.Reserve<int32_t>(shape_.tokens, 0)),
      swa_slots_p_(packed_.Reserve<int32_t>(shape_.tokens, -1)),
      main_indices_p_(packed_.Reserve<int32_t>(shape_.tokens * kSwaWindow, -1)),
      main_lengths_p_(packed_.Reserve<int32_t>(shape_.tokens, 0)),
      extra_indices_p_(packed_.Reserve<int32_t>(shape_.tokens * shape_.extra_width, -1)),
      extra_lengths_p_(packed_.Reserve<int32_t>(shape_.tokens, 0)),
      sinks_p_(packed_.Reserve<float>(shape_.any_sinks ? shape_.tokens * group.num_heads : 0,
                                      0.0f)),
      compressed_(packed_, shape_.compressed_rows) {}

absl::Status Launcher::GroupLaunch::Stage() {
  const int64_t q_bytes = shape_.tokens * group_.num_heads * kRowBytes;
  const int64_t kv_bytes = shape_.tokens * kRowBytes;
  if (absl::Status status = Reserve(DeviceArena::kQ, q_bytes, q_device_); !status.ok()) {
    return status;
  }
  if (absl::Status status = Reserve(DeviceArena::kKv, kv_bytes, kv_device_); !status.ok()) {
    return status;
  }
  if (!host_) {
    if (absl::Status status = Reserve(DeviceArena::kQStaging, q_bytes, q_host_); !status.ok()) {
      return status;
    }
    if (absl::Status status = Reserve(DeviceArena::kKvStaging, kv_bytes, kv_host_);
        !status.ok()) {
      return status;
    }
  }
  packed_.Allocate();
  positions_ = packed_.Array(positions_p_);
  swa_slots_ = packed_.Array(swa_slots_p_);
  main_indices_ = packed_.Array(main_indices_p_);
  main_lengths_ = packed_.Array(main_lengths_p_);
  extra_indices_ = packed_.Array(extra_indices_p_);
  extra_lengths_ = packed_.Array(extra_lengths_p_);
  sinks_ = packed_.Array(sinks_p_);
  compressed_.Open(packed_);
  int64_t t0 = 0;
  for (const AttendPlan* plan : group_.plans) {
    StageMessage(*plan, t0);
    t0 += plan->num_tokens;
  }
  output_.reset(new uint8_t[shape_.tokens * group_.num_heads * (kRowBytes + 4)]);
  out_host_ = output_.get();
  lse_host_ = out_host_ + shape_.tokens * group_.num_heads * kRowBytes;
  return absl::OkStatus();
}

void Launcher::GroupLaunch::StageMessage(const AttendPlan& plan, int64_t t0) {
  const AttendInput& input = *plan.input;
  input.q.CopyTo((host_ ? q_device_ : q_host_) + t0 * group_.num_heads * kRowBytes);
  if (input.kv.present) input.kv.CopyTo((host_ ? kv_device_ : kv_host_) + t0 * kRowBytes);
  const int ratio = plan.profile->compress_ratio(input.layer);
  int64_t compressed_row = 0;  // of the message's compressed_kv
  int64_t t = t0;
  for (size_t s = 0; s < input.segments.size(); ++s) {
    const SegmentInput& segment = input.segments[s];
    if (plan.inserts[s] && segment.num_compressed_rows > 0) {
      compressed_.AddCompressed(input.compressed_kv, compressed_row,
                                plan.sessions[s]->layers[input.layer],
                                segment.first_compressed_row, segment.num_compressed_rows, ratio);
    }
    compressed_row += segment.num_compressed_rows;
    for (int32_t i = 0; i < segment.num_tokens; ++i, ++t) {
      StageToken(plan, s, t, t - t0, segment.position + i);
    }
  }
}

void Launcher::GroupLaunch::StageToken(const AttendPlan& plan, size_t s, int64_t t, int64_t m,
                                       int32_t p) {
  const int32_t layer = plan.input->layer;
  const Session& session = *plan.sessions[s];
  const LayerKv& state = session.layers[layer];
  positions_[t] = p;
  if (plan.inserts[s]) swa_slots_[t] = state.SwaSlot(p);
  const int32_t first = std::max(0, p - kSwaWindow + 1);
  main_lengths_[t] = p - first + 1;
  for (int32_t w = first; w <= p; ++w) {
    main_indices_[t * kSwaWindow + (w - first)] = state.SwaSlot(w);
  }
  int32_t* extra = extra_indices_.data() + t * shape_.extra_width;
  const int ratio = plan.profile->compress_ratio(layer);
  if (plan.profile->layer_kind(layer) == LayerKind::kC4A) {
    for (int k = 0; k < plan.topk_width; ++k) {
      const int32_t row = plan.topk[m * plan.topk_width + k];
      extra[k] = row < 0 ? -1 : state.CompressedSlot(row);
    }
    extra_lengths_[t] = plan.topk_width;
  } else if (ratio != 0) {
    // C128A: every compressed row j < (p + 1) / 128.
    const int32_t visible = (p + 1) / ratio;
    for (int32_t j = 0; j < visible; ++j) extra[j] = state.CompressedSlot(j);
    extra_lengths_[t] = visible;
  }
  const int heads = group_.num_heads;
  for (int h = 0; h < (shape_.any_sinks ? heads : 0); ++h) {
    sinks_[t * heads + h] = session.Sink(layer, plan.input->head_offset, h);
  }
}

absl::Status Launcher::GroupLaunch::Upload() {
  const int64_t tokens = shape_.tokens;
  if (!host_) {
    const int64_t q_bytes = tokens * group_.num_heads * kRowBytes;
    if (absl::Status status = backend_.CopyToDevice(q_device_, q_host_, q_bytes);
        !status.ok()) {
      return status;
    }
    if (absl::Status status = backend_.CopyToDevice(kv_device_, kv_host_, tokens * kRowBytes);
        !status.ok()) {
      return status;
    }
  }
  // The compressed arrays were sized before the loop that fills them.
  if (absl::Status status = compressed_.CheckFull("compressed"); !status.ok()) return status;
  absl::StatusOr<uint8_t*> arrays = launcher_.UploadPacked(packed_);
  if (!arrays.ok()) return arrays.status();
  arrays_ = *arrays;
  return Reserve(DeviceArena::kQOut, tokens * group_.padded_heads * kRowBytes, q_out_);
}

absl::Status Launcher::GroupLaunch::Prologue() {
  const int64_t tokens = shape_.tokens;
  PrologueParams params;
  params.num_tokens = tokens;
  params.num_heads = group_.num_heads;
  params.padded_heads = group_.padded_heads;
  params.q = reinterpret_cast<const uint16_t*>(q_device_);
  params.positions = Device(positions_p_);
  params.q_out = reinterpret_cast<uint16_t*>(q_out_);
  params.rms_norm_eps = group_.plans.front()->profile->rms_norm_eps;
  params.rope = launcher_.rope_view(group_.rope);
  params.swa = {tokens, reinterpret_cast<const uint16_t*>(kv_device_), Device(positions_p_),
                Device(swa_slots_p_), launcher_.pool_};
  params.compressed = compressed_.Params(arrays_, launcher_.pool_);
  return launcher_.Drained(backend_.Prologue(params));
}

absl::Status Launcher::GroupLaunch::Decode() {
  const int64_t tokens = shape_.tokens;
  const int heads = group_.num_heads;
  out_device_ = out_host_;
  lse_device_ = lse_host_;
  if (!host_) {
    if (absl::Status status = Reserve(DeviceArena::kOut, tokens * heads * kRowBytes, out_device_);
        !status.ok()) {
      return status;
    }
    if (absl::Status status = Reserve(DeviceArena::kLse, tokens * heads * 4, lse_device_);
        !status.ok()) {
      return status;
    }
  }
  const CachePoolView pool = launcher_.pool_;
  DecodeParams params;
  params.num_tokens = tokens;
  params.num_heads = heads;
  params.padded_heads = group_.padded_heads;
  params.q = reinterpret_cast<const uint16_t*>(q_out_);
  params.softmax_scale = group_.plans.front()->profile->softmax_scale;
  params.sinks = shape_.any_sinks ? Device(sinks_p_) : nullptr;
  params.sinks_per_token = shape_.any_sinks;
  params.main = {kSwaWindow, Device(main_indices_p_), Device(main_lengths_p_), pool};
  params.extra = {shape_.extra_width, Device(extra_indices_p_), Device(extra_lengths_p_), pool};
  params.derotate = group_.derotate;
  params.positions = Device(positions_p_);
  params.rope = launcher_.rope_view(group_.rope);
  params.out = reinterpret_cast<uint16_t*>(out_device_);
  params.lse = reinterpret_cast<float*>(lse_device_);
  return launcher_.Drained(backend_.Decode(params));
}

absl::Status Launcher::GroupLaunch::ReadBack() {
  if (host_) return absl::OkStatus();
  const int64_t values = shape_.tokens * group_.num_heads;
  if (absl::Status status = backend_.CopyToHost(out_host_, out_device_, values * kRowBytes);
      !status.ok()) {
    return status;
  }
  return backend_.CopyToHost(lse_host_, lse_device_, values * 4);
}

absl::StatusOr<std::unique_ptr<Launcher>> Launcher::Create(ComputeBackend& backend,
                                                           CachePoolView pool,
                                                           int32_t max_position) {
  std::unique_ptr<Launcher> launcher(new Launcher(backend, pool, max_position));
  if (absl::Status status = launcher->UploadRopeTables(); !status.ok()) return status;
  return launcher;
}

Launcher::Launcher(ComputeBackend& backend, CachePoolView pool, int32_t max_position)
    : backend_(backend), pool_(pool), max_position_(max_position), arena_(backend) {}

absl::Status Launcher::UploadRopeTables() {
  for (RopeKind kind : {RopeKind::kPlain, RopeKind::kYarn}) {
    const RopeTable table(kind, max_position_);
    absl::StatusOr<DeviceBuffer> buffer = backend_.Allocate(table.bytes());
    if (!buffer.ok()) return buffer.status();
    if (absl::Status status = backend_.CopyToDevice(buffer->data(), table.data(), table.bytes());
        !status.ok()) {
      return status;
    }
    rope_tables_[static_cast<int>(kind)] = *std::move(buffer);
  }
  return absl::OkStatus();
}

RopeTableView Launcher::rope_view(RopeKind kind) const {
  return {rope_tables_[static_cast<int>(kind)].as<float>(), max_position_};
}

absl::Status Launcher::Drained(const absl::Status& launched) {
  const absl::Status synced = backend_.Synchronize();
  return launched.ok() ? synced : launched;
}

absl::StatusOr<uint8_t*> Launcher::UploadPacked(const PackedArrays& packed) {
  absl::StatusOr<uint8_t*> device = arena_.Reserve(DeviceArena::kPackedArrays, packed.bytes());
  if (!device.ok()) return device.status();
  if (absl::Status status = backend_.CopyToDevice(*device, packed.data(), packed.bytes());
      !status.ok()) {
    return status;
  }
  return *device;
}

absl::StatusOr<GroupAnswer> Launcher::Run(const LaunchGroup& group, LaunchTimes& times) {
  GroupLaunch launch(*this, group);
  if (absl::Status status = Timed(times.upload_us,
                                  [&] {
                                    absl::Status staged = launch.Stage();
                                    return staged.ok() ? launch.Upload() : staged;
                                  });
      !status.ok()) {
    return status;
  }
  if (absl::Status status = Timed(times.prologue_us, [&] { return launch.Prologue(); });
      !status.ok()) {
    return status;
  }
  if (absl::Status status = Timed(times.decode_us, [&] { return launch.Decode(); });
      !status.ok()) {
    return status;
  }
  if (absl::Status status = Timed(times.readback_us, [&] { return launch.ReadBack(); });
      !status.ok()) {
    return status;
  }
  return launch.answer();
}

absl::Status Launcher::Append(const AppendPlan& plan) {
  for (RopeKind rope : {RopeKind::kPlain, RopeKind::kYarn}) {
    if (absl::Status status = AppendPass(plan, rope); !status.ok()) return status;
  }
  return absl::OkStatus();
}

absl::Status Launcher::AppendPass(const AppendPlan& plan, RopeKind rope) {
  const Session& session = *plan.session;
  const ModelProfile& profile = *session.profile;
  const int32_t swa_from = plan.SwaFrom();
  std::vector<int> layers;
  int64_t swa_rows = 0;
  int64_t compressed_rows = 0;
  for (int layer = 0; layer < profile.num_attention_layers(); ++layer) {
    if (profile.rope_kind(layer) != rope) continue;
    layers.push_back(layer);
    swa_rows += plan.end - swa_from;
    compressed_rows += plan.RowsAfter(layer) - session.layers[layer].compressed_rows;
  }
  if (layers.empty()) return absl::OkStatus();
  PackedArrays packed;
  RowInsert swa(packed, swa_rows);
  RowInsert compressed(packed, compressed_rows);
  packed.Allocate();
  swa.Open(packed);
  compressed.Open(packed);
  for (int layer : layers) {
    const LayerRowsInput& rows = *plan.by_layer[layer];
    const LayerKv& state = session.layers[layer];
    swa.AddSwa(rows.swa_kv, swa_from - plan.first, state, swa_from, plan.end - swa_from);
    compressed.AddCompressed(rows.compressed_kv, 0, state, state.compressed_rows,
                             plan.RowsAfter(layer) - state.compressed_rows,
                             profile.compress_ratio(layer));
  }
  PrologueParams params;
  params.num_heads = session.num_heads;
  params.padded_heads = session.padded_heads;
  params.rope = rope_view(rope);
  return Drained(Insert(packed, swa, compressed, params));
}

absl::Status Launcher::Insert(const PackedArrays& packed, const RowInsert& swa,
                              const RowInsert& compressed, PrologueParams params) {
  absl::StatusOr<uint8_t*> arrays = UploadPacked(packed);
  if (!arrays.ok()) return arrays.status();
  params.swa = swa.Params(*arrays, pool_);
  params.compressed = compressed.Params(*arrays, pool_);
  return backend_.Prologue(params);
}

}  // namespace mla

#include "server/engine/launcher.h"

#include <algorithm>
#include <chrono>
#include <cstdint>
#include <functional>
#include <iterator>
#include <mutex>
#include <optional>
#include <utility>
#include <vector>

#include "absl/functional/function_ref.h"
#include "absl/strings/str_cat.h"
#include "absl/types/span.h"
#include "kernels/geometry.h"
#include "kernels/model_profile.h"
#include "server/engine/device_copies.h"

namespace mla {
namespace {

// Pinned host memory the answers may hold at once; past it they are read
// back into ordinary heap memory (slower copies), see HostBufferPool.
constexpr int64_t kMaxPinnedAnswerBytes = int64_t{256} << 20;

// Tensors are copied in pieces of at least this many bytes, one a thread.
constexpr int64_t kMinCopyPiece = int64_t{256} << 10;

// Launches that may run at once, each with its own staging and its own
// marks: kMarkStride of the backend's marks apart, of which it sets
// kLaunchMarks (two around the copy in, on the copy queue; then one before
// each step and one after the last).
constexpr int64_t kLaunchesAtOnce = 2;
constexpr int kMarkStride = ComputeBackend::kMaxMarks / kLaunchesAtOnce;
constexpr int kLaunchMarks = 6;
static_assert(kLaunchMarks <= kMarkStride);

// Runs `step`, setting `micros` to the time it took.
absl::Status Timed(double& micros, absl::FunctionRef<absl::Status()> step) {
  const auto start = std::chrono::steady_clock::now();
  absl::Status status = step();
  micros =
      std::chrono::duration<double, std::micro>(std::chrono::steady_clock::now() - start).count();
  return status;
}

// Where one plan's part of a launch starts: its first token, its first new
// compressed row.
struct PlanStart {
  int64_t token = 0;
  int64_t compressed_row = 0;
};

// The sizes of one group's launch, and where each plan's part starts.
struct GroupShape {
  std::vector<PlanStart> starts;  // per plan, in the group's order
  int64_t tokens = 0;
  int extra_width = 0;          // entries of a token's compressed key list
  bool any_topk = false;        // some token's compressed keys are its top-k rows
  bool any_sinks = false;       // some session has sinks: every token gets its own
  int64_t compressed_rows = 0;  // new compressed rows the prologue writes
};

GroupShape ShapeOf(const LaunchGroup& group) {
  GroupShape shape;
  for (const AttendPlan* plan : group.plans) {
    shape.starts.push_back({shape.tokens, shape.compressed_rows});
    shape.tokens += plan->num_tokens;
    const int32_t layer = plan->input->layer;
    const bool compressed = plan->profile->compress_ratio(layer) != 0;
    if (plan->profile->layer_kind(layer) == LayerKind::kC4A) {
      shape.extra_width = std::max(shape.extra_width, plan->topk_width);
      shape.any_topk = true;
    } else if (compressed) {
      for (int32_t rows : plan->rows_after) shape.extra_width = std::max(shape.extra_width, rows);
    }
    for (size_t s = 0; s < plan->sessions.size(); ++s) {
      shape.any_sinks |= !plan->sessions[s]->sinks.empty();
      if (plan->inserts[s]) shape.compressed_rows += plan->input->segments[s].num_compressed_rows;
    }
  }
  return shape;
}

// The page tables a group's tokens read: per segment, the SWA ring and the
// compressed pages up to the rows after the step.
std::vector<TableUse> TablesOf(const LaunchGroup& group) {
  std::vector<TableUse> uses;
  for (const AttendPlan* plan : group.plans) {
    const int32_t layer = plan->input->layer;
    const bool compressed = plan->profile->compress_ratio(layer) != 0;
    for (size_t s = 0; s < plan->sessions.size(); ++s) {
      const int64_t pages = kSwaRingBlocks + (compressed ? PagesFor(plan->rows_after[s]) : 0);
      uses.push_back({&plan->sessions[s]->layers[layer], static_cast<int32_t>(pages)});
    }
  }
  return uses;
}

}  // namespace

// The launch of one group, step by step. Everything the launch sends, in
// token order of the group, lives in one PackedArrays staged in the arena's
// pinned memory and copied to the device at once; the arrays the backend
// writes (the key lists) sit after the copied part. The output, which the
// group's answers share, comes from the answer pool.
class Launcher::GroupLaunch {
 public:
  // Launch `number` (Launcher::Start's) of `group`, which makes `tables`.
  GroupLaunch(Launcher& launcher, const LaunchGroup& group, int64_t number, TableWrites tables);

  // Everything on the host: the staging, filled; enqueues the copy of its
  // queries to the device as soon as they are in it.
  absl::Status Stage();
  // Enqueues the copy in, the key lists and prologue, the decode and the
  // copy out, with the backend's marks between them; the first failure.
  absl::Status Enqueue();
  // Waits for the backend to finish the launch and reads its times, once
  // (on whichever of the launcher's two threads asks first; the other waits
  // for that).
  void Wait();

  int64_t number() const { return number_; }
  double& staging_us() { return staging_us_; }
  // After Wait: whether the backend finished it, and the time of each step.
  const absl::Status& status() const { return status_; }
  const LaunchTimes& times() const { return times_; }
  GroupAnswer answer() const;

 private:
  using Step = absl::Status (GroupLaunch::*)();
  absl::Status Upload();
  absl::Status Prologue();
  absl::Status Decode();
  absl::Status ReadBack();

  // Copies a message's tensors but q (large ones on the copy threads when
  // `parallel_copies`) and fills its tokens' arrays, from `start` on.
  void StageMessage(const AttendPlan& plan, PlanStart start, bool parallel_copies);
  // Copies `tensor` to `dst`, `at` bytes into the staging: on the copy
  // threads when `parallel`; noted for the device to copy when it lies in
  // device memory.
  void Copy(const wire::TensorView& tensor, size_t at, bool parallel);
  // The q of plan `i` when it lies in one piece that the device copies from
  // directly (ComputeBackend::CopiesDirectlyFrom: a pinned or a device
  // region), else null: staged on the host. Asked once a plan (direct_q_).
  const uint8_t* DirectQuery(int64_t i) const;
  // Enqueues the queries' copy to the device: the staged ones in runs of
  // neighbouring plans, the others each from where it lies.
  absl::Status UploadQueries();
  // The answers' copies out of the decode's output (out_device_,
  // scales_device_, lse_device_) when they do not all go into one response
  // buffer: plan by plan, into its regions or its part of the answer memory.
  absl::Status ReadBackByPlan();
  // Where out, the FP8 scales and lse of `rows` head rows lie in memory laid
  // out that way from `base` (the answer memory, the decode's output).
  struct AnswerPlaces {
    uint8_t* out;
    uint8_t* scales;  // lse's place in a bf16 group: it has no scales
    uint8_t* lse;
  };
  AnswerPlaces PlacesIn(uint8_t* base, int64_t rows) const {
    uint8_t* scales = base + rows * out_row_bytes_;
    return {base, scales, scales + rows * scales_row_bytes_};
  }
  // Token t, the message's token m, at position p of segment s.
  void StageToken(const AttendPlan& plan, size_t s, int64_t t, int64_t m, int32_t p);
  // Points `into` at the arena's `slot`, at least `bytes` of it.
  absl::Status Reserve(DeviceArena::Slot slot, int64_t bytes, uint8_t*& into) {
    absl::StatusOr<uint8_t*> memory = launcher_.Scratch(slot, bytes);
    if (!memory.ok()) return memory.status();
    into = *memory;
    return absl::OkStatus();
  }
  template <typename T>
  T* Device(const PackedArrays::Place<T>& place) const {
    return PackedArrays::In(arrays_, place);
  }
  const PackedArrays::Place<int32_t>& extra_p() const {
    return shape_.any_topk ? extra_sent_p_ : extra_written_p_;
  }

  Launcher& launcher_;
  ComputeBackend& backend_;
  const LaunchGroup& group_;
  const int64_t number_;
  const int first_mark_;  // of the backend's, for this launch's kLaunchMarks
  const DeviceArena::Slot staging_slot_;
  const DeviceArena::Slot staged_slot_;  // the device's copy of it
  double staging_us_ = 0;
  std::mutex wait_mutex_;
  bool waited_ = false;  // with wait_mutex_; status_ and times_ are set then
  absl::Status status_;
  LaunchTimes times_;
  const GroupShape shape_;
  const TableWrites tables_;
  const bool host_;  // the backend's memory is host memory
  const int64_t q_bytes_;
  // A head row's bytes of the answer: out (bf16, or e4m3 in an FP8 group),
  // the FP8 scales (none in a bf16 group), lse.
  const int64_t out_row_bytes_;
  const int64_t scales_row_bytes_;
  const int64_t out_bytes_;  // the decode's output: out, then scales, then lse
  const bool any_regions_;  // some plan is answered into its regions
  // Where each plan's answer starts in the answer memory, in tokens (-1 for
  // one answered into regions), and the tokens it holds: on a host backend
  // the decode's whole output (the group's layout), else the inline plans'
  // answers alone, one after the other.
  std::vector<int64_t> answer_at_;
  int64_t answer_tokens_ = 0;
  // One plan, answered into regions the decode writes directly (host
  // memory on a host backend, device memory on a device).
  const bool direct_answer_;
  // Inputs in device memory, copied into the staging's device copy.
  DeviceCopies device_copies_;

  PackedArrays packed_;
  // Sent to the device: the messages' tensors, then the arrays.
  const PackedArrays::Place<uint8_t> q_p_;
  const PackedArrays::Place<uint8_t> kv_p_;
  RowInsert compressed_;
  const PackedArrays::Place<int32_t> positions_p_;
  const PackedArrays::Place<int32_t> swa_slots_p_;
  const PackedArrays::Place<int32_t> swa_table_p_;
  const PackedArrays::Place<int32_t> compressed_table_p_;
  const PackedArrays::Place<int32_t> extra_rule_p_;
  const PackedArrays::Place<int32_t> table_write_at_p_;
  const PackedArrays::Place<int32_t> table_write_page_p_;
  const PackedArrays::Place<float> sinks_p_;
  // The extra key lists: top-k rows in, slots out. Sent when some token
  // has top-k rows (extra_sent_p_), else only written (extra_written_p_);
  // the other is empty.
  const PackedArrays::Place<int32_t> extra_sent_p_;
  const size_t q_end_;  // the queries lead the staging: bytes [0, q_end_)
  const size_t upload_bytes_;
  // Written by the backend (BuildKeyLists).
  const PackedArrays::Place<int32_t> extra_written_p_;
  const PackedArrays::Place<int32_t> main_indices_p_;
  const PackedArrays::Place<int32_t> main_lengths_p_;
  const PackedArrays::Place<int32_t> extra_lengths_p_;

  absl::Span<int32_t> positions_, swa_slots_, swa_table_, compressed_table_, extra_rule_,
      extra_indices_;
  absl::Span<float> sinks_;
  uint8_t* arrays_ = nullptr;  // the backend's view of packed_
  uint8_t* q_out_ = nullptr;   // the prologue's [N, Hp, 512]
  // Made by Prologue(), run with the decode by Decode() (PrologueAndDecode:
  // a GPU overlaps the two).
  PrologueParams prologue_;
  // The inline answers live in host memory shared by the answers of this
  // group (none when every plan is answered into regions and the host need
  // not hold the decode's output); a host-accessible backend's decode writes
  // it in place. Uninitialised: the decode (or the read back) writes every
  // byte of out and lse that an answer reads.
  std::shared_ptr<uint8_t> output_;
  uint8_t* out_host_ = nullptr;
  uint8_t* scales_host_ = nullptr;
  uint8_t* lse_host_ = nullptr;
  // Where the decode writes out, the scales and lse.
  uint8_t* out_device_ = nullptr;
  uint8_t* scales_device_ = nullptr;
  uint8_t* lse_device_ = nullptr;
  // One message's q and kv as it arrived (nothing staged), read there by a
  // host-accessible backend, or by the device from a device region; null:
  // staged.
  const uint16_t* q_in_place_ = nullptr;
  const uint16_t* kv_in_place_ = nullptr;
  // Per plan, DirectQuery's answer (empty when q is read in place).
  std::vector<const uint8_t*> direct_q_;
};

namespace {

// Whether some plan of `group` is answered into regions.
bool AnyRegions(const LaunchGroup& group) {
  for (const AttendPlan* plan : group.plans) {
    if (plan->answer_regions != nullptr) return true;
  }
  return false;
}

// Whether the decode of `group` can write its one plan's answer into its
// regions itself: host memory on a host backend, device memory (out, the
// scales and lse, those asked) on a device, each at the alignment the
// kernels write it at (kDecodeOutAlignment and the others). The wire asks
// only the values' own alignment of a region's offset (2 bytes for bf16, 1
// for e4m3), so an answer placed less aligned is decoded into the engine's
// memory and copied.
bool DecodeWritesRegions(const LaunchGroup& group, bool host) {
  if (group.plans.size() != 1 || group.plans[0]->answer_regions == nullptr) return false;
  const AnswerRegions& regions = *group.plans[0]->answer_regions;
  if (!AlignedTo(regions.out.data,
                 group.fp8_output ? kDecodeE4m3Alignment : kDecodeOutAlignment) ||
      !AlignedTo(regions.scales.data, kDecodeScalesAlignment) ||
      !AlignedTo(regions.lse.data, kDecodeLseAlignment)) {
    return false;
  }
  if (host) return !regions.out.device;
  return regions.out.device && (regions.lse.data == nullptr || regions.lse.device) &&
         (regions.scales.data == nullptr || regions.scales.device);
}

// The tensor's bytes when they lie in one piece aligned for bf16, else null.
const uint16_t* Bf16InPlace(const wire::TensorView& tensor) {
  const std::optional<wire::Piece> piece = tensor.contiguous();
  if (!piece.has_value() || piece->empty() ||
      reinterpret_cast<uintptr_t>(piece->data()) % alignof(uint16_t) != 0) {
    return nullptr;
  }
  return reinterpret_cast<const uint16_t*>(piece->data());
}

}  // namespace

// The upload boundary: the extra indices are sent only when they hold top-k
// rows; otherwise the backend writes them in full.
Launcher::GroupLaunch::GroupLaunch(Launcher& launcher, const LaunchGroup& group, int64_t number,
                                   TableWrites tables)
    : launcher_(launcher),
      backend_(launcher.backend_),
      group_(group),
      number_(number),
      first_mark_(static_cast<int>(number % kLaunchesAtOnce) * kMarkStride),
      staging_slot_(number % kLaunchesAtOnce == 0 ? DeviceArena::kStaging0
                                                  : DeviceArena::kStaging1),
      staged_slot_(number % kLaunchesAtOnce == 0 ? DeviceArena::kStaged0
                                                 : DeviceArena::kStaged1),
      shape_(ShapeOf(group)),
      tables_(std::move(tables)),
      host_(backend_.host_accessible()),
      q_bytes_(shape_.tokens * group.num_heads * kRowBytes),
      out_row_bytes_(group.fp8_output ? kFp8RowBytes : kRowBytes),
      scales_row_bytes_(group.fp8_output ? kFp8ScaleRowBytes : 0),
      out_bytes_(shape_.tokens * group.num_heads * (out_row_bytes_ + scales_row_bytes_ + 4)),
      any_regions_(AnyRegions(group)),
      direct_answer_(DecodeWritesRegions(group, host_)),
      q_p_(packed_.Reserve<uint8_t>(q_bytes_, 0)),
      kv_p_(packed_.Reserve<uint8_t>(shape_.tokens * kRowBytes, 0)),
      compressed_(packed_, shape_.compressed_rows, &device_copies_),
      positions_p_(packed_.Reserve<int32_t>(shape_.tokens, 0)),
      swa_slots_p_(packed_.Reserve<int32_t>(shape_.tokens, -1)),
      swa_table_p_(packed_.Reserve<int32_t>(shape_.tokens, 0)),
      compressed_table_p_(packed_.Reserve<int32_t>(shape_.tokens, 0)),
      extra_rule_p_(packed_.Reserve<int32_t>(shape_.tokens, 0)),
      table_write_at_p_(packed_.Reserve<int32_t>(tables_.at.size(), 0)),
      table_write_page_p_(packed_.Reserve<int32_t>(tables_.page.size(), 0)),
      sinks_p_(packed_.Reserve<float>(shape_.any_sinks ? shape_.tokens * group.num_heads : 0,
                                      0.0f)),
      extra_sent_p_(
          packed_.Reserve<int32_t>(shape_.any_topk ? shape_.tokens * shape_.extra_width : 0, -1)),
      q_end_(q_p_.at + q_p_.count),
      upload_bytes_(packed_.bytes()),
      extra_written_p_(
          packed_.Reserve<int32_t>(shape_.any_topk ? 0 : shape_.tokens * shape_.extra_width, -1)),
      main_indices_p_(packed_.Reserve<int32_t>(shape_.tokens * kSwaWindow, -1)),
      main_lengths_p_(packed_.Reserve<int32_t>(shape_.tokens, 0)),
      extra_lengths_p_(packed_.Reserve<int32_t>(shape_.tokens, 0)) {}

absl::Status Launcher::GroupLaunch::Stage() {
  if (absl::Status status = launcher_.Stage(packed_, staging_slot_); !status.ok()) return status;
  // Answer memory for the inline answers, and for the decode's output on a
  // host backend that does not write it into the regions itself.
  for (size_t i = 0; i < group_.plans.size(); ++i) {
    const bool in_regions = group_.plans[i]->answer_regions != nullptr;
    answer_at_.push_back(in_regions ? -1 : host_ ? shape_.starts[i].token : answer_tokens_);
    if (!in_regions && !host_) answer_tokens_ += group_.plans[i]->num_tokens;
  }
  if (host_ && !direct_answer_) answer_tokens_ = shape_.tokens;
  if (answer_tokens_ > 0) {
    const int64_t rows = answer_tokens_ * group_.num_heads;
    absl::StatusOr<std::shared_ptr<uint8_t>> output =
        launcher_.answers_.Take(rows * (out_row_bytes_ + scales_row_bytes_ + 4));
    if (!output.ok()) return output.status();
    output_ = *std::move(output);
    const AnswerPlaces places = PlacesIn(output_.get(), rows);
    out_host_ = places.out;
    scales_host_ = places.scales;
    lse_host_ = places.lse;
  }
  compressed_.Open(packed_);
  positions_ = packed_.Raw(positions_p_);
  swa_slots_ = packed_.Array(swa_slots_p_);
  swa_table_ = packed_.Raw(swa_table_p_);
  compressed_table_ = packed_.Raw(compressed_table_p_);
  extra_rule_ = packed_.Raw(extra_rule_p_);
  std::copy(tables_.at.begin(), tables_.at.end(), packed_.Raw(table_write_at_p_).begin());
  std::copy(tables_.page.begin(), tables_.page.end(), packed_.Raw(table_write_page_p_).begin());
  sinks_ = packed_.Raw(sinks_p_);
  extra_indices_ = packed_.Raw(extra_p());
  // One message: its large tensors in pieces on the copy threads; several:
  // the messages on the copy threads, each writing its own part. The
  // queries first: their copy to the device (most of the bytes) starts while
  // the rest is staged.
  const int64_t plans = static_cast<int64_t>(group_.plans.size());
  const auto each_plan = [&](const std::function<void(int64_t, bool)>& stage) {
    if (plans == 1) {
      stage(0, /*parallel_copies=*/true);
    } else {
      launcher_.copiers_.ParallelFor(plans, [&](int64_t i) { stage(i, false); });
    }
  };
  // One message's q and kv are read where they lie: in host memory by a
  // host backend, in a device region by the device.
  if (plans == 1) {
    const wire::AttendRequestView& input = *group_.plans[0]->input;
    const auto in_place = [&](const wire::TensorView& tensor) -> const uint16_t* {
      return tensor.device == !host_ ? Bf16InPlace(tensor) : nullptr;
    };
    q_in_place_ = in_place(*input.q);
    if (input.kv.has_value()) kv_in_place_ = in_place(*input.kv);
  }
  if (q_in_place_ == nullptr) {
    for (int64_t i = 0; i < plans; ++i) direct_q_.push_back(DirectQuery(i));
    each_plan([&](int64_t i, bool parallel) {
      if (direct_q_[i] != nullptr) return;
      Copy(*group_.plans[i]->input->q, shape_.starts[i].token * group_.num_heads * kRowBytes,
           parallel);
    });
  }
  if (absl::Status status = UploadQueries(); !status.ok()) return status;
  each_plan([&](int64_t i, bool parallel) {
    StageMessage(*group_.plans[i], shape_.starts[i], parallel);
  });
  return absl::OkStatus();
}

const uint8_t* Launcher::GroupLaunch::DirectQuery(int64_t i) const {
  if (host_) return nullptr;
  const wire::TensorView& q = *group_.plans[i]->input->q;
  const std::optional<wire::Piece> piece = q.contiguous();
  if (!piece.has_value() || piece->empty()) return nullptr;
  return q.device || backend_.CopiesDirectlyFrom(piece->data()) ? piece->data() : nullptr;
}

absl::Status Launcher::GroupLaunch::UploadQueries() {
  absl::StatusOr<uint8_t*> arrays =
      launcher_.UploadStaged(packed_, 0, 0, staged_slot_, /*queued=*/true);
  if (!arrays.ok()) return arrays.status();
  arrays_ = *arrays;
  if (host_ || q_in_place_ != nullptr) return absl::OkStatus();
  const int64_t plans = static_cast<int64_t>(group_.plans.size());
  const int64_t row_bytes = int64_t{group_.num_heads} * kRowBytes;
  int64_t run_from = -1;  // the first token of the staged run being gathered
  for (int64_t i = 0; i <= plans; ++i) {
    const uint8_t* direct = i < plans ? direct_q_[i] : nullptr;
    const int64_t token = i < plans ? shape_.starts[i].token : shape_.tokens;
    const bool staged = i < plans && direct == nullptr;
    if (!staged && run_from >= 0) {
      if (absl::Status status = backend_.CopyToDeviceQueued(
              Device(q_p_) + run_from * row_bytes, packed_.data() + q_p_.at + run_from * row_bytes,
              (token - run_from) * row_bytes);
          !status.ok()) {
        return status;
      }
      run_from = -1;
    }
    if (staged && run_from < 0) run_from = token;
    if (direct != nullptr) {
      if (absl::Status status = backend_.CopyToDeviceQueued(
              Device(q_p_) + token * row_bytes, direct, group_.plans[i]->num_tokens * row_bytes);
          !status.ok()) {
        return status;
      }
    }
  }
  return absl::OkStatus();
}

void Launcher::GroupLaunch::Copy(const wire::TensorView& tensor, size_t at, bool parallel) {
  if (tensor.size_bytes() == 0) return;
  if (tensor.device) {
    device_copies_.Add(at, tensor.pieces.front().data(), static_cast<int64_t>(tensor.size_bytes()));
  } else if (parallel) {
    launcher_.CopyOut(tensor, packed_.data() + at);
  } else {
    tensor.CopyTo(packed_.data() + at);
  }
}

void Launcher::GroupLaunch::StageMessage(const AttendPlan& plan, PlanStart start,
                                         bool parallel_copies) {
  const wire::AttendRequestView& input = *plan.input;
  const int64_t t0 = start.token;
  // Without kv no segment inserts: its tokens' SWA slots stay -1 and the
  // prologue reads none of their rows.
  if (input.kv.has_value() && kv_in_place_ == nullptr) {
    Copy(*input.kv, kv_p_.at + t0 * kRowBytes, parallel_copies);
  }
  // A message's top-k rows as wide as the launch's lists are one copy.
  if (plan.topk_width > 0 && plan.topk_width == shape_.extra_width) {
    Copy(*input.topk, extra_p().at + t0 * shape_.extra_width * sizeof(int32_t), parallel_copies);
  }
  const int ratio = plan.profile->compress_ratio(input.layer);
  int64_t compressed_row = 0;  // of the message's compressed_kv
  int64_t at = start.compressed_row;
  int64_t t = t0;
  for (size_t s = 0; s < input.segments.size(); ++s) {
    const wire::SegmentView& segment = input.segments[s];
    if (plan.inserts[s] && segment.num_compressed_rows > 0) {
      compressed_.AddCompressed(at, input.compressed_kv, compressed_row,
                                plan.sessions[s]->layers[input.layer],
                                segment.first_compressed_row, segment.num_compressed_rows, ratio);
      at += segment.num_compressed_rows;
    }
    compressed_row += segment.num_compressed_rows;
    // The layer's table: its SWA ring, then its compressed pages.
    const int32_t table = tables_.starts.at(&plan.sessions[s]->layers[input.layer]);
    for (int32_t i = 0; i < segment.num_tokens; ++i, ++t) {
      swa_table_[t] = table;
      compressed_table_[t] = table + kSwaRingBlocks;
      StageToken(plan, s, t, t - t0, segment.position + i);
    }
  }
}

void Launcher::GroupLaunch::StageToken(const AttendPlan& plan, size_t s, int64_t t, int64_t m,
                                       int32_t p) {
  const int32_t layer = plan.input->layer;
  const Session& session = *plan.sessions[s];
  positions_[t] = p;
  if (plan.inserts[s]) swa_slots_[t] = session.layers[layer].SwaSlot(p);
  const int ratio = plan.profile->compress_ratio(layer);
  if (plan.profile->layer_kind(layer) == LayerKind::kC4A) {
    extra_rule_[t] = plan.topk_width;
    if (plan.topk_width != shape_.extra_width) {
      plan.input->topk->CopyRange(m * plan.topk_width * 4, int64_t{plan.topk_width} * 4,
                                  extra_indices_.data() + t * shape_.extra_width);
    }
  } else {
    extra_rule_[t] = -ratio;  // 0 without compressed keys
  }
  const int heads = group_.num_heads;
  for (int h = 0; h < (shape_.any_sinks ? heads : 0); ++h) {
    sinks_[t * heads + h] = session.Sink(layer, plan.input->head_offset, h);
  }
}

absl::Status Launcher::GroupLaunch::Enqueue() {
  // The copy in on the copy queue, beside the launch before, which may
  // still compute; the steps after it wait for it (JoinCopies).
  const int m = first_mark_;
  if (absl::Status status = backend_.MarkCopies(m); !status.ok()) return status;
  if (absl::Status status = Upload(); !status.ok()) return status;
  if (absl::Status status = backend_.MarkCopies(m + 1); !status.ok()) return status;
  if (absl::Status status = backend_.JoinCopies(); !status.ok()) return status;
  static constexpr Step kSteps[] = {&GroupLaunch::Prologue, &GroupLaunch::Decode,
                                    &GroupLaunch::ReadBack};
  static_assert(std::size(kSteps) + 3 == kLaunchMarks);
  int mark = m + 2;
  for (Step step : kSteps) {
    if (absl::Status status = backend_.Mark(mark++); !status.ok()) return status;
    if (absl::Status status = (this->*step)(); !status.ok()) return status;
  }
  return backend_.Mark(mark);
}

void Launcher::GroupLaunch::Wait() {
  std::lock_guard<std::mutex> lock(wait_mutex_);
  if (waited_) return;
  waited_ = true;
  const int m = first_mark_;
  status_ = backend_.WaitForMark(m + kLaunchMarks - 1);
  if (!status_.ok()) return;  // the engine thread's ClearFailure clears it
  times_.upload_us = staging_us_ + backend_.MarkedMicros(m, m + 1);
  times_.prologue_us = backend_.MarkedMicros(m + 2, m + 3);
  times_.decode_us = backend_.MarkedMicros(m + 3, m + 4);
  times_.readback_us = backend_.MarkedMicros(m + 4, m + 5);
}

absl::Status Launcher::GroupLaunch::Upload() {
  absl::StatusOr<uint8_t*> arrays =
      launcher_.UploadStaged(packed_, q_end_, upload_bytes_, staged_slot_, /*queued=*/true);
  if (!arrays.ok()) return arrays.status();
  arrays_ = *arrays;
  // After the staging's upload, on the same queue: the inputs in device
  // regions overwrite their places in it.
  if (absl::Status status = device_copies_.Queue(backend_, arrays_); !status.ok()) return status;
  return Reserve(DeviceArena::kQOut, shape_.tokens * group_.padded_heads * kRowBytes, q_out_);
}

absl::Status Launcher::GroupLaunch::Prologue() {
  KeyListBuildParams lists;
  lists.num_tokens = shape_.tokens;
  lists.positions = Device(positions_p_);
  lists.pages = launcher_.tables_.pages();
  lists.num_pages = launcher_.tables_.num_pages();
  lists.num_table_writes = static_cast<int64_t>(tables_.at.size());
  lists.table_write_at = Device(table_write_at_p_);
  lists.table_write_page = Device(table_write_page_p_);
  lists.swa_ring_pages = kSwaRingBlocks;
  lists.swa_table = Device(swa_table_p_);
  lists.compressed_table = Device(compressed_table_p_);
  lists.extra_rule = Device(extra_rule_p_);
  lists.main_indices = Device(main_indices_p_);
  lists.main_lengths = Device(main_lengths_p_);
  lists.extra_width = shape_.extra_width;
  lists.extra_indices = Device(extra_p());
  lists.extra_lengths = Device(extra_lengths_p_);
  // The prologue (or, fused, its inserts) runs before the decode and always
  // has rows (every token has its SWA row, -1 or not): the decode, which
  // reads its lists before it waits for the kernel before it
  // (CudaBackend::native_stream), never follows the key list kernel
  // directly. The prologue itself runs with the decode (Decode()), so that a
  // backend may overlap or fuse the two.
  if (absl::Status status = backend_.BuildKeyLists(lists); !status.ok()) return status;
  const int64_t tokens = shape_.tokens;
  PrologueParams params;
  params.num_tokens = tokens;
  params.num_heads = group_.num_heads;
  params.padded_heads = group_.padded_heads;
  params.q = q_in_place_ != nullptr ? q_in_place_ : reinterpret_cast<const uint16_t*>(Device(q_p_));
  params.positions = Device(positions_p_);
  params.q_out = reinterpret_cast<uint16_t*>(q_out_);
  params.rms_norm_eps = group_.plans.front()->profile->rms_norm_eps;
  params.rope = launcher_.rope_view(group_.rope);
  const uint16_t* kv =
      kv_in_place_ != nullptr ? kv_in_place_ : reinterpret_cast<const uint16_t*>(Device(kv_p_));
  params.swa = {tokens, kv, Device(positions_p_), Device(swa_slots_p_), launcher_.pool_};
  params.compressed = compressed_.Params(arrays_, launcher_.pool_);
  prologue_ = params;
  return absl::OkStatus();
}

absl::Status Launcher::GroupLaunch::Decode() {
  const int64_t tokens = shape_.tokens;
  const int heads = group_.num_heads;
  if (direct_answer_) {
    const AnswerRegions& regions = *group_.plans[0]->answer_regions;
    out_device_ = regions.out.data;
    scales_device_ = regions.scales.data;  // null: a bf16 output
    lse_device_ = regions.lse.data;        // null: not asked
  } else if (host_) {
    out_device_ = out_host_;
    scales_device_ = scales_host_;
    lse_device_ = lse_host_;
  } else {
    uint8_t* output = nullptr;
    if (absl::Status status = Reserve(DeviceArena::kOutput, out_bytes_, output); !status.ok()) {
      return status;
    }
    const AnswerPlaces places = PlacesIn(output, tokens * heads);
    out_device_ = places.out;
    scales_device_ = places.scales;
    lse_device_ = places.lse;
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
  params.extra = {shape_.extra_width, Device(extra_p()), Device(extra_lengths_p_), pool};
  params.derotate = group_.derotate;
  params.positions = Device(positions_p_);
  params.rope = launcher_.rope_view(group_.rope);
  if (group_.fp8_output) {
    params.out_e4m3 = out_device_;
    params.out_scales = scales_device_;
  } else {
    params.out = reinterpret_cast<uint16_t*>(out_device_);
  }
  params.lse = reinterpret_cast<float*>(lse_device_);
  return backend_.PrologueAndDecode(prologue_, params);
}

absl::Status Launcher::GroupLaunch::ReadBack() {
  if (direct_answer_) return absl::OkStatus();
  if (!any_regions_) {
    return host_ ? absl::OkStatus() : backend_.CopyToHostAsync(out_host_, out_device_, out_bytes_);
  }
  return ReadBackByPlan();
}

GroupAnswer Launcher::GroupLaunch::answer() const {
  GroupAnswer answer;
  answer.memory = output_;
  for (int64_t at : answer_at_) {
    const int64_t row = at * group_.num_heads;
    answer.out.push_back(at < 0 ? nullptr : out_host_ + row * out_row_bytes_);
    answer.out_scales.push_back(at < 0 || !group_.fp8_output
                                    ? nullptr
                                    : scales_host_ + row * scales_row_bytes_);
    answer.lse.push_back(at < 0 ? nullptr : lse_host_ + row * 4);
  }
  return answer;
}

absl::Status Launcher::GroupLaunch::ReadBackByPlan() {
  const int64_t heads = group_.num_heads;
  for (size_t i = 0; i < group_.plans.size(); ++i) {
    const AttendPlan& plan = *group_.plans[i];
    const int64_t t = shape_.starts[i].token;
    uint8_t* out = nullptr;
    uint8_t* scales = nullptr;
    uint8_t* lse = nullptr;
    if (plan.answer_regions != nullptr) {
      out = plan.answer_regions->out.data;
      scales = plan.answer_regions->scales.data;
      lse = plan.answer_regions->lse.data;
    } else if (!host_) {
      const int64_t row = answer_at_[i] * heads;
      out = out_host_ + row * out_row_bytes_;
      if (group_.fp8_output) scales = scales_host_ + row * scales_row_bytes_;
      if (plan.input->return_lse) lse = lse_host_ + row * 4;
    }
    // The copies run on the device when a region is device memory.
    const struct {
      uint8_t* to;
      const uint8_t* from;
      int64_t row_bytes;
    } copies[] = {{out, out_device_, out_row_bytes_},
                  {scales, scales_device_, scales_row_bytes_},
                  {lse, lse_device_, 4}};
    for (const auto& copy : copies) {
      if (copy.to == nullptr) continue;
      const int64_t bytes = heads * copy.row_bytes;
      if (absl::Status status =
              backend_.CopyToHostAsync(copy.to, copy.from + t * bytes, plan.num_tokens * bytes);
          !status.ok()) {
        return status;
      }
    }
  }
  return absl::OkStatus();
}

absl::StatusOr<std::unique_ptr<Launcher>> Launcher::Create(ComputeBackend& backend,
                                                           CachePoolView pool,
                                                           int32_t max_position,
                                                           ThreadPool& copiers) {
  absl::StatusOr<BlockTables> tables = BlockTables::Create(backend, pool.num_blocks);
  if (!tables.ok()) return tables.status();
  std::unique_ptr<Launcher> launcher(
      new Launcher(backend, pool, max_position, copiers, *std::move(tables)));
  if (absl::Status status = launcher->UploadRopeTables(); !status.ok()) return status;
  return launcher;
}

Launcher::Launcher(ComputeBackend& backend, CachePoolView pool, int32_t max_position,
                   ThreadPool& copiers, BlockTables tables)
    : backend_(backend),
      pool_(pool),
      max_position_(max_position),
      tables_(std::move(tables)),
      arena_(backend),
      answers_(backend, kMaxPinnedAnswerBytes),
      copiers_(copiers) {}

void Launcher::CopyOut(const wire::TensorView& tensor, uint8_t* dst) {
  const int64_t bytes = static_cast<int64_t>(tensor.size_bytes());
  const int64_t pieces =
      std::min<int64_t>(copiers_.num_threads(), std::max<int64_t>(1, bytes / kMinCopyPiece));
  if (pieces <= 1) {
    tensor.CopyTo(dst);
    return;
  }
  const int64_t piece = (bytes + pieces - 1) / pieces;
  copiers_.ParallelFor(pieces, [&](int64_t i) {
    const int64_t at = i * piece;
    if (at < bytes) tensor.CopyRange(at, std::min(piece, bytes - at), dst + at);
  });
}

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

absl::Status Launcher::Stage(PackedArrays& packed, DeviceArena::Slot slot) {
  // The launch that staged in `slot` before has finished (Start waited).
  absl::StatusOr<uint8_t*> staging = arena_.Reserve(slot, packed.bytes());
  if (!staging.ok()) return staging.status();
  packed.UseMemory(*staging);
  return absl::OkStatus();
}

absl::StatusOr<uint8_t*> Launcher::UploadStaged(PackedArrays& packed, size_t from, size_t to,
                                                DeviceArena::Slot slot, bool queued) {
  uint8_t* staging = packed.data();
  if (backend_.host_accessible()) return staging;
  absl::StatusOr<uint8_t*> device = Scratch(slot, packed.bytes());
  if (!device.ok()) return device.status();
  const int64_t bytes = static_cast<int64_t>(to - from);
  if (absl::Status status =
          queued ? backend_.CopyToDeviceQueued(*device + from, staging + from, bytes)
                 : backend_.CopyToDeviceAsync(*device + from, staging + from, bytes);
      !status.ok()) {
    return status;
  }
  return *device;
}

Launcher::~Launcher() {
  WaitForRunning(next_launch_);
  backend_.Synchronize().IgnoreError();
}

void Launcher::WaitForRunning(int64_t before) {
  std::vector<std::shared_ptr<GroupLaunch>> waiting;
  {
    std::lock_guard<std::mutex> lock(running_mutex_);
    for (const std::shared_ptr<GroupLaunch>& launch : running_) {
      if (launch->number() < before) waiting.push_back(launch);
    }
  }
  for (const std::shared_ptr<GroupLaunch>& launch : waiting) launch->Wait();
}

absl::StatusOr<uint8_t*> Launcher::Scratch(DeviceArena::Slot slot, int64_t bytes) {
  if (!arena_.Fits(slot, bytes)) WaitForRunning(next_launch_);
  return arena_.Reserve(slot, bytes);
}

absl::StatusOr<int64_t> Launcher::Start(const LaunchGroup& group) {
  const int64_t number = next_launch_++;
  // Its staging and marks were those of the launch kLaunchesAtOnce before.
  WaitForRunning(number - kLaunchesAtOnce + 1);
  absl::StatusOr<TableWrites> tables = tables_.Prepare(number, TablesOf(group));
  if (!tables.ok()) return tables.status();
  auto launch = std::make_shared<GroupLaunch>(*this, group, number, *std::move(tables));
  // Staging enqueues the queries' copy: a launch that fails even there waits
  // for the backend, the running launches first, so that nothing of it is
  // left to report to the next one.
  absl::Status status = Timed(launch->staging_us(), [&] { return launch->Stage(); });
  if (status.ok()) status = launch->Enqueue();
  if (!status.ok()) {
    tables_.Settle(number, false);
    WaitForRunning(number);
    return Drained(status);
  }
  std::lock_guard<std::mutex> lock(running_mutex_);
  running_.push_back(std::move(launch));
  return number;
}

absl::StatusOr<GroupAnswer> Launcher::Finish(int64_t launch, LaunchTimes& times) {
  std::shared_ptr<GroupLaunch> finished;
  {
    std::lock_guard<std::mutex> lock(running_mutex_);
    for (const std::shared_ptr<GroupLaunch>& running : running_) {
      if (running->number() == launch) finished = running;
    }
  }
  if (finished == nullptr) {
    return absl::InternalError(absl::StrCat("launch ", launch, " is not running"));
  }
  // Running until the backend is done with it: until then the engine
  // thread must not grow the buffers it uses.
  finished->Wait();
  {
    std::lock_guard<std::mutex> lock(running_mutex_);
    running_.erase(std::find(running_.begin(), running_.end(), finished));
  }
  if (!finished->status().ok()) return finished->status();
  times = finished->times();
  return finished->answer();
}

absl::Status Launcher::ClearFailure() {
  WaitForRunning(next_launch_);
  return backend_.Synchronize();
}

absl::Status Launcher::Append(const AppendPlan& plan) {
  WaitForRunning(next_launch_);
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
  if (absl::Status status = Stage(packed, DeviceArena::kStaging0); !status.ok()) return status;
  swa.Open(packed);
  compressed.Open(packed);
  int64_t swa_at = 0;
  int64_t compressed_at = 0;
  for (int layer : layers) {
    const wire::LayerRowsView& rows = *plan.by_layer[layer];
    const LayerKv& state = session.layers[layer];
    const int32_t new_rows = plan.RowsAfter(layer) - state.compressed_rows;
    swa.AddSwa(swa_at, rows.swa_kv, swa_from - plan.first, state, swa_from, plan.end - swa_from);
    compressed.AddCompressed(compressed_at, rows.compressed_kv, 0, state, state.compressed_rows,
                             new_rows, profile.compress_ratio(layer));
    swa_at += plan.end - swa_from;
    compressed_at += new_rows;
  }
  PrologueParams params;
  params.num_heads = session.num_heads;
  params.padded_heads = session.padded_heads;
  params.rope = rope_view(rope);
  return Drained(Insert(packed, swa, compressed, params));
}

absl::Status Launcher::Insert(PackedArrays& packed, const RowInsert& swa,
                              const RowInsert& compressed, PrologueParams params) {
  // Every launch has finished (Append waited): the main queue.
  absl::StatusOr<uint8_t*> arrays =
      UploadStaged(packed, 0, packed.bytes(), DeviceArena::kStaged0, /*queued=*/false);
  if (!arrays.ok()) return arrays.status();
  params.swa = swa.Params(*arrays, pool_);
  params.compressed = compressed.Params(*arrays, pool_);
  return backend_.Prologue(params);
}

}  // namespace mla

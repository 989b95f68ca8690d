#include "client/loadtest/driver.h"

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cmath>
#include <condition_variable>
#include <cstring>
#include <deque>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <set>
#include <thread>
#include <tuple>
#include <utility>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/time/time.h"
#include "client/loadtest/arrivals.h"
#include "client/loadtest/progress.h"
#include "client/loadtest/slot_memory.h"
#include "client/loadtest/verifier.h"
#include "client/loadtest/workload.h"
#include "client/mla_client.h"
#include "kernels/geometry.h"
#include "kernels/model_profile.h"

namespace mla::loadtest {
namespace {

namespace pb = ::mla_offload::v1;
using Clock = std::chrono::steady_clock;
// AppendKV calls stay below this (the server's default limit is 256 MiB).
constexpr int64_t kAppendChunkBytes = int64_t{48} << 20;

// The longest a run may be told to last (--duration_s), and to wait for
// anything else (--warmup_s, --step_timeout_s); ValidateOptions holds the
// flags to these.
constexpr double kMaxDurationSeconds = 7 * 86400;
constexpr double kMaxWaitSeconds = 3600;
// Open loop: above this many layer steps/s no client keeps the schedule.
constexpr double kMaxRate = 1e7;

constexpr char kNothingMeasured[] = "nothing was measured; this run's sessions were closed";

double Seconds(Clock::duration d) { return std::chrono::duration<double>(d).count(); }
// Saturates: a Poisson gap of a very low rate would not fit in int64
// nanoseconds, and the cast would be undefined.
Clock::duration FromSeconds(double s) {
  constexpr double kLongest = 1e9;  // ~32 years, far from the int64 limit
  return std::chrono::duration_cast<Clock::duration>(
      std::chrono::duration<double>(std::clamp(s, 0.0, kLongest)));
}

// What every node shares: the model, the workload and the run's geometry.
struct Setup {
  const ModelProfile* model = nullptr;
  const Workload* workload = nullptr;
  // --data_plane=shm or cuda_ipc: the tensors lie in a region on each
  // server (regions), in device memory of GPU cuda_device (cuda_ipc).
  bool regions = false;
  bool cuda_ipc = false;
  int cuda_device = 0;
  // cuda_ipc writes a slot's tensors only the first time the slot is used,
  // as a model's kernels would have left them there, unless --verify checks
  // the answers (every step is written then).
  bool write_every_step = true;
  int concurrency = 1;  // layer steps in flight per node: a region's slots
  int heads = 0;
  int layers = 0;
  int tokens_per_step = 1;
  int prompt = 0;
  int32_t max_position = 0;
  uint64_t seed = 1;
  bool derotate = false;
  bool fp8_output = false;
};

struct SessionRef {
  uint64_t salt = 0;
  std::string id;
};

// Where one layer step's tensors lie in a slot of a group's region
// (--data_plane=shm|cuda_ipc): each part 64-byte aligned, sized for the
// largest step; `scales` (the FP8 output's) only with --fp8_output.
struct SlotLayout {
  int64_t q = 0, kv = 0, compressed = 0, out = 0, lse = 0, scales = 0;  // offsets
  int64_t bytes = 0;                                                    // of the slot

  static SlotLayout For(int64_t tokens, int heads, int64_t max_new_rows, bool fp8_output) {
    const auto aligned = [](int64_t bytes) { return (bytes + 63) / 64 * 64; };
    SlotLayout slot;
    slot.kv = aligned(tokens * heads * kRowBytes);
    slot.compressed = slot.kv + aligned(tokens * kRowBytes);
    slot.out = slot.compressed + aligned(max_new_rows * kRowBytes);
    slot.lse = slot.out + aligned(tokens * heads * (fp8_output ? kFp8RowBytes : kRowBytes));
    slot.scales = slot.lse + aligned(tokens * heads * 4);
    slot.bytes = slot.scales + (fp8_output ? aligned(tokens * heads * kFp8ScaleRowBytes) : 0);
    return slot;
  }
};

// The sessions of one node that live on one server, and the node's streams to it.
struct Group {
  int server = 0;
  std::vector<SessionRef> sessions;
  // --data_plane=shm|cuda_ipc: one slot a layer step in flight (step seq
  // uses slot seq % slots: the steps in flight are the last ones sent), and
  // whether each has been written (Setup::write_every_step).
  std::unique_ptr<SlotMemory> region;
  SlotLayout slot;
  std::vector<bool> slot_written;
  std::unique_ptr<client::AttendStream> attend;
  std::unique_ptr<client::EchoStream> echo;
  // Layer steps sent and not yet received, in order, with their payload bytes.
  std::deque<std::pair<int64_t, int64_t>> sent;
};

// A layer step whose answers are not all in.
struct Pending {
  int64_t step = 0;
  int layer = 0;
  Clock::time_point due;
  bool measured = false;
  int remaining = 0;  // groups not yet answered
  Clock::time_point done;
  int code = 0;
  int64_t tokens = 0;
  int64_t bytes_in = 0;
  int64_t bytes_out = 0;
  wire::TimingView timing;  // of the group answered last
  bool sample = false;
};

// A sampled layer step of one group, kept for --verify.
struct Sample {
  int64_t step = 0;
  int layer = 0;
  int server = 0;
  int head_offset = 0;
  std::vector<SessionRef> sessions;
  client::AttendResult result;
  // An answer written into the region: copied out of it on arrival (out,
  // or with --fp8_output its e4m3 codes and scales).
  std::vector<uint16_t> region_out;
  std::vector<uint8_t> region_e4m3;
  std::vector<uint8_t> region_scales;
  std::vector<float> region_lse;

  absl::Span<const uint16_t> out() const {
    return result.in_regions() ? absl::MakeConstSpan(region_out) : result.out();
  }
  absl::Span<const uint8_t> e4m3() const {
    return result.in_regions() ? absl::MakeConstSpan(region_e4m3) : result.out_e4m3();
  }
  absl::Span<const uint8_t> scales() const {
    return result.in_regions() ? absl::MakeConstSpan(region_scales) : result.out_scales();
  }
  absl::Span<const float> lse() const {
    return result.in_regions() ? absl::MakeConstSpan(region_lse) : result.lse();
  }
};

// Counters all nodes update, for the progress line.
struct Live {
  std::atomic<int64_t> ok{0};        // measured
  std::atomic<int64_t> answered{0};  // warm-up included, for the rate
  std::atomic<int64_t> errors{0};
  std::atomic<int64_t> in_flight{0};
  std::mutex mutex;
  LatencyHistogram recent;  // answers since the last progress line
};

// Sessions closed at the end of a run (or of a failed setup), all nodes.
struct CloseCount {
  int64_t sessions = 0;
  int64_t failed = 0;
  absl::Status first_error;  // of the first that failed
};

enum class PhaseKind { kAttend, kEcho };

struct PhasePlan {
  PhaseKind kind = PhaseKind::kAttend;
  Clock::time_point start;
  Clock::time_point warm_end;
  std::optional<Clock::time_point> end;  // duration mode
  int64_t measured_steps = 0;            // --steps mode: decode steps per node
  bool open_loop = false;
  int concurrency = 1;
  double rate_per_node = 0;
  int verify_every = 0;  // 0: no samples
  int verify_max = 0;    // layer steps sampled over all nodes
  int streams = 1;
};

class Node {
 public:
  Node(int index, const Setup& setup, std::unique_ptr<client::Cluster> cluster, int tp)
      : index_(index),
        setup_(setup),
        cluster_(std::move(cluster)),
        head_offset_((index % tp) * setup.heads) {}

  client::Cluster& cluster() { return *cluster_; }
  std::vector<Group>& groups() { return groups_; }
  int index() const { return index_; }

  // Creates the node's sessions and appends their prompts, until done, an
  // error, or `stop()` turns true (checked before each session and each
  // prompt chunk; then it returns OK with what it made so far). Every
  // session is recorded before its prompt, so CloseSessions frees it
  // whatever happened after its creation.
  absl::Status CreateSessions(int sessions, const std::function<bool()>& stop) {
    std::map<int, int> group_of_server;
    for (int s = 0; s < sessions && !stop(); ++s) {
      SessionRef ref;
      ref.salt = Workload::SessionSalt(setup_.seed, index_, s);
      const std::vector<float> sinks = setup_.workload->Sinks(ref.salt);
      client::SessionOptions options;
      options.model = setup_.model->name;
      options.num_heads = setup_.heads;
      options.sinks = sinks;
      options.sinks_shape = {setup_.model->num_attention_layers(), setup_.model->num_query_heads};
      absl::StatusOr<client::PlacedSession> placed = cluster_->CreateSession(
          absl::StrCat("mla_loadtest/", setup_.seed, "/node", index_, "/session", s), options);
      if (!placed.ok()) return placed.status();
      ref.id = placed->session.session_id();
      padded_heads_ = placed->session.padded_heads();
      auto [it, fresh] = group_of_server.emplace(placed->server, static_cast<int>(groups_.size()));
      if (fresh) {
        groups_.emplace_back();
        groups_.back().server = placed->server;
      }
      std::vector<SessionRef>& group = groups_[it->second].sessions;
      group.push_back(std::move(ref));
      if (absl::Status status = AppendPrompt(cluster_->client(placed->server), group.back(), stop);
          !status.ok()) {
        return status;
      }
    }
    return absl::OkStatus();
  }

  // --data_plane=shm|cuda_ipc: a region on each server the node uses, a
  // slot for each layer step in flight, each slot sized for the largest
  // message.
  absl::Status CreateRegions() {
    const int64_t max_new_rows = setup_.tokens_per_step / 4 + 1;  // a session, at ratio 4
    for (Group& group : groups_) {
      const int64_t sessions = static_cast<int64_t>(group.sessions.size());
      group.slot = SlotLayout::For(sessions * setup_.tokens_per_step, setup_.heads,
                                   sessions * max_new_rows, setup_.fp8_output);
      client::Client& client = cluster_->client(group.server);
      const int64_t bytes = group.slot.bytes * setup_.concurrency;
      absl::StatusOr<std::unique_ptr<SlotMemory>> region =
          setup_.cuda_ipc ? MakeCudaSlots(client, setup_.cuda_device, bytes)
                          : MakeHostSlots(client, bytes);
      if (!region.ok()) return region.status();
      group.region = *std::move(region);
      group.slot_written.assign(setup_.concurrency, false);
    }
    return absl::OkStatus();
  }

  // Closes every session this node created, and counts those that failed.
  void CloseSessions(CloseCount& count) {
    for (Group& group : groups_) {
      for (const SessionRef& session : group.sessions) {
        ++count.sessions;
        absl::StatusOr<int64_t> freed = cluster_->client(group.server).CloseSession(session.id);
        if (freed.ok()) continue;
        ++count.failed;
        if (count.first_error.ok()) count.first_error = freed.status();
      }
    }
  }

  int padded_heads() const { return padded_heads_; }

  // Runs one phase to its end: this thread sends, one thread per group receives.
  void Run(const PhasePlan& plan, const client::StreamOptions& stream_options, Live& live) {
    {
      std::lock_guard<std::mutex> lock(mutex_);
      plan_ = plan;
      live_ = &live;
      stats_ = PhaseStats();
      pending_.clear();
      in_flight_ = 0;
      samples_taken_ = 0;
      stop_ = false;
      sender_done_ = false;
      stop_reason_.clear();
      last_measured_done_.reset();
      for (Group& group : groups_) group.sent.clear();
    }
    stats_.name = plan.kind == PhaseKind::kAttend ? "attend" : "echo";
    for (Group& group : groups_) {
      auto& server = cluster_->client(group.server);
      if (plan.kind == PhaseKind::kAttend) {
        absl::StatusOr<std::unique_ptr<client::AttendStream>> stream =
            server.OpenAttendStream(stream_options);
        if (!stream.ok()) return Broken(stream.status());
        group.attend = *std::move(stream);
      } else {
        absl::StatusOr<std::unique_ptr<client::EchoStream>> stream =
            server.OpenEchoStream(stream_options);
        if (!stream.ok()) return Broken(stream.status());
        group.echo = *std::move(stream);
      }
    }
    std::vector<std::thread> receivers;
    for (size_t g = 0; g < groups_.size(); ++g)
      receivers.emplace_back([this, g] { ReceiveLoop(g); });
    SendLoop();
    {
      std::lock_guard<std::mutex> lock(mutex_);
      sender_done_ = true;
      cv_.notify_all();
    }
    for (std::thread& thread : receivers) thread.join();
    for (Group& group : groups_) {
      if (group.attend != nullptr) group.attend->Finish().IgnoreError();
      if (group.echo != nullptr) group.echo->Finish().IgnoreError();
      group.attend.reset();
      group.echo.reset();
    }
  }

  void Interrupt() { SetStop("interrupted"); }

  PhaseStats& stats() { return stats_; }
  std::vector<StepRecord>& records() { return records_; }
  std::vector<Sample>& samples() { return samples_; }
  const std::string& stop_reason() const { return stop_reason_; }
  std::optional<Clock::time_point> last_measured_done() const { return last_measured_done_; }

 private:
  absl::Status AppendPrompt(client::Client& server, const SessionRef& session,
                            const std::function<bool()>& stop) {
    const ModelProfile& model = *setup_.model;
    const int layers = model.num_attention_layers();
    const int chunk =
        static_cast<int>(std::max<int64_t>(1, kAppendChunkBytes / (layers * kRowBytes)));
    for (int first = 0; first < setup_.prompt && !stop(); first += chunk) {
      const int count = std::min(chunk, setup_.prompt - first);
      std::vector<std::vector<uint16_t>> swa(layers), compressed(layers);
      std::vector<client::LayerRowsInput> rows(layers);
      for (int layer = 0; layer < layers; ++layer) {
        for (int32_t p = first; p < first + count; ++p) {
          const uint16_t* row = setup_.workload->SwaRow(session.salt, layer, p);
          swa[layer].insert(swa[layer].end(), row, row + kHeadDim);
        }
        const int ratio = model.compress_ratio(layer);
        rows[layer].layer = layer;
        rows[layer].swa_kv = swa[layer];
        if (ratio > 0) {
          rows[layer].first_compressed_row = first / ratio;
          for (int32_t j = first / ratio; j < (first + count) / ratio; ++j) {
            const uint16_t* row = setup_.workload->CompressedRow(session.salt, layer, j);
            compressed[layer].insert(compressed[layer].end(), row, row + kHeadDim);
          }
          rows[layer].compressed_kv = compressed[layer];
        }
      }
      absl::StatusOr<pb::AppendKVResponse> appended =
          server.AppendKV(session.id, first, count, rows);
      if (!appended.ok()) return appended.status();
    }
    return absl::OkStatus();
  }

  void Broken(const absl::Status& status) {
    std::lock_guard<std::mutex> lock(mutex_);
    ++stats_.errors[StatusCodeName(static_cast<int>(status.code()))];
    stop_reason_ = absl::StrCat("node ", index_, ": ", status.message());
  }

  // The tensors of one group's Attend message, owned until gRPC lets go.
  struct Message {
    std::vector<uint16_t> kv;
    std::vector<uint16_t> compressed;
    std::vector<int32_t> topk;
  };

  // Where the region slot of layer step `seq` of `group` starts.
  int64_t SlotOf(const Group& group, int64_t seq) const {
    return (seq % setup_.concurrency) * group.slot.bytes;
  }

  // Writes the tensors of `input` into the slot of step `seq` (unless it
  // keeps what an earlier step wrote, Setup::write_every_step) and names
  // them there instead, with out (and lse) written there too: only the
  // top-k stays inline.
  absl::Status MoveIntoRegion(Group& group, int64_t seq, int64_t tokens,
                              client::AttendInput& input) {
    const int64_t base = SlotOf(group, seq);
    const bool write =
        setup_.write_every_step || !group.slot_written[seq % setup_.concurrency];
    group.slot_written[seq % setup_.concurrency] = true;
    const auto place = [&](absl::Span<const uint16_t>& tensor, int64_t at,
                           std::optional<client::RegionRef>& ref) -> absl::Status {
      const int64_t bytes = static_cast<int64_t>(tensor.size()) * 2;
      if (bytes == 0) return absl::OkStatus();
      if (write) {
        if (absl::Status status = group.region->Write(base + at, tensor.data(), bytes);
            !status.ok()) {
          return status;
        }
      }
      absl::StatusOr<client::RegionRef> placed = group.region->Ref(base + at, bytes);
      if (!placed.ok()) return placed.status();
      ref = *placed;
      tensor = {};
      return absl::OkStatus();
    };
    for (absl::Status status : {place(input.q, group.slot.q, input.q_region),
                                place(input.kv, group.slot.kv, input.kv_region),
                                place(input.compressed_kv, group.slot.compressed,
                                      input.compressed_kv_region)}) {
      if (!status.ok()) return status;
    }
    const int64_t rows = tokens * setup_.heads;
    absl::StatusOr<client::RegionRef> out = group.region->Ref(
        base + group.slot.out, rows * (setup_.fp8_output ? kFp8RowBytes : kRowBytes));
    if (!out.ok()) return out.status();
    input.out_region = *out;
    if (setup_.fp8_output) {
      absl::StatusOr<client::RegionRef> scales =
          group.region->Ref(base + group.slot.scales, rows * kFp8ScaleRowBytes);
      if (!scales.ok()) return scales.status();
      input.out_scales_region = *scales;
    }
    if (input.return_lse) {
      absl::StatusOr<client::RegionRef> lse = group.region->Ref(base + group.slot.lse, rows * 4);
      if (!lse.ok()) return lse.status();
      input.lse_region = *lse;
    }
    return absl::OkStatus();
  }

  // The group's part of a layer step, built and not yet sent.
  struct BuiltAttend {
    client::AttendInput input;
    int64_t tokens = 0;
    int64_t bytes = 0;  // tensor payload
  };

  // Builds the group's part of layer step `step` (the workload's rows,
  // top-k and queries): what a serving node has at hand before it sends.
  BuiltAttend BuildAttend(const Group& group, int64_t step, int layer, bool sample) const {
    const Workload& workload = *setup_.workload;
    const int ratio = setup_.model->compress_ratio(layer);
    const int32_t position = setup_.prompt + static_cast<int32_t>(step) * setup_.tokens_per_step;
    const int32_t end = position + setup_.tokens_per_step;
    auto message = std::make_shared<Message>();
    client::AttendInput input;
    input.layer = layer;
    input.head_offset = head_offset_;
    input.return_lse = sample;
    input.derotate_output = setup_.derotate;
    input.fp8_output = setup_.fp8_output;
    for (const SessionRef& session : group.sessions) {
      client::AttendSegment segment;
      segment.session_id = session.id;
      segment.position = position;
      segment.num_tokens = setup_.tokens_per_step;
      if (ratio > 0) {
        segment.first_compressed_row = position / ratio;
        segment.num_compressed_rows = end / ratio - position / ratio;
        for (int32_t j = position / ratio; j < end / ratio; ++j) {
          const uint16_t* row = workload.CompressedRow(session.salt, layer, j);
          message->compressed.insert(message->compressed.end(), row, row + kHeadDim);
        }
      }
      for (int32_t p = position; p < end; ++p) {
        const uint16_t* row = workload.SwaRow(session.salt, layer, p);
        message->kv.insert(message->kv.end(), row, row + kHeadDim);
        if (ratio == 4) workload.AppendTopK(session.salt, layer, p, &message->topk);
      }
      input.segments.push_back(std::move(segment));
    }
    const int64_t tokens = static_cast<int64_t>(group.sessions.size()) * setup_.tokens_per_step;
    input.q = workload.Query(Workload::MessageKey(setup_.seed, index_, step, layer, group.server),
                             tokens, setup_.heads);
    input.kv = message->kv;
    input.compressed_kv = message->compressed;
    input.topk = message->topk;
    const int64_t bytes =
        static_cast<int64_t>(input.q.size() + input.kv.size() + input.compressed_kv.size()) * 2 +
        static_cast<int64_t>(input.topk.size()) * 4;
    input.keep_alive = std::move(message);
    return BuiltAttend{std::move(input), tokens, bytes};
  }

  // Sends the group's part of layer step `seq` (its tensors first written
  // into the slot with a region); its payload bytes.
  absl::StatusOr<int64_t> SendAttend(Group& group, int64_t seq, BuiltAttend& built) {
    if (setup_.regions) {
      if (absl::Status status = MoveIntoRegion(group, seq, built.tokens, built.input);
          !status.ok()) {
        return status;
      }
    }
    absl::StatusOr<uint64_t> sent = group.attend->Send(built.input);
    if (!sent.ok()) return sent.status();
    return built.bytes;
  }

  // The tensor bytes the group's Attend message for this layer step carries
  // inline, without building it: all of them, or with a region (--data_plane=
  // shm|cuda_ipc) the top-k alone. Echo sends as many.
  int64_t EchoBytes(const Group& group, int64_t step, int layer) const {
    const int ratio = setup_.model->compress_ratio(layer);
    const int32_t position = setup_.prompt + static_cast<int32_t>(step) * setup_.tokens_per_step;
    const int64_t tokens = static_cast<int64_t>(group.sessions.size()) * setup_.tokens_per_step;
    const int64_t new_rows =
        ratio > 0 ? (position + setup_.tokens_per_step) / ratio - position / ratio : 0;
    int64_t bytes = setup_.regions ? 0
                               : tokens * (setup_.heads + 1) * kRowBytes +
                                     static_cast<int64_t>(group.sessions.size()) * new_rows *
                                         kRowBytes;
    if (ratio == 4) bytes += tokens * setup_.model->indexer_topk * 4;
    return bytes;
  }

  void SendLoop() {
    const int layers = setup_.layers;
    PoissonArrivals arrivals(plan_.open_loop ? plan_.rate_per_node : 1.0,
                             Mix(setup_.seed, 1000 + index_));
    Clock::time_point next_due = plan_.start;
    int64_t measured_issued = 0;
    {
      // Every node begins at the phase's start, which the warm-up counts from.
      std::unique_lock<std::mutex> lock(mutex_);
      cv_.wait_until(lock, plan_.start, [this] { return stop_; });
    }
    for (int64_t seq = 0;; ++seq) {
      const int64_t step = seq / layers;
      const int layer = static_cast<int>(seq % layers);
      const int64_t position = setup_.prompt + step * setup_.tokens_per_step;
      if (position + setup_.tokens_per_step > setup_.max_position) {
        SetStop(absl::StrCat("node ", index_, " reached the server's max_position ",
                             setup_.max_position));
        return;
      }
      Clock::time_point due;
      if (plan_.open_loop) {
        next_due += FromSeconds(arrivals.NextGapSeconds());
        // Nothing more is due in the window: do not sleep until the arrival.
        if (plan_.end.has_value() && next_due >= *plan_.end) return;
        std::unique_lock<std::mutex> lock(mutex_);
        cv_.wait_until(lock, next_due, [this] { return stop_; });
        if (stop_) return;
        due = next_due;
      } else {
        std::unique_lock<std::mutex> lock(mutex_);
        cv_.wait(lock, [this] { return stop_ || in_flight_ < plan_.concurrency; });
        if (stop_) return;
        due = Clock::now();
      }
      if (plan_.end.has_value() && due >= *plan_.end) return;
      const bool measured = due >= plan_.warm_end;
      if (measured && plan_.measured_steps > 0) {
        if (measured_issued >= plan_.measured_steps * layers) return;
        ++measured_issued;
      }
      const bool sample = plan_.kind == PhaseKind::kAttend && measured && plan_.verify_every > 0 &&
                          seq % plan_.verify_every == plan_.verify_every / 2 &&
                          samples_taken_ < VerifyBudget();
      {
        std::lock_guard<std::mutex> lock(mutex_);
        Pending& pending = pending_[seq];
        pending.step = step;
        pending.layer = layer;
        pending.due = due;
        pending.measured = measured;
        pending.remaining = static_cast<int>(groups_.size());
        pending.sample = sample;
        ++in_flight_;
        if (sample) ++samples_taken_;
      }
      ++live_->in_flight;
      // The messages are built before the closed loop's clock starts: a
      // serving node has its tensors when it sends, and making the
      // workload's (the top-k above all) is this tool's cost, not the
      // server's. The open loop counts from the arrival it drew.
      std::vector<BuiltAttend> built;
      if (plan_.kind == PhaseKind::kAttend) {
        for (const Group& group : groups_) built.push_back(BuildAttend(group, step, layer, sample));
        if (!plan_.open_loop) {
          std::lock_guard<std::mutex> lock(mutex_);
          pending_[seq].due = Clock::now();
        }
      }
      for (size_t g = 0; g < groups_.size(); ++g) {
        Group& group = groups_[g];
        absl::StatusOr<int64_t> bytes;
        if (plan_.kind == PhaseKind::kAttend) {
          bytes = SendAttend(group, seq, built[g]);
        } else {
          const int64_t size = EchoBytes(group, step, layer);
          const absl::Span<const uint8_t> payload = setup_.workload->Bytes(
              Workload::MessageKey(setup_.seed, index_, step, layer, group.server),
              static_cast<size_t>(size));
          absl::StatusOr<uint64_t> sent = group.echo->Send(payload);
          if (sent.ok()) {
            bytes = size;
          } else {
            bytes = sent.status();
          }
        }
        std::lock_guard<std::mutex> lock(mutex_);
        if (bytes.ok()) {
          pending_[seq].bytes_in += *bytes;
          pending_[seq].tokens +=
              static_cast<int64_t>(group.sessions.size()) * setup_.tokens_per_step;
          group.sent.push_back({seq, *bytes});
          cv_.notify_all();
        } else {
          // Never sent: this group's part is done, failed.
          CompleteLocked(seq, static_cast<int>(bytes.status().code()), Clock::now(), 0, {}, nullptr,
                         group);
          stop_ = true;
          if (stop_reason_.empty()) {
            stop_reason_ = absl::StrCat("node ", index_, ": ", bytes.status().message());
          }
        }
      }
    }
  }

  void ReceiveLoop(size_t g) {
    Group& group = groups_[g];
    while (true) {
      int64_t seq, bytes_in;
      {
        std::unique_lock<std::mutex> lock(mutex_);
        cv_.wait(lock, [&] { return !group.sent.empty() || sender_done_; });
        if (group.sent.empty()) return;
        std::tie(seq, bytes_in) = group.sent.front();
        group.sent.pop_front();
      }
      int code = 0;
      int64_t bytes_out = 0;
      wire::TimingView timing;
      std::optional<client::AttendResult> result;
      if (plan_.kind == PhaseKind::kAttend) {
        // Receive holds an OK answer to the [T, H, 512] of the message sent.
        absl::StatusOr<client::AttendResult> answer = group.attend->Receive();
        if (answer.ok()) {
          const int64_t rows = answer->num_tokens() * answer->num_heads();
          bytes_out = answer->in_regions()
                          ? rows * (answer->fp8_output() ? kFp8RowBytes + kFp8ScaleRowBytes
                                                         : kRowBytes)
                          : static_cast<int64_t>(answer->out_view().size_bytes() +
                                                 answer->out_scales().size());
          if (answer->has_lse() || (answer->in_regions() && Sampled(seq))) bytes_out += rows * 4;
          timing = answer->timing();
          result.emplace(*std::move(answer));
        } else {
          code = static_cast<int>(answer.status().code());
          NoteFailure(answer.status());
        }
      } else {
        absl::StatusOr<client::EchoResult> answer = group.echo->Receive();
        if (answer.ok() && static_cast<int64_t>(answer->size()) != bytes_in) {
          answer = absl::DataLossError(
              absl::StrCat("Echo sent ", bytes_in, " bytes and got ", answer->size(), " back"));
        }
        if (answer.ok()) {
          bytes_out = static_cast<int64_t>(answer->size());
        } else {
          code = static_cast<int>(answer.status().code());
          NoteFailure(answer.status());
        }
      }
      const Clock::time_point now = Clock::now();
      std::lock_guard<std::mutex> lock(mutex_);
      CompleteLocked(seq, code, now, bytes_out, timing, result.has_value() ? &*result : nullptr,
                     group);
    }
  }

  // Whether layer step `seq` was sampled for --verify (it asked for lse).
  bool Sampled(int64_t seq) {
    std::lock_guard<std::mutex> lock(mutex_);
    const auto it = pending_.find(seq);
    return it != pending_.end() && it->second.sample;
  }

  // This node's share of --verify_max.
  int VerifyBudget() const {
    return plan_.verify_max / plan_.streams + (index_ < plan_.verify_max % plan_.streams ? 1 : 0);
  }

  void NoteFailure(const absl::Status& status) {
    std::lock_guard<std::mutex> lock(mutex_);
    stop_ = true;
    if (stop_reason_.empty())
      stop_reason_ = absl::StrCat("node ", index_,
                                  " stopped at its first failed layer step: ", status.message());
    cv_.notify_all();
  }

  // Ends the phase for this node: nothing more is sent, what is in flight
  // is still received.
  void SetStop(const std::string& reason) {
    std::lock_guard<std::mutex> lock(mutex_);
    stop_ = true;
    if (stop_reason_.empty()) stop_reason_ = reason;
    cv_.notify_all();
  }

  // One group's answer to layer step `seq`; the step is recorded when it was
  // the last one.
  void CompleteLocked(int64_t seq, int code, Clock::time_point now, int64_t bytes_out,
                      const wire::TimingView& timing, client::AttendResult* result,
                      const Group& group) {
    auto it = pending_.find(seq);
    if (it == pending_.end()) return;
    Pending& p = it->second;
    if (code != 0 && p.code == 0) p.code = code;
    if (now >= p.done) {
      p.done = now;
      p.timing = timing;
    }
    p.bytes_out += bytes_out;
    if (p.sample && result != nullptr) {
      Sample sample{p.step, p.layer, group.server, head_offset_, group.sessions, std::move(*result)};
      if (sample.result.in_regions()) {
        // Copied before the slot takes a later step.
        const int64_t rows = sample.result.num_tokens() * sample.result.num_heads();
        const int64_t slot = SlotOf(group, seq);
        sample.region_lse.resize(rows);
        absl::Status read;
        if (setup_.fp8_output) {
          sample.region_e4m3.resize(rows * kFp8RowBytes);
          sample.region_scales.resize(rows * kFp8ScaleRowBytes);
          read = group.region->Read(slot + group.slot.out, sample.region_e4m3.data(),
                                    rows * kFp8RowBytes);
          if (read.ok()) {
            read = group.region->Read(slot + group.slot.scales, sample.region_scales.data(),
                                      rows * kFp8ScaleRowBytes);
          }
        } else {
          sample.region_out.resize(rows * kHeadDim);
          read = group.region->Read(slot + group.slot.out, sample.region_out.data(),
                                    rows * kRowBytes);
        }
        if (read.ok()) {
          read = group.region->Read(slot + group.slot.lse, sample.region_lse.data(), rows * 4);
        }
        if (!read.ok()) NoteFailure(read);
      }
      samples_.push_back(std::move(sample));
    }
    if (--p.remaining > 0) return;

    const int64_t latency_ns =
        std::chrono::duration_cast<std::chrono::nanoseconds>(p.done - p.due).count();
    if (p.code != 0) {
      ++stats_.errors[StatusCodeName(p.code)];
      ++live_->errors;
    } else if (p.measured) {
      stats_.latency.Record(latency_ns);
      stats_.latency_by_kind[std::string(LayerKindName(setup_.model->layer_kind(p.layer)))].Record(
          latency_ns);
      ++stats_.ok;
      stats_.tokens += p.tokens;
      stats_.bytes_in += p.bytes_in;
      stats_.bytes_out += p.bytes_out;
      if (plan_.kind == PhaseKind::kAttend) {
        const wire::TimingView& t = p.timing;
        stats_.server.Add(ServerTiming{1, t.queue_us, t.plan_us, t.upload_us, t.prologue_us,
                                       t.decode_us, t.readback_us, t.total_us,
                                       static_cast<double>(t.batch_tokens), t.serialize_us});
      }
      ++live_->ok;
    }
    if (p.code == 0) {
      ++live_->answered;
      std::lock_guard<std::mutex> live_lock(live_->mutex);
      live_->recent.Record(latency_ns);
    }
    if (p.measured) {
      if (!last_measured_done_.has_value() || p.done > *last_measured_done_)
        last_measured_done_ = p.done;
      StepRecord record;
      record.phase = plan_.kind == PhaseKind::kAttend ? 'a' : 'e';
      record.stream = index_;
      record.step = p.step;
      record.layer = p.layer;
      record.due_s = Seconds(p.due - plan_.warm_end);
      record.latency_us = p.code == 0 ? latency_ns / 1e3 : 0;
      record.code = p.code;
      record.tokens = static_cast<int32_t>(p.tokens);
      record.bytes_in = p.bytes_in;
      record.bytes_out = p.bytes_out;
      record.queue_us = static_cast<float>(p.timing.queue_us);
      record.prologue_us = static_cast<float>(p.timing.prologue_us);
      record.decode_us = static_cast<float>(p.timing.decode_us);
      record.server_total_us = static_cast<float>(p.timing.total_us);
      record.batch_tokens = p.timing.batch_tokens;
      record.plan_us = static_cast<float>(p.timing.plan_us);
      record.upload_us = static_cast<float>(p.timing.upload_us);
      record.readback_us = static_cast<float>(p.timing.readback_us);
      record.serialize_us = static_cast<float>(p.timing.serialize_us);
      records_.push_back(record);
    }
    pending_.erase(it);
    --in_flight_;
    --live_->in_flight;
    cv_.notify_all();
  }

  const int index_;
  const Setup& setup_;
  std::unique_ptr<client::Cluster> cluster_;
  const int head_offset_;
  int padded_heads_ = 0;
  std::vector<Group> groups_;

  PhasePlan plan_;
  Live* live_ = nullptr;
  std::mutex mutex_;
  std::condition_variable cv_;
  std::map<int64_t, Pending> pending_;
  int64_t in_flight_ = 0;
  int samples_taken_ = 0;
  bool stop_ = false;
  bool sender_done_ = false;
  std::string stop_reason_;
  PhaseStats stats_;
  std::vector<StepRecord> records_;
  std::vector<Sample> samples_;
  std::optional<Clock::time_point> last_measured_done_;
};

// KV blocks summed over the servers; *used and *total stay as they were
// when a server does not answer.
absl::Status ReadKv(client::Cluster& cluster, int64_t* used, int64_t* total) {
  int64_t used_sum = 0, total_sum = 0;
  for (int s = 0; s < cluster.size(); ++s) {
    absl::StatusOr<pb::ServerInfo> info = cluster.client(s).GetServerInfo();
    if (!info.ok()) return info.status();
    used_sum += info->kv_blocks_used();
    total_sum += info->kv_blocks_total();
  }
  *used = used_sum;
  *total = total_sum;
  return absl::OkStatus();
}

CloseCount CloseAllSessions(std::vector<std::unique_ptr<Node>>& nodes) {
  CloseCount count;
  for (auto& node : nodes) node->CloseSessions(count);
  return count;
}

// "closing sessions: 2 of 16 failed (...), first: NOT_FOUND: ..."; empty
// when none failed.
std::string CloseFailureText(const CloseCount& count) {
  if (count.failed == 0) return "";
  return absl::StrCat(
      "closing sessions: ", count.failed, " of ", count.sessions,
      " failed (the server may still hold their KV cache), first: ", count.first_error.ToString());
}

// A setup that cannot go on: closes what was created and says why, with
// what closing could not free.
absl::Status AbandonSetup(std::vector<std::unique_ptr<Node>>& nodes, const absl::Status& why) {
  const std::string close_failure = CloseFailureText(CloseAllSessions(nodes));
  if (close_failure.empty()) return why;
  return absl::Status(why.code(), absl::StrCat(why.message(), "; ", close_failure));
}

// Runs one phase on every node, with the progress line, and merges the
// stats. *interrupted_in_warm_up (when given): Ctrl-C came before the window
// began.
PhaseStats RunPhase(std::vector<std::unique_ptr<Node>>& nodes, PhasePlan plan,
                    const LoadOptions& options, const Setup& setup,
                    std::vector<StepRecord>* records, bool* interrupted_in_warm_up) {
  client::StreamOptions stream_options;
  stream_options.step_timeout = absl::Seconds(options.step_timeout_s);
  stream_options.max_in_flight = plan.open_loop ? 1024 : options.concurrency;
  stream_options.connections = options.connections_per_stream;
  Live live;
  plan.start = Clock::now() + std::chrono::milliseconds(20);
  plan.warm_end = plan.start + FromSeconds(options.warmup_s);
  if (options.steps == 0) plan.end = plan.warm_end + FromSeconds(options.duration_s);
  plan.measured_steps = options.steps;

  std::vector<std::thread> threads;
  std::atomic<int> running{static_cast<int>(nodes.size())};
  for (auto& node : nodes) {
    threads.emplace_back([&, n = node.get()] {
      n->Run(plan, stream_options, live);
      --running;
    });
  }
  ProgressDisplay display(options.progress_out, options.progress_tty);
  int64_t last_answered = 0;
  Clock::time_point last = Clock::now();
  std::optional<Clock::time_point> interrupted_at;
  while (running > 0) {
    std::this_thread::sleep_for(std::chrono::milliseconds(100));
    const Clock::time_point now = Clock::now();
    if (options.interrupted != nullptr && *options.interrupted && !interrupted_at.has_value()) {
      interrupted_at = now;
      for (auto& node : nodes) node->Interrupt();
    }
    if (!options.progress) continue;
    ProgressSnapshot snapshot;
    snapshot.phase = plan.kind == PhaseKind::kAttend ? "attend" : "echo baseline";
    snapshot.elapsed_s = std::max(0.0, Seconds(now - plan.start));
    snapshot.warming_up = now < plan.warm_end;
    snapshot.window_s = std::max(0.0, Seconds(now - plan.warm_end));
    snapshot.planned_s = options.steps == 0 ? options.duration_s : 0;
    snapshot.layer_steps = live.ok;
    snapshot.errors = live.errors;
    snapshot.in_flight = live.in_flight;
    snapshot.layers = setup.layers;
    const double interval = Seconds(now - last);
    if (interval >= (options.progress_tty ? 0.25 : 5.0)) {
      const int64_t answered = live.answered;
      snapshot.recent_rate = (answered - last_answered) / interval;
      std::lock_guard<std::mutex> lock(live.mutex);
      snapshot.recent_p50_ns = live.recent.Percentile(0.5);
      snapshot.recent_p99_ns = live.recent.Percentile(0.99);
      live.recent.Clear();
      last_answered = answered;
      last = now;
      display.Update(snapshot, Seconds(now.time_since_epoch()));
    }
  }
  for (std::thread& thread : threads) thread.join();
  display.Finish();

  PhaseStats merged;
  merged.name = plan.kind == PhaseKind::kAttend ? "attend" : "echo";
  std::optional<Clock::time_point> last_done;
  std::vector<std::string> reasons;
  size_t nodes_stopped = 0;
  for (auto& node : nodes) {
    if (!node->stop_reason().empty()) ++nodes_stopped;
    PhaseStats& s = node->stats();
    merged.ok += s.ok;
    merged.tokens += s.tokens;
    merged.bytes_in += s.bytes_in;
    merged.bytes_out += s.bytes_out;
    merged.latency.Merge(s.latency);
    for (const auto& [kind, latency] : s.latency_by_kind)
      merged.latency_by_kind[kind].Merge(latency);
    for (const auto& [code, count] : s.errors) merged.errors[code] += count;
    merged.server.Add(s.server);
    records->insert(records->end(), node->records().begin(), node->records().end());
    node->records().clear();
    if (!node->stop_reason().empty() &&
        std::find(reasons.begin(), reasons.end(), node->stop_reason()) == reasons.end()) {
      reasons.push_back(node->stop_reason());
    }
    if (node->last_measured_done().has_value() &&
        (!last_done.has_value() || *node->last_measured_done() > *last_done)) {
      last_done = node->last_measured_done();
    }
  }
  merged.server = merged.server.Mean();
  // The window lasts until the schedule ended (or was interrupted) and every
  // layer step due in it was answered: a server that falls behind stretches
  // it, and the rates fall with it.
  if (interrupted_in_warm_up != nullptr)
    *interrupted_in_warm_up = interrupted_at.has_value() && *interrupted_at < plan.warm_end;
  if (interrupted_at.has_value() && (!plan.end.has_value() || *interrupted_at < *plan.end)) {
    merged.planned_seconds = std::max(0.0, Seconds(*interrupted_at - plan.warm_end));
  } else if (plan.end.has_value()) {
    merged.planned_seconds = options.duration_s;
  }
  // Every node stopped before the schedule ended: the window ends with the
  // last answer, or the rates would count time in which nothing was sent.
  merged.stopped_early = !nodes.empty() && nodes_stopped == nodes.size();
  if (merged.stopped_early && last_done.has_value()) {
    merged.planned_seconds =
        std::min(merged.planned_seconds, std::max(0.0, Seconds(*last_done - plan.warm_end)));
  }
  merged.seconds = std::max(merged.planned_seconds,
                            last_done.has_value() ? Seconds(*last_done - plan.warm_end) : 0.0);
  if (!reasons.empty()) {
    merged.stop_reason = absl::StrJoin(reasons, "; ");
  } else {
    merged.stop_reason = options.steps > 0
                             ? absl::StrCat("--steps=", options.steps, " per node")
                             : absl::StrCat("--duration_s=", options.duration_s);
  }
  return merged;
}

VerifyStats VerifySamples(std::vector<std::unique_ptr<Node>>& nodes, const LoadOptions& options,
                          const Setup& setup) {
  VerifyStats stats;
  stats.enabled = true;
  Verifier verifier(*setup.workload, options.verify_threads);
  const ModelProfile& model = *setup.model;
  std::set<std::tuple<int, int64_t, int>> layer_steps;  // (node, step, layer)
  for (auto& node : nodes) {
    for (Sample& sample : node->samples()) {
      layer_steps.insert({node->index(), sample.step, sample.layer});
      const int64_t tokens = static_cast<int64_t>(sample.sessions.size()) * setup.tokens_per_step;
      const absl::Span<const uint16_t> q = setup.workload->Query(
          Workload::MessageKey(setup.seed, node->index(), sample.step, sample.layer, sample.server),
          tokens, setup.heads);
      const absl::Span<const uint16_t> out = sample.out();
      const absl::Span<const uint8_t> e4m3 = sample.e4m3();
      const absl::Span<const uint8_t> scales = sample.scales();
      const absl::Span<const float> lse = sample.lse();
      const int64_t checked = std::min<int64_t>(tokens, options.verify_tokens);
      for (int64_t i = 0; i < checked; ++i) {
        const int64_t t = i * tokens / checked;  // spread over the message
        SentToken token;
        token.layer = sample.layer;
        token.heads = setup.heads;
        token.head_offset = sample.head_offset;
        token.derotate = setup.derotate;
        token.fp8_output = setup.fp8_output;
        token.salt = sample.sessions[t / setup.tokens_per_step].salt;
        token.position = setup.prompt + static_cast<int32_t>(sample.step) * setup.tokens_per_step +
                         static_cast<int32_t>(t % setup.tokens_per_step);
        const size_t row = static_cast<size_t>(t) * setup.heads * kHeadDim;
        token.q = q.subspan(row, static_cast<size_t>(setup.heads) * kHeadDim);
        if (model.compress_ratio(sample.layer) == 4) {
          setup.workload->AppendTopK(token.salt, sample.layer, token.position, &token.topk);
        }
        ++stats.tokens;
        const size_t values = static_cast<size_t>(tokens) * setup.heads;
        const size_t head_values = static_cast<size_t>(setup.heads) * kHeadDim;
        const absl::Span<const float> token_lse =
            lse.subspan(static_cast<size_t>(t) * setup.heads, setup.heads);
        const size_t out_values = setup.fp8_output ? e4m3.size() : out.size();
        const bool shape_ok =
            out_values == values * kHeadDim && lse.size() == values &&
            (!setup.fp8_output || scales.size() == values * kOutputQuantBlocks);
        absl::StatusOr<TokenVerdict> verdict =
            !shape_ok ? absl::InternalError(absl::StrCat("the answer holds ", out_values,
                                                         " out and ", lse.size(),
                                                         " lse values for ", tokens, " tokens"))
            : setup.fp8_output
                ? verifier.CheckFp8(token, e4m3.subspan(row, head_values),
                                    scales.subspan(static_cast<size_t>(t) * setup.heads *
                                                       kOutputQuantBlocks,
                                                   static_cast<size_t>(setup.heads) *
                                                       kOutputQuantBlocks),
                                    token_lse)
                : verifier.Check(token, out.subspan(row, head_values), token_lse);
        std::string failure;
        if (!verdict.ok()) {
          failure = std::string(verdict.status().message());
        } else {
          stats.max_excess = std::max(stats.max_excess, verdict->max_excess);
          stats.bit_identical += verdict->bit_identical;
          if (!verdict->ok) failure = verdict->failure;
        }
        if (!failure.empty()) {
          ++stats.failed_tokens;
          if (stats.first_failure.empty()) {
            stats.first_failure =
                absl::StrCat("node ", node->index(), " step ", sample.step, " layer ", sample.layer,
                             " token ", t, ": ", failure);
          }
        }
      }
    }
    node->samples().clear();
  }
  stats.layer_steps = static_cast<int64_t>(layer_steps.size());
  return stats;
}

}  // namespace

absl::Status ValidateOptions(const LoadOptions& o) {
  auto bad = [](const std::string& text) { return absl::InvalidArgumentError(text); };
  if (o.targets.empty()) return bad("--target: give at least one HOST:PORT");
  std::set<std::string> seen;
  for (const std::string& target : o.targets) {
    const size_t colon = target.rfind(':');
    if (colon == std::string::npos || colon == 0 || colon + 1 == target.size()) {
      return bad(absl::StrCat("--target=", target, ": expected HOST:PORT"));
    }
    if (!seen.insert(target).second)
      return bad(absl::StrCat("--target=", target, " is given twice"));
  }
  absl::StatusOr<const ModelProfile*> model = FindModelProfile(o.model);
  if (!model.ok()) return bad(absl::StrCat("--model: ", model.status().message()));
  if (o.tp < 1 || (*model)->num_query_heads % o.tp != 0) {
    return bad(absl::StrCat("--tp=", o.tp, ": must divide the ", (*model)->num_query_heads,
                            " heads of ", o.model));
  }
  if (o.layers < 0 || o.layers > (*model)->num_attention_layers()) {
    return bad(
        absl::StrCat("--layers=", o.layers, ": 0 (all) to ", (*model)->num_attention_layers()));
  }
  if (o.streams < 1) return bad("--streams must be at least 1");
  if (o.sessions < 1) return bad("--sessions must be at least 1");
  if (o.tokens_per_step < 1 || o.tokens_per_step > 129) return bad("--tokens_per_step: 1 to 129");
  if (o.prompt < 0) return bad("--prompt must not be negative");
  if (o.concurrency < 1) return bad("--concurrency must be at least 1");
  if (o.data_plane != "inline" && o.data_plane != "shm" && o.data_plane != "cuda_ipc") {
    return bad(absl::StrCat("--data_plane=", o.data_plane, ": give inline, shm or cuda_ipc"));
  }
  if (o.data_plane != "inline" && o.rate > 0) {
    return bad(absl::StrCat("--data_plane=", o.data_plane,
                            " runs the closed loop only (a node's region holds --concurrency "
                            "layer steps): drop --rate"));
  }
  if (o.cuda_device < 0) return bad("--cuda_device must not be negative");
  if (o.connections_per_stream < 1 || o.connections_per_stream > client::kMaxStreamConnections) {
    return bad(absl::StrCat("--connections_per_stream=", o.connections_per_stream, ": give 1 to ",
                            client::kMaxStreamConnections));
  }
  // `!(x <= max)` and `!(x >= 0)` hold for NaN too.
  if (!(o.rate >= 0 && o.rate <= kMaxRate)) {
    return bad(absl::StrCat("--rate=", o.rate, ": give 0 (closed loop) or a rate up to ", kMaxRate,
                            " layer steps/s"));
  }
  if (!(o.warmup_s >= 0 && o.warmup_s <= kMaxWaitSeconds)) {
    return bad(
        absl::StrCat("--warmup_s=", o.warmup_s, ": give 0 to ", kMaxWaitSeconds, " seconds"));
  }
  if (o.steps < 0) return bad("--steps must not be negative");
  if (!std::isfinite(o.duration_s) || o.duration_s > kMaxDurationSeconds ||
      (o.steps == 0 && o.duration_s <= 0)) {
    return bad(absl::StrCat("--duration_s=", o.duration_s, ": give more than 0 and at most ",
                            kMaxDurationSeconds, " seconds (a week), or bound the run by --steps"));
  }
  if (o.verify && (o.verify_every < 1 || o.verify_max < 1 || o.verify_tokens < 1)) {
    return bad("--verify_every, --verify_max and --verify_tokens must be at least 1");
  }
  if (!(o.step_timeout_s > 0 && o.step_timeout_s <= kMaxWaitSeconds)) {
    return bad(absl::StrCat("--step_timeout_s=", o.step_timeout_s,
                            ": give more than 0 and at most ", kMaxWaitSeconds, " seconds"));
  }
  return absl::OkStatus();
}

absl::StatusOr<RunOutput> RunLoadTest(const LoadOptions& options) {
  if (absl::Status status = ValidateOptions(options); !status.ok()) return status;
  const ModelProfile* model = *FindModelProfile(options.model);
  Setup setup;
  setup.model = model;
  setup.heads = model->num_query_heads / options.tp;
  setup.layers = options.layers == 0 ? model->num_attention_layers() : options.layers;
  setup.tokens_per_step = options.tokens_per_step;
  setup.prompt = options.prompt;
  setup.seed = options.seed;
  setup.derotate = options.derotate;
  setup.fp8_output = options.fp8_output;
  setup.regions = options.data_plane != "inline";
  setup.cuda_ipc = options.data_plane == "cuda_ipc";
  setup.cuda_device = options.cuda_device;
  setup.write_every_step = !setup.cuda_ipc || options.verify;
  setup.concurrency = options.concurrency;

  RunOutput output;
  RunReport& report = output.report;
  RunConfig& config = report.config;
  config.targets = options.targets;
  config.model = model->name;
  config.tp = options.tp;
  config.heads = setup.heads;
  config.layers = setup.layers;
  config.model_layers = model->num_attention_layers();
  config.streams = options.streams;
  config.sessions = options.sessions;
  config.tokens_per_step = options.tokens_per_step;
  config.prompt = options.prompt;
  config.mode = options.rate > 0 ? "open" : "closed";
  config.concurrency = options.concurrency;
  config.connections_per_stream = options.connections_per_stream;
  config.data_plane = options.data_plane;
  config.fp8_output = options.fp8_output;
  config.rate = options.rate;
  config.warmup_s = options.warmup_s;
  config.duration_s = options.steps == 0 ? options.duration_s : 0;
  config.steps = options.steps;

  // What the servers run and hold.
  absl::StatusOr<std::unique_ptr<client::Cluster>> probe =
      client::Cluster::Connect(options.targets, options.connect);
  if (!probe.ok()) return probe.status();
  std::set<std::string> versions, backends;
  setup.max_position = INT32_MAX;
  for (int s = 0; s < (*probe)->size(); ++s) {
    absl::StatusOr<pb::ServerInfo> info = (*probe)->client(s).GetServerInfo();
    if (!info.ok()) return info.status();
    bool serves = false;
    for (const pb::ModelInfo& m : info->models()) serves |= m.name() == model->name;
    if (!serves) {
      return absl::FailedPreconditionError(
          absl::StrCat((*probe)->target(s), " does not serve --model=", model->name));
    }
    versions.insert(info->version());
    backends.insert(info->backend());
    setup.max_position = std::min(setup.max_position, info->max_position());
    report.kv.block_tokens = info->kv_block_tokens();
    report.kv.bytes_per_token = info->kv_bytes_per_token();
  }
  report.kv.block_bytes = kBlockBytes;
  config.server_version = absl::StrJoin(versions, " | ");
  config.backend = absl::StrJoin(backends, " | ");
  if (absl::Status s = ReadKv(**probe, &report.kv.used_at_start, &report.kv.blocks_total); !s.ok())
    return s;

  const int64_t tokens = int64_t{options.sessions} * options.tokens_per_step;
  const Workload workload(*model, std::max<int64_t>(8192, 2 * tokens * (setup.heads + 8)),
                          options.seed);
  setup.workload = &workload;

  // Nodes, sessions, prompts (untimed; nodes in parallel).
  std::vector<std::unique_ptr<Node>> nodes;
  for (int n = 0; n < options.streams; ++n) {
    client::ConnectOptions node_connect = options.connect;
    node_connect.own_connection = options.connection_per_node;
    absl::StatusOr<std::unique_ptr<client::Cluster>> cluster =
        client::Cluster::Connect(options.targets, node_connect);
    if (!cluster.ok()) return cluster.status();
    nodes.push_back(std::make_unique<Node>(n, setup, *std::move(cluster), options.tp));
  }
  // A failing node, or Ctrl-C, stops every node's setup at its next session
  // or prompt chunk.
  std::atomic<bool> setup_failed{false};
  auto interrupted = [&options] { return options.interrupted != nullptr && *options.interrupted; };
  auto stop_setup = [&] { return setup_failed || interrupted(); };
  const Clock::time_point prompt_start = Clock::now();
  {
    std::vector<absl::Status> statuses(nodes.size());
    std::vector<std::thread> threads;
    for (size_t n = 0; n < nodes.size(); ++n) {
      threads.emplace_back([&, n] {
        statuses[n] = nodes[n]->CreateSessions(options.sessions, stop_setup);
        if (!statuses[n].ok()) setup_failed = true;
      });
    }
    for (std::thread& thread : threads) thread.join();
    for (const absl::Status& status : statuses) {
      if (!status.ok()) {
        return AbandonSetup(
            nodes, absl::Status(status.code(),
                                absl::StrCat("creating sessions and prompts: ", status.message())));
      }
    }
  }
  for (auto& node : nodes) {
    if (!setup.regions || interrupted()) break;
    if (absl::Status status = node->CreateRegions(); !status.ok()) {
      return AbandonSetup(
          nodes, absl::Status(status.code(), absl::StrCat("--data_plane=", options.data_plane,
                                                          ": making a node's region: ",
                                                          status.message())));
    }
  }
  if (interrupted()) {
    return AbandonSetup(nodes, absl::CancelledError(absl::StrCat(
                                   "interrupted while creating sessions and appending prompts: ",
                                   kNothingMeasured)));
  }
  report.prompt_seconds = Seconds(Clock::now() - prompt_start);
  config.padded_heads = nodes.front()->padded_heads();
  config.sessions_per_target.assign(options.targets.size(), 0);
  for (auto& node : nodes) {
    for (const Group& group : node->groups())
      config.sessions_per_target[group.server] += group.sessions.size();
  }
  if (absl::Status s = ReadKv(**probe, &report.kv.used_after_prompt, &report.kv.blocks_total);
      !s.ok()) {
    return AbandonSetup(nodes, s);
  }

  PhasePlan plan;
  plan.kind = PhaseKind::kAttend;
  plan.open_loop = options.rate > 0;
  plan.concurrency = options.concurrency;
  plan.rate_per_node = options.rate / options.streams;
  plan.streams = options.streams;
  if (options.verify) {
    plan.verify_every = options.verify_every;
    plan.verify_max = options.verify_max;
  }
  bool interrupted_in_warm_up = false;
  report.attend =
      RunPhase(nodes, plan, options, setup, &output.records, &interrupted_in_warm_up);
  if (interrupted_in_warm_up) {
    return AbandonSetup(nodes, absl::CancelledError(absl::StrCat("interrupted during the warm-up: ",
                                                                 kNothingMeasured)));
  }
  // The window has run: whatever fails from here on goes into the report
  // (cleanup_errors), never instead of it.
  if (absl::Status s = ReadKv(**probe, &report.kv.used_at_end, &report.kv.blocks_total); !s.ok()) {
    report.kv.used_at_end = -1;
    report.cleanup_errors.push_back(
        absl::StrCat("reading KV use after the window: ", s.ToString()));
  }

  if (options.baseline && !interrupted()) {
    PhasePlan echo = plan;
    echo.kind = PhaseKind::kEcho;
    echo.verify_every = 0;
    report.echo = RunPhase(nodes, echo, options, setup, &output.records, nullptr);
  }
  if (options.verify) report.verify = VerifySamples(nodes, options, setup);

  if (const std::string failure = CloseFailureText(CloseAllSessions(nodes)); !failure.empty())
    report.cleanup_errors.push_back(failure);
  if (absl::Status s = ReadKv(**probe, &report.kv.used_after_close, &report.kv.blocks_total);
      !s.ok()) {
    report.kv.used_after_close = -1;
    report.cleanup_errors.push_back(
        absl::StrCat("reading KV use after closing the sessions: ", s.ToString()));
  }
  return output;
}

}  // namespace mla::loadtest

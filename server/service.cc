#include "server/service.h"

#include <algorithm>
#include <chrono>
#include <climits>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/time/clock.h"
#include "absl/time/time.h"
#include "kernels/geometry.h"
#include "kernels/head_padding.h"
#include "proto/attend_codec.h"
#include "proto/unary_codec.h"

namespace mla {
namespace {

namespace pb = ::mla_offload::v1;

// gRPC sends a status message in the trailers, whose size is limited (8 KiB
// by default); a longer message would replace the real error with "metadata
// size exceeds limit". Messages echo client text only in bounded form
// (EchoClientText), so this cut is a second line of defence.
constexpr size_t kMaxStatusMessageBytes = 2048;

std::string BoundedMessage(absl::string_view message) {
  if (message.size() <= kMaxStatusMessageBytes) return std::string(message);
  return absl::StrCat(message.substr(0, kMaxStatusMessageBytes), "... (",
                      message.size() - kMaxStatusMessageBytes, " more bytes)");
}

// The draining refusal of a method a draining server still serves.
constexpr absl::string_view kServedWhileDraining;

grpc::Status ToGrpc(const absl::Status& status) {
  return grpc::Status(static_cast<grpc::StatusCode>(status.code()), BoundedMessage(status.message()));
}

absl::Status TooLarge(absl::string_view what, size_t bytes, int64_t limit) {
  return absl::ResourceExhaustedError(absl::StrCat(
      what, " of ", bytes, " bytes is above the server's limit of ", limit,
      " bytes (--max_message_mb); send less in one message (split the prompt over several "
      "AppendKV calls, or the tokens over several Attend messages)"));
}

// DEADLINE_EXCEEDED or CANCELLED when the client no longer waits for the
// call: then the engine must not start it.
absl::Status StillWanted(const grpc::CallbackServerContext& context) {
  if (context.deadline() <= std::chrono::system_clock::now()) {
    return absl::DeadlineExceededError(
        "the call's deadline passed before the server could start it; nothing was done");
  }
  if (context.IsCancelled()) {
    return absl::CancelledError("the call was cancelled before the server started it; nothing was done");
  }
  return absl::OkStatus();
}

grpc::ByteBuffer ErrorResponse(uint64_t request_id, const absl::Status& status) {
  wire::AttendResponseView response;
  response.request_id = request_id;
  response.status = wire::RequestStatusView{static_cast<int32_t>(status.code()),
                                            BoundedMessage(status.message())};
  return wire::SerializeAttendResponse(response);
}

// An answer written into the client's regions carries no tensors. The
// timing says how long writing the answer took (up to the timing itself).
grpc::ByteBuffer ResultResponse(const AttendResult& result, bool in_regions) {
  if (!result.status.ok()) return ErrorResponse(result.request_id, result.status);
  const auto start = std::chrono::steady_clock::now();
  wire::AttendResponseView response;
  response.request_id = result.request_id;
  response.timing = result.timing;
  if (!in_regions) {
    response.out = wire::MakeTensorView(
        result.fp8_output ? wire::DType::kE4m3fn : wire::DType::kBf16,
        {result.num_tokens, result.num_heads, kHeadDim}, result.out, result.out_bytes(),
        result.keep_alive);
    if (result.out_scales != nullptr) {
      response.out_scales = wire::MakeTensorView(
          wire::DType::kUe8m0, {result.num_tokens, result.num_heads, kOutputQuantBlocks},
          result.out_scales, result.out_scales_bytes(), result.keep_alive);
    }
    if (result.lse != nullptr) {
      response.lse = wire::MakeTensorView(wire::DType::kF32, {result.num_tokens, result.num_heads},
                                          result.lse, result.lse_bytes(), result.keep_alive);
    }
  }
  return wire::SerializeAttendResponse(response, [start](wire::TimingView& timing) {
    timing.serialize_us = std::chrono::duration<double, std::micro>(
                              std::chrono::steady_clock::now() - start)
                              .count();
  });
}

// The KV blocks a new session of `model` takes (its SWA rings); 0 for a
// model the server does not serve (the engine refuses it).
int64_t SessionBlocks(const Engine& engine, const std::string& model) {
  for (const ModelProfile* profile : engine.options().models) {
    if (profile->name == model) return int64_t{profile->num_attention_layers()} * kSwaRingBlocks;
  }
  return 0;
}

}  // namespace

// One Attend stream. Reads run ahead of writes by up to
// max_messages_in_flight messages, and only while the stream's unanswered
// bytes (requests read and not yet answered, answers not yet written) are
// below max_unanswered_bytes: a client that does not read its answers stops
// the stream's reads, and gRPC's flow control then stops its writes. Answers
// are written in message order whatever order the engine finishes them in.
// The reactor deletes itself once gRPC is done with it and the engine holds
// no callback into it.
class MlaOffloadService::AttendReactor final
    : public grpc::ServerBidiReactor<grpc::ByteBuffer, grpc::ByteBuffer> {
 public:
  AttendReactor(MlaOffloadService& service, const grpc::CallbackServerContext& context,
                Caller caller)
      : service_(service),
        context_(context),
        caller_(std::move(caller)),
        owner_(RegionOwnerOf(context, caller_.tenant)) {
    service_.metrics_.StreamOpened();
    service_.open_streams_.fetch_add(1);
    if (owner_.ok()) service_.region_owners_.StreamOpened(*owner_);
    reading_ = true;
    if (service_.options_.before_read_attend) service_.options_.before_read_attend(0);
    StartRead(&read_buffer_);
  }

  void OnReadDone(bool ok) override {
    if (!ok) {
      std::unique_lock<std::mutex> lock(mutex_);
      reading_ = false;
      reads_done_ = true;
      Proceed(lock);
      return;
    }
    uint64_t sequence;
    // The message leaves read_buffer_ here, but reading_ stays true until it
    // is queued: no other read can start, so no later message of this
    // stream can reach the scheduler before it.
    grpc::ByteBuffer received;
    int64_t request_bytes;
    {
      std::lock_guard<std::mutex> lock(mutex_);
      received.Swap(&read_buffer_);
      request_bytes = static_cast<int64_t>(received.Length());
      sequence = next_sequence_++;
      ++unanswered_;
      ++engine_pending_;
      request_bytes_ += request_bytes;
    }
    service_.metrics_.AddUnansweredBytes(request_bytes);
    const int64_t limit = service_.options_.max_message_bytes;
    absl::StatusOr<wire::AttendRequestView> view =
        received.Length() > static_cast<size_t>(limit)
            ? absl::StatusOr<wire::AttendRequestView>(
                  TooLarge("this Attend message", received.Length(), limit))
            : wire::ParseAttendRequest(
                  received, static_cast<size_t>(limit),
                  static_cast<size_t>(service_.options_.max_segments_per_message));
    absl::Status status = view.status();
    const uint64_t request_id = view.ok() ? view->request_id : wire::LeadingRequestId(received);
    if (status.ok()) status = CheckCaller(*view);
    absl::StatusOr<std::optional<AnswerRegions>> answer_regions = std::nullopt;
    if (status.ok() && UsesRegions(*view)) answer_regions = ResolveRegions(*view);
    if (status.ok()) status = answer_regions.status();
    if (status.ok()) {
      if (service_.options_.before_queue_attend) service_.options_.before_queue_attend(sequence);
      const bool in_regions = answer_regions->has_value();
      status = service_.scheduler_.SubmitAttend(
          std::make_shared<const ReceivedAttend>(
              ReceivedAttend{*std::move(view), service_.scheduler_.Now(),
                             *std::move(answer_regions), AdmitPages()}),
          [this, sequence, request_bytes, in_regions](AttendResult result) {
            service_.metrics_.RecordAttend(result);
            service_.refusals_.Note("Attend", result.status);
            Deliver(sequence, request_bytes, ResultResponse(result, in_regions));
          },
          stream_tag_);
    }
    if (!status.ok()) {
      service_.metrics_.RecordRequest("Attend", status.code());
      service_.refusals_.Note("Attend", status);
      Deliver(sequence, request_bytes, ErrorResponse(request_id, status));
    }
    std::unique_lock<std::mutex> lock(mutex_);
    reading_ = false;
    Proceed(lock);
  }

  void OnWriteDone(bool ok) override {
    std::unique_lock<std::mutex> lock(mutex_);
    writing_ = false;
    --unanswered_;
    answer_bytes_ -= writing_bytes_;
    service_.metrics_.AddUnansweredBytes(-writing_bytes_);
    if (!ok) Break();
    Proceed(lock);
  }

  void OnCancel() override {
    std::unique_lock<std::mutex> lock(mutex_);
    Break();
    Proceed(lock);
  }

  void OnDone() override {
    service_.metrics_.StreamClosed();
    service_.open_streams_.fetch_sub(1);
    service_.tenants_.StreamClosed(caller_.tenant);
    if (owner_.ok()) service_.region_owners_.StreamClosed(*owner_);
    stream_tag_->cancelled.store(true);
    std::unique_lock<std::mutex> lock(mutex_);
    done_ = true;
    // Answers never to be written (gRPC has finished every write by now).
    service_.metrics_.AddUnansweredBytes(-answer_bytes_);
    answer_bytes_ = 0;
    ready_.clear();
    const bool last = engine_pending_ == 0;
    lock.unlock();
    if (last) delete this;
  }

 private:
  // UNAUTHENTICATED once the stream's token is no longer valid (the
  // tokens file changed since the stream opened: a revoked token stops a
  // stream at its next message), NOT_FOUND when the message names a session
  // of another tenant.
  absl::Status CheckCaller(const wire::AttendRequestView& view) const {
    if (service_.options_.auth != nullptr) {
      absl::StatusOr<Caller> now = service_.CallerOf(context_);
      if (!now.ok()) return now.status();
      if (now->tenant != caller_.tenant) {
        return absl::UnauthenticatedError(
            "this stream's token names another tenant since the tokens file changed; open a "
            "new stream");
      }
    }
    for (size_t s = 0; s < view.segments.size(); ++s) {
      if (absl::Status status = service_.tenants_.CheckAccess(caller_, view.segments[s].session_id,
                                                              /*operator_may=*/false);
          !status.ok()) {
        // Worded as the planner words a session it does not know, so that
        // another tenant's session reads as none.
        return InSegment(s, status);
      }
    }
    return absl::OkStatus();
  }

  // The tenant's KV block limit for the pages a message's new compressed
  // rows take (Tenants::AdmitBlocks); null without authentication, where
  // the pool alone bounds them.
  AdmitAttendPages AdmitPages() const {
    if (service_.options_.auth == nullptr) return nullptr;
    return [&tenants = service_.tenants_, tenant = caller_.tenant](
               int64_t new_pages, absl::FunctionRef<std::vector<SessionSummary>()> sessions) {
      return tenants.AdmitBlocks(tenant, new_pages, sessions);
    };
  }

  // The message's region references resolved for this stream's client
  // (who may not own regions: then that is the error).
  absl::StatusOr<std::optional<AnswerRegions>> ResolveRegions(wire::AttendRequestView& view) {
    if (!owner_.ok()) return owner_.status();
    return ResolveRegionReferences(service_.regions_, *owner_, view);
  }

  // The client is gone: nothing more is written, and messages still queued
  // are answered CANCELLED without running. Called with mutex_ held.
  void Break() {
    broken_ = true;
    stream_tag_->cancelled.store(true);
  }

  // An answer for message `sequence` (of `request_bytes`) is ready (from the
  // engine thread, or from OnReadDone for a message that never reached the
  // engine).
  void Deliver(uint64_t sequence, int64_t request_bytes, grpc::ByteBuffer response) {
    std::unique_lock<std::mutex> lock(mutex_);
    --engine_pending_;
    request_bytes_ -= request_bytes;
    const int64_t answer_bytes = done_ ? 0 : static_cast<int64_t>(response.Length());
    answer_bytes_ += answer_bytes;
    service_.metrics_.AddUnansweredBytes(answer_bytes - request_bytes);
    if (done_) {
      const bool last = engine_pending_ == 0;
      lock.unlock();
      if (last) delete this;
      return;
    }
    ready_.emplace(sequence, std::move(response));
    Proceed(lock);
  }

  // Starts whatever can start now: the next write in order, the next read,
  // or the end of the call. gRPC operations start after the lock is released.
  void Proceed(std::unique_lock<std::mutex>& lock) {
    bool start_write = false, start_read = false, finish = false;
    uint64_t read_sequence = 0;
    grpc::Status final_status = grpc::Status::OK;
    if (broken_) {
      if (!finished_ && !writing_) {
        finished_ = finish = true;
        final_status = grpc::Status(grpc::StatusCode::CANCELLED, "the client went away");
      }
    } else {
      auto next = ready_.find(next_write_);
      if (!writing_ && next != ready_.end()) {
        write_buffer_ = std::move(next->second);
        writing_bytes_ = static_cast<int64_t>(write_buffer_.Length());
        ready_.erase(next);
        ++next_write_;
        writing_ = start_write = true;
      }
      if (!reading_ && !reads_done_ &&
          unanswered_ < service_.options_.max_messages_in_flight) {
        // A message larger than the bound is still read when nothing else
        // is unanswered.
        if (request_bytes_ + answer_bytes_ < service_.options_.max_unanswered_bytes) {
          reading_ = start_read = true;
          read_sequence = next_sequence_;
          read_paused_ = false;
        } else if (!read_paused_) {
          read_paused_ = true;
          service_.metrics_.RecordReadPause();
        }
      }
      if (reads_done_ && unanswered_ == 0 && !writing_ && !finished_) {
        finished_ = finish = true;
      }
    }
    lock.unlock();
    if (start_write) StartWrite(&write_buffer_);
    if (start_read) {
      if (service_.options_.before_read_attend) service_.options_.before_read_attend(read_sequence);
      StartRead(&read_buffer_);
    }
    if (finish) Finish(final_status);
  }

  MlaOffloadService& service_;
  const grpc::CallbackServerContext& context_;  // valid until OnDone
  const Caller caller_;
  const absl::StatusOr<std::string> owner_;  // of the regions its messages name
  const std::shared_ptr<AttendStreamTag> stream_tag_ = std::make_shared<AttendStreamTag>();
  grpc::ByteBuffer read_buffer_;
  grpc::ByteBuffer write_buffer_;
  std::mutex mutex_;
  std::map<uint64_t, grpc::ByteBuffer> ready_;
  uint64_t next_sequence_ = 0;  // of the next message read
  uint64_t next_write_ = 0;     // sequence of the next answer to write
  int unanswered_ = 0;          // read, answer not yet written
  int engine_pending_ = 0;      // read, answer not yet delivered
  int64_t request_bytes_ = 0;   // of the messages read, answer not yet delivered
  int64_t answer_bytes_ = 0;    // of the answers delivered, not yet written
  int64_t writing_bytes_ = 0;   // of the answer being written
  bool read_paused_ = false;    // reads wait for writes (bytes at the bound)
  bool reading_ = false;
  bool writing_ = false;
  bool reads_done_ = false;
  bool broken_ = false;
  bool finished_ = false;
  bool done_ = false;
};

// Echo: writes every message back unchanged, one at a time: the next read
// starts once the answer is written, so a stream holds at most one message
// (a client that does not read stops it after one). Counted among
// the open streams, so that a drain lets it end as it lets Attend streams.
class MlaOffloadService::EchoReactor final
    : public grpc::ServerBidiReactor<grpc::ByteBuffer, grpc::ByteBuffer> {
 public:
  EchoReactor(MlaOffloadService& service, Caller caller)
      : service_(service), caller_(std::move(caller)) {
    service_.open_streams_.fetch_add(1);
    StartRead(&buffer_);
  }
  void OnReadDone(bool ok) override {
    if (!ok) {
      Finish(grpc::Status::OK);
      return;
    }
    bytes_ = static_cast<int64_t>(buffer_.Length());
    service_.metrics_.AddUnansweredBytes(bytes_);
    StartWrite(&buffer_);
  }
  void OnWriteDone(bool ok) override {
    service_.metrics_.AddUnansweredBytes(-bytes_);
    if (!ok) {
      Finish(grpc::Status(grpc::StatusCode::CANCELLED, "the client went away"));
      return;
    }
    service_.metrics_.RecordRequest("Echo", absl::StatusCode::kOk);
    buffer_.Clear();
    StartRead(&buffer_);
  }
  void OnDone() override {
    service_.open_streams_.fetch_sub(1);
    service_.tenants_.StreamClosed(caller_.tenant);
    delete this;
  }

 private:
  MlaOffloadService& service_;
  const Caller caller_;
  grpc::ByteBuffer buffer_;
  int64_t bytes_ = 0;  // of the message in buffer_
};

// A stream refused before its first read (not authenticated, or past its
// tenant's stream limit): it ends with the status at once.
class MlaOffloadService::RefusedStream final
    : public grpc::ServerBidiReactor<grpc::ByteBuffer, grpc::ByteBuffer> {
 public:
  RefusedStream(MlaOffloadService& service, const char* method, const absl::Status& status) {
    service.metrics_.RecordRequest(method, status.code());
    service.refusals_.Note(method, status);
    Finish(ToGrpc(status));
  }
  void OnDone() override { delete this; }
};

MlaOffloadService::MlaOffloadService(Scheduler& scheduler, ServerMetrics& metrics,
                                     const ServiceOptions& options)
    : scheduler_(scheduler),
      metrics_(metrics),
      options_(options),
      regions_(options.regions),
      tenants_(options.tenants, /*authenticated=*/options.auth != nullptr),
      connections_(options.max_connections) {}

absl::StatusOr<Caller> MlaOffloadService::CallerOf(const grpc::CallbackServerContext& context) const {
  if (options_.auth == nullptr) return Caller{};
  return options_.auth->Authenticate(context);
}

absl::StatusOr<Caller> MlaOffloadService::OpenStream(const grpc::CallbackServerContext& context) {
  absl::StatusOr<Caller> caller = CallerOf(context);
  if (!caller.ok()) return caller.status();
  if (absl::Status status = EnterConnection(context, *caller); !status.ok()) return status;
  if (absl::Status status = tenants_.StreamOpened(caller->tenant); !status.ok()) return status;
  return caller;
}

absl::Status MlaOffloadService::EnterConnection(const grpc::CallbackServerContext& context,
                                                Caller& caller) {
  absl::StatusOr<ConnectionGate::Ticket> ticket = connections_.Enter(context.peer());
  if (!ticket.ok()) return ticket.status();
  caller.connection = std::make_shared<ConnectionGate::Ticket>(*std::move(ticket));
  return absl::OkStatus();
}

void MlaOffloadService::Sweep(const Engine& engine) {
  tenants_.KeepOnly(engine.ListSessions(scheduler_.Now()));
  const std::vector<uint64_t> expired = region_owners_.Sweep(
      regions_, [&] { return engine.ListSessions(scheduler_.Now()); });
  if (expired.empty()) return;
  Log(LogLevel::kInfo,
      absl::StrCat("unregistered ", expired.size(), " region", expired.size() == 1 ? "" : "s",
                   " whose client held no stream and no session for the grace period: ",
                   absl::StrJoin(expired, ", ")));
}

void MlaOffloadService::StartDraining() {
  draining_.store(true);
  metrics_.SetDraining();
}

void MlaOffloadService::PublishEngineState(const Engine& engine) {
  metrics_.SetEngineState(engine.kv_blocks_used(),
                          engine.kv_blocks_total() - engine.kv_blocks_used(),
                          engine.num_sessions());
  metrics_.SetQueued(scheduler_.queued_messages());
  if (const std::optional<ComputeBackend::MemoryInfo> memory = engine.backend().Memory()) {
    metrics_.SetDeviceMemory(memory->used, memory->total - memory->used);
  }
  std::lock_guard<std::mutex> lock(info_mutex_);
  if (info_.models().empty()) {
    // What never changes, once.
    const EngineOptions& engine_options = engine.options();
    info_.set_version(options_.version);
    for (const ModelProfile* profile : engine_options.models) {
      pb::ModelInfo* model = info_.add_models();
      model->set_name(profile->name);
      model->set_num_layers(profile->num_layers);
      model->set_num_attention_layers(profile->num_attention_layers());
      model->set_num_query_heads(profile->num_query_heads);
      model->set_head_dim(kHeadDim);
      model->set_swa_window(kSwaWindow);
      model->set_indexer_topk(profile->indexer_topk);
      for (int ratio : profile->compress_ratios) model->add_compress_ratios(ratio);
      model->set_softmax_scale(profile->softmax_scale);
    }
    info_.set_backend(engine.backend().Describe());
    info_.add_devices(options_.devices);
    for (int heads : kSupportedHeadCounts) info_.add_supported_head_counts(heads);
    info_.set_head_padding(absl::StrCat(
        "a rank's H query heads run at H rounded up to a multiple of ", kHeadCountStep,
        " (H < 8 runs at 8; H > ", kMaxHeads, " is refused); padding heads are zero queries "
        "with -inf sinks and are never returned"));
    info_.set_kv_blocks_total(engine.kv_blocks_total());
    info_.set_kv_block_tokens(kBlockTokens);
    info_.set_kv_bytes_per_token(kTokenBytes);
    info_.set_max_tokens_per_message(engine_options.max_tokens_per_message);
    info_.set_max_message_bytes(options_.max_message_bytes);
    info_.set_max_position(engine_options.max_position);
  }
  info_.set_kv_blocks_used(engine.kv_blocks_used());
  info_.set_sessions(static_cast<int32_t>(engine.num_sessions()));
}

int TransportMessageLimit(int64_t max_message_bytes) {
  const int64_t slack = int64_t{1} << 20;
  if (max_message_bytes >= (int64_t{INT32_MAX} - slack) / 2) return INT32_MAX;
  return static_cast<int>(2 * std::max<int64_t>(max_message_bytes, 0) + slack);
}

grpc::ServerUnaryReactor* MlaOffloadService::FinishNow(grpc::CallbackServerContext* context,
                                                    const char* method,
                                                    const absl::Status& status) {
  grpc::ServerUnaryReactor* reactor = context->DefaultReactor();
  metrics_.RecordRequest(method, status.code());
  refusals_.Note(method, status);
  reactor->Finish(ToGrpc(status));
  return reactor;
}

absl::StatusOr<Caller> MlaOffloadService::AdmitUnary(const grpc::CallbackServerContext& context,
                                                     const char* method, size_t request_bytes,
                                                     absl::string_view draining_refusal) {
  absl::StatusOr<Caller> caller = CallerOf(context);
  if (!caller.ok()) return caller.status();
  if (!draining_refusal.empty() && draining()) return absl::UnavailableError(draining_refusal);
  const int64_t limit = options_.max_message_bytes;
  if (request_bytes > static_cast<size_t>(limit)) {
    return TooLarge(absl::StrCat("this ", method, " request"), request_bytes, limit);
  }
  if (absl::Status status = EnterConnection(context, *caller); !status.ok()) return status;
  return caller;
}

template <typename Request, typename Response>
grpc::ServerUnaryReactor* MlaOffloadService::RunUnary(grpc::CallbackServerContext* context,
                                                      const char* method,
                                                      absl::string_view draining_refusal,
                                                      const grpc::ByteBuffer* request_bytes,
                                                      grpc::ByteBuffer* response_bytes,
                                                      Queue queue,
                                                      Work<Request, Response> work) {
  absl::StatusOr<Caller> caller =
      AdmitUnary(*context, method, request_bytes->Length(), draining_refusal);
  if (!caller.ok()) return FinishNow(context, method, caller.status());
  auto request = std::make_shared<Request>();
  if (absl::Status parsed = wire::ParseUnaryMessage(*request_bytes, request.get()); !parsed.ok()) {
    return FinishNow(context, method, parsed);
  }
  grpc::ServerUnaryReactor* reactor = context->DefaultReactor();
  const absl::Time arrival = absl::Now();
  Scheduler::Task task = [this, context, reactor, method, request, response_bytes, arrival,
                          caller = *std::move(caller), work = std::move(work)](Engine& engine) {
    Response response;
    absl::Status status = StillWanted(*context);
    if (status.ok()) status = work(engine, *context, caller, *request, response);
    if (status.ok() && response.ByteSizeLong() > static_cast<size_t>(options_.max_message_bytes)) {
      status = TooLarge(absl::StrCat("the answer to ", method), response.ByteSizeLong(),
                        options_.max_message_bytes);
    }
    if (status.ok()) *response_bytes = wire::SerializeUnaryMessage(response);
    metrics_.RecordUnary(method, status.code(), absl::ToDoubleSeconds(absl::Now() - arrival));
    refusals_.Note(method, status);
    return [reactor, status] { reactor->Finish(ToGrpc(status)); };
  };
  if (queue == Queue::kNext) {
    scheduler_.RunNext(std::move(task));
  } else {
    scheduler_.Run(std::move(task));
  }
  return reactor;
}

grpc::ServerUnaryReactor* MlaOffloadService::GetServerInfo(grpc::CallbackServerContext* context,
                                                           const grpc::ByteBuffer* request_bytes,
                                                           grpc::ByteBuffer* response_bytes) {
  if (absl::StatusOr<Caller> caller = CallerOf(*context); !caller.ok()) {
    return FinishNow(context, "GetServerInfo", caller.status());
  }
  pb::GetServerInfoRequest request;
  if (absl::Status parsed = wire::ParseUnaryMessage(*request_bytes, &request); !parsed.ok()) {
    return FinishNow(context, "GetServerInfo", parsed);
  }
  // The engine's last published state: no wait behind batches.
  {
    std::lock_guard<std::mutex> lock(info_mutex_);
    if (info_.models().empty()) {
      return FinishNow(context, "GetServerInfo",
                       absl::UnavailableError("the server is still starting; retry"));
    }
    *response_bytes = wire::SerializeUnaryMessage(info_);
  }
  return FinishNow(context, "GetServerInfo", absl::OkStatus());
}

grpc::ServerUnaryReactor* MlaOffloadService::CreateSession(grpc::CallbackServerContext* context,
                                                           const grpc::ByteBuffer* request,
                                                           grpc::ByteBuffer* response) {
  return RunUnary<pb::CreateSessionRequest, pb::CreateSessionResponse>(
      context, "CreateSession",
      "the server is draining and takes no new sessions; create the session on another server",
      request, response, Queue::kFifo,
      [this](Engine& engine, grpc::CallbackServerContext& call, const Caller& caller,
             const pb::CreateSessionRequest& request, pb::CreateSessionResponse& response) {
        if (absl::Status admitted = tenants_.AdmitSession(
                caller.tenant, SessionBlocks(engine, request.model()),
                [&] { return engine.ListSessions(scheduler_.Now()); });
            !admitted.ok()) {
          return admitted;
        }
        absl::StatusOr<CreateSessionResult> result =
            engine.CreateSession(wire::CreateSessionView(request), scheduler_.Now());
        if (!result.ok()) return result.status();
        // A client that has given up would never learn the id: undo.
        if (absl::Status wanted = StillWanted(call); !wanted.ok()) {
          engine.CloseSession(result->session_id).IgnoreError();
          return absl::Status(wanted.code(),
                              "the call's deadline passed (or it was cancelled) while the session "
                              "was created; it was closed again, so nothing was done");
        }
        tenants_.SessionCreated(caller.tenant, result->session_id);
        response.set_session_id(result->session_id);
        response.set_num_heads(result->num_heads);
        response.set_padded_heads(result->padded_heads);
        response.set_idle_ttl_seconds(result->idle_ttl_seconds);
        // The session keeps its client's regions (if it may have any).
        if (absl::StatusOr<std::string> owner = RegionOwnerOf(call, caller.tenant); owner.ok()) {
          region_owners_.SessionCreated(*owner, result->session_id);
        }
        return absl::OkStatus();
      });
}

grpc::ServerUnaryReactor* MlaOffloadService::AppendKV(grpc::CallbackServerContext* context,
                                                      const grpc::ByteBuffer* request,
                                                      grpc::ByteBuffer* response) {
  return RunUnary<pb::AppendKVRequest, pb::AppendKVResponse>(
      context, "AppendKV", "the server is draining and takes no new prompts", request, response, Queue::kFifo,
      [this](Engine& engine, grpc::CallbackServerContext&, const Caller& caller,
             const pb::AppendKVRequest& request, pb::AppendKVResponse& response) {
        if (absl::Status status =
                tenants_.CheckAccess(caller, request.session_id(), /*operator_may=*/false);
            !status.ok()) {
          return status;
        }
        // The pages the planner finds missing for the new rows: the
        // session's pages count, not the request's shapes.
        absl::StatusOr<AppendResult> result = engine.AppendKV(
            wire::AppendKVView(request), scheduler_.Now(), [&](int64_t new_pages) {
              return tenants_.AdmitBlocks(caller.tenant, new_pages,
                                          [&] { return engine.ListSessions(scheduler_.Now()); });
            });
        if (!result.ok()) return result.status();
        response.set_next_position(result->next_position);
        response.set_kv_blocks_used(result->session_blocks);
        return absl::OkStatus();
      });
}

grpc::ServerUnaryReactor* MlaOffloadService::CloseSession(grpc::CallbackServerContext* context,
                                                          const grpc::ByteBuffer* request,
                                                          grpc::ByteBuffer* response) {
  return RunUnary<pb::CloseSessionRequest, pb::CloseSessionResponse>(
      context, "CloseSession", kServedWhileDraining, request, response, Queue::kFifo,
      [this](Engine& engine, grpc::CallbackServerContext&, const Caller& caller,
             const pb::CloseSessionRequest& request, pb::CloseSessionResponse& response) {
        if (absl::Status status =
                tenants_.CheckAccess(caller, request.session_id(), /*operator_may=*/true);
            !status.ok()) {
          return status;
        }
        absl::StatusOr<int64_t> freed = engine.CloseSession(request.session_id());
        if (!freed.ok()) return freed.status();
        tenants_.SessionClosed(request.session_id());
        response.set_kv_blocks_freed(*freed);
        return absl::OkStatus();
      });
}

grpc::ServerUnaryReactor* MlaOffloadService::ListSessions(grpc::CallbackServerContext* context,
                                                          const grpc::ByteBuffer* request,
                                                          grpc::ByteBuffer* response) {
  return RunUnary<pb::ListSessionsRequest, pb::ListSessionsResponse>(
      context, "ListSessions", kServedWhileDraining, request, response, Queue::kNext,
      [this](Engine& engine, grpc::CallbackServerContext&, const Caller& caller,
             const pb::ListSessionsRequest&, pb::ListSessionsResponse& response) {
        for (const SessionSummary& summary : engine.ListSessions(scheduler_.Now())) {
          if (!tenants_.Visible(caller, summary.session_id)) continue;
          pb::SessionInfo* info = response.add_sessions();
          info->set_session_id(summary.session_id);
          info->set_tenant(tenants_.TenantOf(summary.session_id));
          info->set_model(summary.model);
          info->set_num_heads(summary.num_heads);
          info->set_next_position(summary.next_position);
          info->set_kv_blocks(summary.blocks);
          info->set_idle_seconds(summary.idle_seconds);
        }
        return absl::OkStatus();
      });
}

grpc::ServerBidiReactor<grpc::ByteBuffer, grpc::ByteBuffer>* MlaOffloadService::Attend(
    grpc::CallbackServerContext* context) {
  absl::StatusOr<Caller> caller = OpenStream(*context);
  if (!caller.ok()) return new RefusedStream(*this, "Attend", caller.status());
  return new AttendReactor(*this, *context, *std::move(caller));
}

grpc::ServerBidiReactor<grpc::ByteBuffer, grpc::ByteBuffer>* MlaOffloadService::Echo(
    grpc::CallbackServerContext* context) {
  absl::StatusOr<Caller> caller = OpenStream(*context);
  if (!caller.ok()) return new RefusedStream(*this, "Echo", caller.status());
  return new EchoReactor(*this, *std::move(caller));
}

template <typename Request, typename Response>
grpc::ServerUnaryReactor* MlaOffloadService::AnswerNow(
    grpc::CallbackServerContext* context, const char* method, absl::string_view draining_refusal,
    const grpc::ByteBuffer* request_bytes, grpc::ByteBuffer* response_bytes,
    absl::FunctionRef<absl::Status(const Caller&, const Request&, Response&)> work) {
  absl::StatusOr<Caller> caller =
      AdmitUnary(*context, method, request_bytes->Length(), draining_refusal);
  if (!caller.ok()) return FinishNow(context, method, caller.status());
  Request request;
  Response response;
  absl::Status status = wire::ParseUnaryMessage(*request_bytes, &request);
  if (status.ok()) status = work(*caller, request, response);
  if (status.ok()) *response_bytes = wire::SerializeUnaryMessage(response);
  return FinishNow(context, method, status);
}

grpc::ServerUnaryReactor* MlaOffloadService::RegisterRegion(grpc::CallbackServerContext* context,
                                                            const grpc::ByteBuffer* request,
                                                            grpc::ByteBuffer* response) {
  return AnswerNow<pb::RegisterRegionRequest, pb::RegisterRegionResponse>(
      context, "RegisterRegion", "the server is draining and takes no new regions", request, response,
      [&](const Caller& caller, const pb::RegisterRegionRequest& request,
          pb::RegisterRegionResponse& response) {
        absl::StatusOr<std::string> owner = RegionOwnerOf(*context, caller.tenant);
        if (!owner.ok()) return owner.status();
        absl::StatusOr<uint64_t> id;
        if (request.kind() == pb::REGION_KIND_SYSTEM_SHM) {
          id = regions_.RegisterSharedMemory(*owner, request.name(), request.byte_size());
        } else if (request.kind() == pb::REGION_KIND_CUDA_IPC) {
          if (!options_.allow_cuda_ipc) {
            return absl::PermissionDeniedError(
                "this server takes no CUDA IPC regions (--allow_cuda_ipc=false: on a shared host "
                "a handle would let whoever presents it have the server read and write another "
                "process's GPU memory); register a REGION_KIND_SYSTEM_SHM region or send the "
                "tensors inline");
          }
          id = regions_.RegisterCudaIpc(*owner, request.cuda_ipc_handle(), request.device_uuid(),
                                        request.byte_size());
        } else {
          return absl::InvalidArgumentError(absl::StrCat(
              "RegisterRegionRequest.kind: ", static_cast<int>(request.kind()),
              " is not a region kind; give REGION_KIND_SYSTEM_SHM (1) or REGION_KIND_CUDA_IPC (2)"));
        }
        if (!id.ok()) return id.status();
        response.set_region_id(*id);
        return absl::OkStatus();
      });
}

grpc::ServerUnaryReactor* MlaOffloadService::UnregisterRegion(grpc::CallbackServerContext* context,
                                                              const grpc::ByteBuffer* request,
                                                              grpc::ByteBuffer* response) {
  return AnswerNow<pb::UnregisterRegionRequest, pb::UnregisterRegionResponse>(
      context, "UnregisterRegion", kServedWhileDraining, request, response,
      [&](const Caller& caller, const pb::UnregisterRegionRequest& request,
          pb::UnregisterRegionResponse&) {
        absl::StatusOr<std::string> owner = RegionOwnerOf(*context, caller.tenant);
        if (!owner.ok()) return owner.status();
        return regions_.Unregister(*owner, request.region_id());
      });
}

grpc::ServerUnaryReactor* MlaOffloadService::ListRegions(grpc::CallbackServerContext* context,
                                                         const grpc::ByteBuffer* request,
                                                         grpc::ByteBuffer* response) {
  return AnswerNow<pb::ListRegionsRequest, pb::ListRegionsResponse>(
      context, "ListRegions", kServedWhileDraining, request, response,
      [&](const Caller& caller, const pb::ListRegionsRequest&, pb::ListRegionsResponse& response) {
        absl::StatusOr<std::string> owner = RegionOwnerOf(*context, caller.tenant);
        if (!owner.ok()) return owner.status();
        for (const RegionSummary& summary : regions_.List(*owner)) {
          pb::RegionInfo* info = response.add_regions();
          info->set_region_id(summary.id);
          if (summary.device) {
            info->set_kind(pb::REGION_KIND_CUDA_IPC);
            info->set_device_uuid(summary.device_uuid);
          } else {
            info->set_kind(pb::REGION_KIND_SYSTEM_SHM);
            info->set_name(summary.name);
          }
          info->set_byte_size(summary.bytes);
        }
        return absl::OkStatus();
      });
}

}  // namespace mla

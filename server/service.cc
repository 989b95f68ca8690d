#include "server/service.h"

#include <map>
#include <memory>
#include <mutex>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "kernels/geometry.h"
#include "kernels/head_padding.h"
#include "proto/attend_codec.h"
#include "server/wire_inputs.h"

namespace mla {
namespace {

namespace pb = ::mla_offload::v1;

grpc::Status ToGrpc(const absl::Status& status) {
  return grpc::Status(static_cast<grpc::StatusCode>(status.code()), std::string(status.message()));
}

TensorInput FromProto(const pb::Tensor& tensor, bool present) {
  TensorInput input;
  input.present = present;
  input.dtype = tensor.dtype();
  input.shape.assign(tensor.shape().begin(), tensor.shape().end());
  if (!tensor.data().empty()) {
    input.pieces.emplace_back(reinterpret_cast<const uint8_t*>(tensor.data().data()),
                              tensor.data().size());
  }
  return input;
}

grpc::ByteBuffer ErrorResponse(uint64_t request_id, const absl::Status& status) {
  wire::AttendResponseView response;
  response.request_id = request_id;
  response.status = wire::RequestStatusView{static_cast<int32_t>(status.code()),
                                     std::string(status.message())};
  return wire::SerializeAttendResponse(response);
}

grpc::ByteBuffer ResultResponse(const AttendResult& result) {
  if (!result.status.ok()) return ErrorResponse(result.request_id, result.status);
  wire::AttendResponseView response;
  response.request_id = result.request_id;
  response.out = wire::MakeTensorView(pb::DTYPE_BF16, {result.num_tokens, result.num_heads, kHeadDim},
                                      result.out, result.out_bytes(), result.keep_alive);
  if (result.lse != nullptr) {
    response.lse = wire::MakeTensorView(pb::DTYPE_F32, {result.num_tokens, result.num_heads},
                                        result.lse, result.lse_bytes(), result.keep_alive);
  }
  response.timing = wire::TimingView{result.timing.queue_us, result.timing.prologue_us,
                                     result.timing.decode_us, result.timing.total_us,
                                     result.timing.batch_tokens};
  return wire::SerializeAttendResponse(response);
}

}  // namespace

// One Attend stream. Reads run ahead of writes by up to
// max_messages_in_flight messages; answers are written in message order
// whatever order the engine finishes them in. The reactor deletes itself
// once gRPC is done with it and the engine holds no callback into it.
class MlaOffloadService::AttendReactor final
    : public grpc::ServerBidiReactor<grpc::ByteBuffer, grpc::ByteBuffer> {
 public:
  explicit AttendReactor(MlaOffloadService& service) : service_(service) {
    service_.metrics_.StreamOpened();
    service_.open_streams_.fetch_add(1);
    reading_ = true;
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
    // The message leaves read_buffer_ before reading_ drops: from then on the
    // engine thread may start the next read into it.
    grpc::ByteBuffer received;
    {
      std::lock_guard<std::mutex> lock(mutex_);
      received.Swap(&read_buffer_);
      reading_ = false;
      sequence = next_sequence_++;
      ++unanswered_;
      ++engine_pending_;
    }
    absl::StatusOr<wire::AttendRequestView> view =
        wire::ParseAttendRequest(received, service_.options_.max_message_bytes);
    absl::Status status = view.status();
    const uint64_t request_id = view.ok() ? view->request_id : wire::LeadingRequestId(received);
    if (status.ok()) {
      status = service_.scheduler_.SubmitAttend(
          ToAttendInput(*std::move(view)), [this, sequence](AttendResult result) {
            service_.metrics_.RecordAttend(result);
            Deliver(sequence, ResultResponse(result));
          });
    }
    if (!status.ok()) {
      service_.metrics_.RecordRequest("Attend", status.code());
      Deliver(sequence, ErrorResponse(request_id, status));
    }
    std::unique_lock<std::mutex> lock(mutex_);
    Proceed(lock);
  }

  void OnWriteDone(bool ok) override {
    std::unique_lock<std::mutex> lock(mutex_);
    writing_ = false;
    --unanswered_;
    if (!ok) broken_ = true;
    Proceed(lock);
  }

  void OnCancel() override {
    std::unique_lock<std::mutex> lock(mutex_);
    broken_ = true;
    Proceed(lock);
  }

  void OnDone() override {
    service_.metrics_.StreamClosed();
    service_.open_streams_.fetch_sub(1);
    std::unique_lock<std::mutex> lock(mutex_);
    done_ = true;
    const bool last = engine_pending_ == 0;
    lock.unlock();
    if (last) delete this;
  }

 private:
  // An answer for message `sequence` is ready (from the engine thread, or
  // from OnReadDone for a message that never reached the engine).
  void Deliver(uint64_t sequence, grpc::ByteBuffer response) {
    std::unique_lock<std::mutex> lock(mutex_);
    --engine_pending_;
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
        ready_.erase(next);
        ++next_write_;
        writing_ = start_write = true;
      }
      if (!reading_ && !reads_done_ &&
          unanswered_ < service_.options_.max_messages_in_flight) {
        reading_ = start_read = true;
      }
      if (reads_done_ && unanswered_ == 0 && !writing_ && !finished_) {
        finished_ = finish = true;
      }
    }
    lock.unlock();
    if (start_write) StartWrite(&write_buffer_);
    if (start_read) StartRead(&read_buffer_);
    if (finish) Finish(final_status);
  }

  MlaOffloadService& service_;
  grpc::ByteBuffer read_buffer_;
  grpc::ByteBuffer write_buffer_;
  std::mutex mutex_;
  std::map<uint64_t, grpc::ByteBuffer> ready_;
  uint64_t next_sequence_ = 0;  // of the next message read
  uint64_t next_write_ = 0;     // sequence of the next answer to write
  int unanswered_ = 0;          // read, answer not yet written
  int engine_pending_ = 0;      // read, answer not yet delivered
  bool reading_ = false;
  bool writing_ = false;
  bool reads_done_ = false;
  bool broken_ = false;
  bool finished_ = false;
  bool done_ = false;
};

// Echo: writes every message back unchanged, one at a time.
class MlaOffloadService::EchoReactor final
    : public grpc::ServerBidiReactor<grpc::ByteBuffer, grpc::ByteBuffer> {
 public:
  EchoReactor() { StartRead(&buffer_); }
  void OnReadDone(bool ok) override {
    if (!ok) {
      Finish(grpc::Status::OK);
      return;
    }
    StartWrite(&buffer_);
  }
  void OnWriteDone(bool ok) override {
    if (!ok) {
      Finish(grpc::Status(grpc::StatusCode::CANCELLED, "the client went away"));
      return;
    }
    buffer_.Clear();
    StartRead(&buffer_);
  }
  void OnDone() override { delete this; }

 private:
  grpc::ByteBuffer buffer_;
};

MlaOffloadService::MlaOffloadService(Scheduler& scheduler, ServerMetrics& metrics,
                                     const ServiceOptions& options)
    : scheduler_(scheduler), metrics_(metrics), options_(options) {}

void MlaOffloadService::StartDraining() {
  draining_.store(true);
  metrics_.SetDraining();
}

void MlaOffloadService::PublishEngineState(const Engine& engine) {
  metrics_.SetEngineState(engine.kv_blocks_used(),
                          engine.kv_blocks_total() - engine.kv_blocks_used(),
                          engine.num_sessions());
  metrics_.SetQueued(scheduler_.queued_messages());
}

grpc::ServerUnaryReactor* MlaOffloadService::RunUnary(grpc::CallbackServerContext* context,
                                                      const char* method,
                                                      std::function<absl::Status(Engine&)> work) {
  grpc::ServerUnaryReactor* reactor = context->DefaultReactor();
  scheduler_.Run([this, reactor, method, work = std::move(work)](Engine& engine) {
    const absl::Status status = work(engine);
    metrics_.RecordRequest(method, status.code());
    return [reactor, status] { reactor->Finish(ToGrpc(status)); };
  });
  return reactor;
}

grpc::ServerUnaryReactor* MlaOffloadService::GetServerInfo(
    grpc::CallbackServerContext* context, const pb::GetServerInfoRequest*,
    pb::ServerInfo* response) {
  return RunUnary(context, "GetServerInfo", [this, response](Engine& engine) {
    const EngineOptions& engine_options = engine.options();
    response->set_version(options_.version);
    for (const ModelProfile* profile : engine_options.models) {
      pb::ModelInfo* model = response->add_models();
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
    response->set_backend(engine.backend().Describe());
    response->add_devices(options_.devices);
    for (int heads : kSupportedHeadCounts) response->add_supported_head_counts(heads);
    response->set_head_padding(absl::StrCat(
        "a rank's H query heads run at the smallest supported count >= H (H < 8 runs at 8; "
        "H > ", kMaxHeads, " is refused); padding heads are zero queries with -inf sinks and "
        "are never returned"));
    response->set_kv_blocks_total(engine.kv_blocks_total());
    response->set_kv_blocks_used(engine.kv_blocks_used());
    response->set_kv_block_tokens(kBlockTokens);
    response->set_kv_bytes_per_token(kTokenBytes);
    response->set_max_tokens_per_message(engine_options.max_tokens_per_message);
    response->set_max_message_bytes(options_.max_message_bytes);
    response->set_max_position(engine_options.max_position);
    response->set_sessions(static_cast<int32_t>(engine.num_sessions()));
    return absl::OkStatus();
  });
}

grpc::ServerUnaryReactor* MlaOffloadService::CreateSession(
    grpc::CallbackServerContext* context, const pb::CreateSessionRequest* request,
    pb::CreateSessionResponse* response) {
  if (draining()) {
    grpc::ServerUnaryReactor* reactor = context->DefaultReactor();
    metrics_.RecordRequest("CreateSession", absl::StatusCode::kUnavailable);
    reactor->Finish(grpc::Status(grpc::StatusCode::UNAVAILABLE,
                                 "the server is draining and takes no new sessions; "
                                 "create the session on another server"));
    return reactor;
  }
  return RunUnary(context, "CreateSession", [request, response](Engine& engine) {
    CreateSessionInput input;
    input.model = request->model();
    input.num_heads = request->num_heads();
    input.sinks = FromProto(request->sinks(), request->has_sinks());
    input.idle_ttl_seconds = request->idle_ttl_seconds();
    absl::StatusOr<CreateSessionResult> result = engine.CreateSession(input, absl::Now());
    if (!result.ok()) return result.status();
    response->set_session_id(result->session_id);
    response->set_num_heads(result->num_heads);
    response->set_padded_heads(result->padded_heads);
    return absl::OkStatus();
  });
}

grpc::ServerUnaryReactor* MlaOffloadService::AppendKV(grpc::CallbackServerContext* context,
                                                      const pb::AppendKVRequest* request,
                                                      pb::AppendKVResponse* response) {
  if (draining()) {
    grpc::ServerUnaryReactor* reactor = context->DefaultReactor();
    metrics_.RecordRequest("AppendKV", absl::StatusCode::kUnavailable);
    reactor->Finish(grpc::Status(grpc::StatusCode::UNAVAILABLE,
                                 "the server is draining and takes no new prompts"));
    return reactor;
  }
  return RunUnary(context, "AppendKV", [request, response](Engine& engine) {
    AppendInput input;
    input.session_id = request->session_id();
    input.first_position = request->first_position();
    input.num_positions = request->num_positions();
    for (const pb::LayerRows& rows : request->layers()) {
      input.layers.push_back({rows.layer(), FromProto(rows.swa_kv(), rows.has_swa_kv()),
                              FromProto(rows.compressed_kv(), rows.has_compressed_kv()),
                              rows.first_compressed_row()});
    }
    absl::StatusOr<AppendResult> result = engine.AppendKV(input, absl::Now());
    if (!result.ok()) return result.status();
    response->set_next_position(result->next_position);
    response->set_kv_blocks_used(result->session_blocks);
    return absl::OkStatus();
  });
}

grpc::ServerUnaryReactor* MlaOffloadService::CloseSession(
    grpc::CallbackServerContext* context, const pb::CloseSessionRequest* request,
    pb::CloseSessionResponse* response) {
  return RunUnary(context, "CloseSession", [request, response](Engine& engine) {
    absl::StatusOr<int64_t> freed = engine.CloseSession(request->session_id());
    if (!freed.ok()) return freed.status();
    response->set_kv_blocks_freed(*freed);
    return absl::OkStatus();
  });
}

grpc::ServerUnaryReactor* MlaOffloadService::ListSessions(
    grpc::CallbackServerContext* context, const pb::ListSessionsRequest*,
    pb::ListSessionsResponse* response) {
  return RunUnary(context, "ListSessions", [response](Engine& engine) {
    for (const SessionSummary& summary : engine.ListSessions(absl::Now())) {
      pb::SessionInfo* info = response->add_sessions();
      info->set_session_id(summary.session_id);
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
    grpc::CallbackServerContext*) {
  return new AttendReactor(*this);
}

grpc::ServerBidiReactor<grpc::ByteBuffer, grpc::ByteBuffer>* MlaOffloadService::Echo(
    grpc::CallbackServerContext*) {
  return new EchoReactor();
}

}  // namespace mla

// The gRPC service mla_offload.v1.MlaOffload: decodes requests, hands them to
// the scheduler, and encodes answers. It never runs kernels and never blocks
// a gRPC thread: every engine call is queued on the scheduler, and answers
// are written from its callbacks.
//
// Attend and Echo are raw (grpc::ByteBuffer) methods: Attend parses and
// builds its messages with proto/attend_codec.h, so tensor bytes go from the
// received slices into the engine's launch buffers in one copy and the output
// goes back as slices of the engine's output, with no copy. Each Attend
// stream reads ahead up to `max_messages_in_flight` messages and writes the
// answers in the order the messages came; a bad message is answered with its
// status in the response and the stream goes on.
//
// Draining (StartDraining, on SIGTERM): CreateSession and AppendKV are
// refused with UNAVAILABLE; Attend streams go on until the server shuts down.
#ifndef MLA_OFFLOAD_SERVER_SERVICE_H_
#define MLA_OFFLOAD_SERVER_SERVICE_H_

#include <atomic>
#include <cstdint>
#include <string>

#include "absl/status/status.h"
#include "proto/mla_offload.grpc.pb.h"
#include "server/scheduler.h"
#include "server/server_metrics.h"

namespace mla {

struct ServiceOptions {
  int max_messages_in_flight = 8;  // per Attend stream
  int64_t max_message_bytes = int64_t{256} << 20;
  std::string version;
  std::string devices;
};

using MlaOffloadApi = mla_offload::v1::MlaOffload;
using MlaOffloadBase = MlaOffloadApi::WithCallbackMethod_GetServerInfo<
    MlaOffloadApi::WithCallbackMethod_CreateSession<MlaOffloadApi::WithCallbackMethod_AppendKV<
        MlaOffloadApi::WithRawCallbackMethod_Attend<MlaOffloadApi::WithCallbackMethod_CloseSession<
            MlaOffloadApi::WithCallbackMethod_ListSessions<
                MlaOffloadApi::WithRawCallbackMethod_Echo<MlaOffloadApi::Service>>>>>>>;

class MlaOffloadService final : public MlaOffloadBase {
 public:
  MlaOffloadService(Scheduler& scheduler, ServerMetrics& metrics, const ServiceOptions& options);

  void StartDraining();
  bool draining() const { return draining_.load(); }
  // Attend streams open now (a drain waits for them to end).
  int open_streams() const { return open_streams_.load(); }
  // Publishes the engine's pool and session counts as metrics; call on the
  // engine thread (Scheduler::SetStateObserver).
  void PublishEngineState(const Engine& engine);

  grpc::ServerUnaryReactor* GetServerInfo(grpc::CallbackServerContext* context,
                                          const mla_offload::v1::GetServerInfoRequest* request,
                                          mla_offload::v1::ServerInfo* response) override;
  grpc::ServerUnaryReactor* CreateSession(
      grpc::CallbackServerContext* context, const mla_offload::v1::CreateSessionRequest* request,
      mla_offload::v1::CreateSessionResponse* response) override;
  grpc::ServerUnaryReactor* AppendKV(grpc::CallbackServerContext* context,
                                     const mla_offload::v1::AppendKVRequest* request,
                                     mla_offload::v1::AppendKVResponse* response) override;
  grpc::ServerUnaryReactor* CloseSession(grpc::CallbackServerContext* context,
                                         const mla_offload::v1::CloseSessionRequest* request,
                                         mla_offload::v1::CloseSessionResponse* response) override;
  grpc::ServerUnaryReactor* ListSessions(grpc::CallbackServerContext* context,
                                         const mla_offload::v1::ListSessionsRequest* request,
                                         mla_offload::v1::ListSessionsResponse* response) override;
  grpc::ServerBidiReactor<grpc::ByteBuffer, grpc::ByteBuffer>* Attend(
      grpc::CallbackServerContext* context) override;
  grpc::ServerBidiReactor<grpc::ByteBuffer, grpc::ByteBuffer>* Echo(
      grpc::CallbackServerContext* context) override;

 private:
  class AttendReactor;
  class EchoReactor;

  // Runs `work` on the engine thread, then finishes the call with its status.
  grpc::ServerUnaryReactor* RunUnary(grpc::CallbackServerContext* context, const char* method,
                                     std::function<absl::Status(Engine&)> work);

  Scheduler& scheduler_;
  ServerMetrics& metrics_;
  const ServiceOptions options_;
  std::atomic<bool> draining_{false};
  std::atomic<int> open_streams_{0};
};

}  // namespace mla

#endif  // MLA_OFFLOAD_SERVER_SERVICE_H_

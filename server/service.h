// The gRPC service mla_offload.v1.MlaOffload: decodes requests, hands them to
// the scheduler, and encodes answers. It never runs kernels and never blocks
// a gRPC thread: every engine call is queued on the scheduler, and answers
// are written from its callbacks.
//
// Attend and Echo are raw (grpc::ByteBuffer) methods: Attend parses and
// builds its messages with proto/attend_codec.h, so tensor bytes go from the
// received slices into the engine's launch buffers in one copy and the output
// goes back as slices of the engine's output, with no copy. Each Attend
// stream reads ahead up to `max_messages_in_flight` messages, and only while
// its unanswered bytes stay below `max_unanswered_bytes` (a client that does
// not read its answers is held by flow control, never buffered without
// limit), and writes the answers in the order the messages came; a bad
// message is answered with its status in the response and the stream goes
// on. Echo holds one message at a time.
//
// Unary calls are raw methods too (proto/unary_codec.h), so that a request
// that does not parse is answered INVALID_ARGUMENT naming what did not
// parse, and a request above max_message_bytes RESOURCE_EXHAUSTED (gRPC's
// own transport limit is set above the service's, see TransportMessageLimit,
// so that the service's limit is answered per call and per Attend message,
// never by ending a stream). GetServerInfo is answered on the gRPC thread
// from the state the engine last published; ListSessions runs on the engine
// thread before any queued batch (Scheduler::RunNext); the calls that change
// sessions run in FIFO order with the Attend messages. A unary call whose
// deadline has passed (or that was cancelled) by the time the engine reaches
// it is answered DEADLINE_EXCEEDED (CANCELLED) and does nothing; a
// CreateSession whose deadline passed while it ran is undone.
//
// Order: the messages of one Attend stream are queued in the order they
// were read (the next read starts only once the message before it is
// queued), so they run and are answered in that order.
//
// Refused requests (any method, any code but OK) are logged on stderr,
// rate-limited per method and code (server/process/log.h).
//
// Regions (the same-host data plane, server/regions/region_access.h): the service
// holds the registry. RegisterRegion, UnregisterRegion and ListRegions are
// answered on the gRPC thread; an Attend message's region references are
// resolved on the gRPC thread that read it, before it is queued (a
// reference that fails is answered in-band and never reaches the engine),
// and the mapping stays alive with the message until its step is done.
// SweepRegions keeps the regions of clients holding a stream or a session
// and expires the others after the grace period; the registry goes with
// the service.
//
// Authentication and tenants (server/access/auth.h, server/access/tenants.h): every call
// is authenticated first; one that is not is UNAUTHENTICATED (an Attend or
// Echo stream ends with it before reading a message) and does nothing. A
// session belongs to the tenant that created it: to another tenant every
// method answers NOT_FOUND for it, as for a session that does not exist,
// and ListSessions shows a caller its own sessions only (an operator's
// every session, each with its tenant; an operator may close them too).
// An Attend message naming a foreign session is answered NOT_FOUND in-band
// before it is queued, and every message checks the stream's token again
// (a token revoked since the stream opened: UNAUTHENTICATED in-band). Per-tenant limits (sessions, KV blocks, open
// streams) refuse with RESOURCE_EXHAUSTED before anything changes.
//
// Draining (StartDraining, on SIGTERM): CreateSession, AppendKV and
// RegisterRegion are refused with UNAVAILABLE; Attend and Echo streams go
// on until the server shuts down.
#ifndef MLA_OFFLOAD_SERVER_SERVICE_H_
#define MLA_OFFLOAD_SERVER_SERVICE_H_

#include <atomic>
#include <cstdint>
#include <functional>
#include <mutex>
#include <string>

#include "absl/functional/function_ref.h"
#include "absl/status/status.h"
#include "proto/mla_offload.grpc.pb.h"
#include "server/access/auth.h"
#include "server/access/connection_gate.h"
#include "server/access/tenants.h"
#include "server/process/log.h"
#include "server/regions/region_access.h"
#include "server/regions/region_registry.h"
#include "server/scheduler.h"
#include "server/server_metrics.h"

namespace mla {

struct ServiceOptions {
  // Client connections that may hold calls at once (ConnectionGate); 0: no
  // limit.
  int max_connections = 1024;
  int max_messages_in_flight = 8;  // per Attend stream
  // Per Attend stream: the next message is not read while the bytes of the
  // messages read and not yet answered plus the answers not yet written
  // reach this (one message above it is still read when nothing else is
  // unanswered).
  int64_t max_unanswered_bytes = int64_t{64} << 20;
  // The largest request the service takes and answer it sends, per call and
  // per Attend message.
  int64_t max_message_bytes = int64_t{256} << 20;
  // Segments one Attend message may carry (each has a token, so the engine's
  // token limit): more are refused while parsing.
  int64_t max_segments_per_message = 1024;
  std::string version;
  std::string devices;
  // The same-host data plane's regions: limits per client, grace period.
  RegionRegistryOptions regions;
  // Who may call (nullptr: authentication off, one tenant); must outlive
  // the service.
  const Authenticator* auth = nullptr;
  TenantLimits tenants;
  // Whether RegisterRegion takes CUDA IPC handles (--allow_cuda_ipc): a
  // handle lets whoever presents it have the server read and write the
  // exporting process's GPU memory.
  bool allow_cuda_ipc = true;
  // For tests, to force interleavings: called on the gRPC thread that read
  // message `sequence` (0, 1, ...) of an Attend stream after it was parsed
  // and before it is queued, and on whichever thread starts the read of
  // message `sequence`, just before it starts.
  std::function<void(uint64_t sequence)> before_queue_attend;
  std::function<void(uint64_t sequence)> before_read_attend;
};

// gRPC's own message limit for a service limit of `max_message_bytes`: twice
// it and 1 MiB more (at most INT32_MAX), so that a message over the
// service's limit reaches the service, which answers it in-band. Only a
// message over this limit ends its stream (RESOURCE_EXHAUSTED from gRPC).
int TransportMessageLimit(int64_t max_message_bytes);

using MlaOffloadApi = mla_offload::v1::MlaOffload;
using MlaOffloadBase = MlaOffloadApi::WithRawCallbackMethod_GetServerInfo<
    MlaOffloadApi::WithRawCallbackMethod_CreateSession<MlaOffloadApi::WithRawCallbackMethod_AppendKV<
        MlaOffloadApi::WithRawCallbackMethod_Attend<MlaOffloadApi::WithRawCallbackMethod_CloseSession<
            MlaOffloadApi::WithRawCallbackMethod_ListSessions<MlaOffloadApi::WithRawCallbackMethod_Echo<
                MlaOffloadApi::WithRawCallbackMethod_RegisterRegion<
                    MlaOffloadApi::WithRawCallbackMethod_UnregisterRegion<
                        MlaOffloadApi::WithRawCallbackMethod_ListRegions<
                            MlaOffloadApi::Service>>>>>>>>>>;

class MlaOffloadService final : public MlaOffloadBase {
 public:
  MlaOffloadService(Scheduler& scheduler, ServerMetrics& metrics, const ServiceOptions& options);

  void StartDraining();
  bool draining() const { return draining_.load(); }
  // Attend and Echo streams open now (a drain waits for them to end).
  int open_streams() const { return open_streams_.load(); }
  // Publishes the engine's pool and session counts as metrics and as the
  // state GetServerInfo reports; call on the engine thread
  // (Scheduler::SetStateObserver) before the first GetServerInfo.
  void PublishEngineState(const Engine& engine);
  // Keeps the regions of clients that hold a stream or a session they
  // created, unregisters those of clients idle past the grace period, and
  // forgets the tenants of sessions that expired; call on the engine thread
  // now and then (Scheduler::SetSweepObserver).
  void Sweep(const Engine& engine);

  grpc::ServerUnaryReactor* GetServerInfo(grpc::CallbackServerContext* context,
                                          const grpc::ByteBuffer* request,
                                          grpc::ByteBuffer* response) override;
  grpc::ServerUnaryReactor* CreateSession(grpc::CallbackServerContext* context,
                                          const grpc::ByteBuffer* request,
                                          grpc::ByteBuffer* response) override;
  grpc::ServerUnaryReactor* AppendKV(grpc::CallbackServerContext* context,
                                     const grpc::ByteBuffer* request,
                                     grpc::ByteBuffer* response) override;
  grpc::ServerUnaryReactor* CloseSession(grpc::CallbackServerContext* context,
                                         const grpc::ByteBuffer* request,
                                         grpc::ByteBuffer* response) override;
  grpc::ServerUnaryReactor* ListSessions(grpc::CallbackServerContext* context,
                                         const grpc::ByteBuffer* request,
                                         grpc::ByteBuffer* response) override;
  grpc::ServerBidiReactor<grpc::ByteBuffer, grpc::ByteBuffer>* Attend(
      grpc::CallbackServerContext* context) override;
  grpc::ServerBidiReactor<grpc::ByteBuffer, grpc::ByteBuffer>* Echo(
      grpc::CallbackServerContext* context) override;
  grpc::ServerUnaryReactor* RegisterRegion(grpc::CallbackServerContext* context,
                                           const grpc::ByteBuffer* request,
                                           grpc::ByteBuffer* response) override;
  grpc::ServerUnaryReactor* UnregisterRegion(grpc::CallbackServerContext* context,
                                             const grpc::ByteBuffer* request,
                                             grpc::ByteBuffer* response) override;
  grpc::ServerUnaryReactor* ListRegions(grpc::CallbackServerContext* context,
                                        const grpc::ByteBuffer* request,
                                        grpc::ByteBuffer* response) override;

 private:
  class AttendReactor;
  class EchoReactor;
  class RefusedStream;

  // How a unary call reaches the engine.
  enum class Queue { kFifo, kNext };
  template <typename Request, typename Response>
  using Work = std::function<absl::Status(Engine&, grpc::CallbackServerContext&, const Caller&,
                                          const Request&, Response&)>;

  // The caller of a call (UNAUTHENTICATED when it is none).
  absl::StatusOr<Caller> CallerOf(const grpc::CallbackServerContext& context) const;
  // The caller of a stream, counted among its tenant's open streams until
  // the stream's reactor calls tenants_.StreamClosed; UNAUTHENTICATED, or
  // RESOURCE_EXHAUSTED past --max_connections or at the tenant's stream
  // limit.
  absl::StatusOr<Caller> OpenStream(const grpc::CallbackServerContext& context);

  // The caller of a unary call of `method` with a request of
  // `request_bytes`: UNAUTHENTICATED first, then, while the server drains,
  // UNAVAILABLE with `draining_refusal` (unless it is empty: the method is
  // served while draining), then RESOURCE_EXHAUSTED for a request too large.
  // An unauthenticated caller learns only that it must authenticate.
  // Last, the connection's place (EnterConnection).
  absl::StatusOr<Caller> AdmitUnary(const grpc::CallbackServerContext& context, const char* method,
                                    size_t request_bytes, absl::string_view draining_refusal);
  // Holds, in `caller`, the call's connection's place among those with
  // calls running (ConnectionGate); RESOURCE_EXHAUSTED past
  // --max_connections.
  absl::Status EnterConnection(const grpc::CallbackServerContext& context, Caller& caller);
  // Admits the call (AdmitUnary), parses the request, runs `work` on the
  // engine thread (unless the call's deadline passed first), then finishes
  // the call with the response or the status.
  template <typename Request, typename Response>
  grpc::ServerUnaryReactor* RunUnary(grpc::CallbackServerContext* context, const char* method,
                                     absl::string_view draining_refusal,
                                     const grpc::ByteBuffer* request_bytes,
                                     grpc::ByteBuffer* response_bytes, Queue queue,
                                     Work<Request, Response> work);
  // Finishes a unary call at once with `status` (counted in the metrics).
  grpc::ServerUnaryReactor* FinishNow(grpc::CallbackServerContext* context, const char* method,
                                   const absl::Status& status);
  // Admits the call (AdmitUnary), parses the request, runs `work` on this
  // gRPC thread (for calls that need no engine) and finishes the call with
  // the response or the status.
  template <typename Request, typename Response>
  grpc::ServerUnaryReactor* AnswerNow(
      grpc::CallbackServerContext* context, const char* method, absl::string_view draining_refusal,
      const grpc::ByteBuffer* request_bytes, grpc::ByteBuffer* response_bytes,
      absl::FunctionRef<absl::Status(const Caller&, const Request&, Response&)> work);

  Scheduler& scheduler_;
  ServerMetrics& metrics_;
  RefusalLog refusals_;
  const ServiceOptions options_;
  std::atomic<bool> draining_{false};
  std::atomic<int> open_streams_{0};
  std::mutex info_mutex_;
  mla_offload::v1::ServerInfo info_;  // guarded by info_mutex_
  RegionRegistry regions_;
  RegionOwners region_owners_;
  Tenants tenants_;
  ConnectionGate connections_;
};

}  // namespace mla

#endif  // MLA_OFFLOAD_SERVER_SERVICE_H_

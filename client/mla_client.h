// The C++ client of mla-offload: what a serving node embeds to keep its KV
// cache on an mla_offload_server and stream one Attend message per layer step.
//
// Connecting: Client::Connect makes a channel to one server with the
// message-size limits and HTTP/2 window settings the server itself uses
// (large tensor messages must not stall on flow control every 64 KiB),
// plaintext by default, TLS (optionally mutual) when ConnectOptions says so,
// and a bearer token with every call and stream when it gives one (a server
// with authentication maps it to a tenant).
// Connect does not wait for the server unless connect_timeout is set; the
// first call then reports an unreachable server as UNAVAILABLE.
//
// Errors: every call returns absl::Status / absl::StatusOr. A gRPC status
// becomes the absl::Status of the same code whose message is
// "<Method> on <target>: <the server's or gRPC's message>" (for a stream
// that ended: "Attend stream on <target>: ..."); an Attend message the
// server refused (its RequestStatus) becomes
// "Attend request <id>: <the server's message>" with the server's code. The
// codes are the contract of proto/mla_offload.proto: INVALID_ARGUMENT (bad
// shape, dtype, head count, layer, index), NOT_FOUND (unknown session; also a
// session that was on a server that has since been lost and restarted),
// RESOURCE_EXHAUSTED (no KV blocks or queue space; nothing changed),
// FAILED_PRECONDITION (position out of order), UNAVAILABLE (draining or
// unreachable, or a TLS handshake that failed), DEADLINE_EXCEEDED (a call or
// layer step took longer than its timeout), UNAUTHENTICATED (no valid token
// or client certificate). Another tenant's session is NOT_FOUND, as an
// unknown one is.
//
// Tensor bytes: AppendKV, AttendStream::Send and EchoStream::Send put the
// caller's memory into the outgoing message as slices that reference it (no
// copy; gRPC writes them to the socket). The memory must stay valid and
// unchanged until that call returned (AppendKV), or until the matching
// Receive returned or the stream was destroyed (the streams; the destructor
// waits until gRPC has released every message, also after a cancellation),
// or, if the caller hands over a keep_alive, until gRPC releases it (the
// library drops it then, possibly on a gRPC thread, at the latest when the
// stream is destroyed). Answers
// are not copied either: an AttendResult owns the received grpc::ByteBuffer
// and its out()/lse() are views into it (one copy, made once, only when gRPC
// delivered a tensor split over several slices or misaligned; out_view()
// gives the pieces for a single CopyTo into the caller's own, e.g. pinned,
// buffer).
//
// Same-host data plane: a client on the server's host may share memory with
// it (HostRegion, client/host_region.h: POSIX shared memory, registered
// once) and name q, kv and compressed rows in it, and the place to write
// the answer, in AttendInput's *_region fields; those messages carry no
// tensor bytes either way. Every call and stream of a Client carries its
// client_id() (the mla-client-id metadata): the server keeps a client's
// regions apart from every other's by it, over all its connections.
//
// Several servers: Cluster places each session on one server by rendezvous
// (highest random weight) hashing of a session key chosen by the caller, and
// the session stays there. When that server is lost, its sessions are gone
// with it (the KV cache lives only in that process): calls to it return
// UNAVAILABLE while it is unreachable, and NOT_FOUND for the old session id
// if a new process comes up at the same address. The caller marks the server
// lost (Cluster::MarkLost), creates the session again (it is placed on the
// live server of next-highest weight; sessions on the other servers do not
// move) and re-appends the sequence's KV with AppendKV before attending
// again. The Cluster never marks a server lost by itself: one UNAVAILABLE
// may be a drain or a blip, and the caller knows which it can afford.
//
// Thread safety: Client and Cluster are thread-safe. An AttendStream or
// EchoStream may be used from several threads (Send calls are numbered in
// the order they take the stream's lock); the usual shape is one thread
// sending layer steps and one receiving them. Results are plain values.
#ifndef MLA_OFFLOAD_CLIENT_MLA_CLIENT_H_
#define MLA_OFFLOAD_CLIENT_MLA_CLIENT_H_

#include <cstddef>
#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include <grpcpp/channel.h>
#include <grpcpp/client_context.h>
#include <grpcpp/support/byte_buffer.h>
#include <grpcpp/support/status.h>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "absl/types/span.h"
#include "proto/attend_codec.h"
#include "proto/mla_offload.pb.h"

namespace mla::client {

namespace pb = ::mla_offload::v1;

// Elements of one row of q, kv and the output: the model's head_dim.
inline constexpr int64_t kHeadDim = 512;
// The FP8 output's blocks a head (of 128 dims, one UE8M0 scale each).
inline constexpr int64_t kOutputBlocks = 4;

struct ConnectOptions {
  // TLS. Off by default (plaintext, for loopback and trusted networks).
  bool use_tls = false;
  // PEM root certificates that sign the server's certificate; empty: the
  // system's roots.
  std::string tls_root_certs_pem;
  // Mutual TLS: the client's certificate chain and private key, PEM. Both or
  // neither.
  std::string tls_client_cert_pem;
  std::string tls_client_key_pem;
  // The name the server's certificate must carry, when it differs from the
  // target's host (e.g. connecting by IP address). Only with use_tls.
  std::string tls_server_name;
  // A bearer token (the server's --auth_tokens_file names its tenant),
  // sent as "authorization: Bearer TOKEN" with every call and stream; empty:
  // none. Printable ASCII without spaces. Never logged or put in an error
  // by this library. Over plaintext only to a loopback or unix: target: a
  // token that crosses a network in the clear is anybody's
  // (INVALID_ARGUMENT otherwise).
  std::string bearer_token;

  // Largest message sent or received; the server's default --max_message_mb
  // is 256 MiB.
  int64_t max_message_bytes = int64_t{256} << 20;
  // Deadline of unary calls (GetServerInfo, CreateSession, AppendKV, ...)
  // when CallOptions gives none.
  absl::Duration call_timeout = absl::Seconds(60);
  // When positive, Connect waits this long for the channel to connect and
  // returns UNAVAILABLE naming the target if it does not.
  absl::Duration connect_timeout = absl::ZeroDuration();
  // gRPC shares one connection among the Clients of a process that connect
  // to the same target with the same options. true gives this Client a
  // connection of its own (e.g. a load test simulating several nodes).
  bool own_connection = false;
};

struct CallOptions {
  // This call's deadline, from now; zero: ConnectOptions::call_timeout.
  absl::Duration timeout = absl::ZeroDuration();
};

// absl::Status of the same code; the message is "<what>: <status message>".
absl::Status StatusFromGrpc(const grpc::Status& status, absl::string_view what);

// What the health service (grpc.health.v1) says of a service.
enum class HealthStatus { kUnknown, kServing, kNotServing, kServiceUnknown };
absl::string_view HealthStatusName(HealthStatus status);  // "SERVING", ...

struct SessionOptions {
  std::string model;      // a profile name from ServerInfo.models
  int32_t num_heads = 0;  // H: query heads each rank sends (h_total / TP)
  // Attention sinks, fp32, [num_attention_layers, h_total] or
  // [num_attention_layers, num_heads]; empty: no sink. sinks_shape gives the
  // two dimensions. Copied into the request (they are small).
  absl::Span<const float> sinks;
  std::vector<int64_t> sinks_shape;
  // Closed after this long without use, in whole seconds rounded up; zero:
  // the server's default; InfiniteDuration (or more than 2^31 - 1 s): the
  // longest the wire can ask for, 68 years. Negative: INVALID_ARGUMENT.
  absl::Duration idle_ttl = absl::ZeroDuration();
};

// The KV rows of one layer for AppendKV, as bf16 bit patterns (see
// message LayerRows): swa_kv is [num_positions, 512]; compressed_kv is
// [M, 512], rows first_compressed_row .. + M - 1 (empty on layers without
// compression or when no row completes).
struct LayerRowsInput {
  int32_t layer = 0;
  absl::Span<const uint16_t> swa_kv;
  absl::Span<const uint16_t> compressed_kv;
  int32_t first_compressed_row = 0;
};

// One session's tokens in an Attend message (message Segment).
struct AttendSegment {
  std::string session_id;
  int32_t position = 0;
  int32_t num_tokens = 1;
  int32_t first_compressed_row = 0;
  int32_t num_compressed_rows = 0;
};

// Bytes [offset, offset + bytes) of a region registered with the server
// (the same-host data plane; HostRegion in client/host_region.h makes and
// registers one).
struct RegionRef {
  uint64_t region_id = 0;
  int64_t offset = 0;
  int64_t bytes = 0;

  // The reference to bytes [offset, offset + bytes) of region `region_id`,
  // which holds `region_bytes`; INVALID_ARGUMENT naming `region` (e.g.
  // "HostRegion /mla-1-2") when they do not lie within it (checked without
  // overflow).
  static absl::StatusOr<RegionRef> Within(uint64_t region_id, int64_t region_bytes,
                                          int64_t offset, int64_t bytes,
                                          absl::string_view region);
};

// One Attend message: a layer step of one rank for the sessions in
// `segments` (T = sum of their num_tokens). Tensors are bf16 bit patterns
// (uint16) and int32, C order, referenced while the message is sent (see the
// file comment). On the server's host, q, kv and compressed_kv may instead
// lie in a registered region (the *_region fields, the span left empty;
// the server reads them while the step runs, so they must stay unchanged
// until Receive returns its answer), and the answer may be written into
// one (out_region, with return_lse also lse_region, with fp8_output also
// out_scales_region): the message then carries and returns no tensor
// bytes. The top-k always travels inline.
struct AttendInput {
  int32_t layer = 0;
  int32_t head_offset = 0;
  std::vector<AttendSegment> segments;
  absl::Span<const uint16_t> q;              // [T, H, 512]; H = q.size() / (T * 512)
  absl::Span<const uint16_t> kv;             // [T, 512]; empty: not sent (another rank sends it)
  absl::Span<const uint16_t> compressed_kv;  // [sum of num_compressed_rows, 512]
  absl::Span<const int32_t> topk;            // [T, K] on C4A layers; K = topk.size() / T
  bool return_lse = false;
  bool derotate_output = false;
  // The output in FP8 (spec section 5): per token and head 512 e4m3fn bytes
  // and 4 UE8M0 scales, one per 128 dims (AttendResult::out_e4m3 and
  // out_scales): 516 bytes a head back instead of bf16's 1024.
  bool fp8_output = false;
  // Optional: owns the memory above; held until gRPC has released the
  // message, so the caller need not keep the memory until Receive.
  std::shared_ptr<const void> keep_alive;
  // The same-host data plane (see above): q [T, H, 512], kv [T, 512] and
  // compressed_kv [rows, 512] bf16 in a region; out [T, H, 512] bf16 (with
  // fp8_output e4m3fn, and out_scales [T, H, 4] UE8M0 in out_scales_region)
  // and lse [T, H] f32 written into one (bf16 out at an even offset, the
  // scales and lse at a multiple of 4), in place when Receive returns the
  // answer.
  std::optional<RegionRef> q_region;
  std::optional<RegionRef> kv_region;
  std::optional<RegionRef> compressed_kv_region;
  std::optional<RegionRef> out_region;
  std::optional<RegionRef> lse_region;
  std::optional<RegionRef> out_scales_region;
};

// The answer to one Attend message that the server served. Movable, not
// copyable; owns the received bytes.
class AttendResult {
 public:
  AttendResult(AttendResult&&) noexcept;
  AttendResult& operator=(AttendResult&&) noexcept;
  ~AttendResult();

  uint64_t request_id() const;
  int64_t num_tokens() const;  // T
  int32_t num_heads() const;   // H
  // [T, H, 512] bf16 bit patterns; empty when in_regions() or fp8_output().
  absl::Span<const uint16_t> out() const;
  // The message asked for the FP8 output: out_e4m3() [T, H, 512] e4m3fn
  // codes and out_scales() [T, H, 4] UE8M0 bytes, block k of a head (dims
  // 128k .. 128k + 127) worth e4m3 * 2^(scale - 127); both empty otherwise,
  // and when in_regions().
  bool fp8_output() const;
  absl::Span<const uint8_t> out_e4m3() const;
  absl::Span<const uint8_t> out_scales() const;
  // [T, H] fp32 log-sum-exp (+inf where nothing was attended); empty unless
  // the message asked for it, and when in_regions().
  absl::Span<const float> lse() const;
  bool has_lse() const;
  // The server wrote out (and lse) into the message's out_region (and
  // lse_region): the answer is there, not here.
  bool in_regions() const;
  // The output (bf16, or e4m3 with fp8_output) as the received pieces (no
  // copy made): out_view().CopyTo(dst) writes it into the caller's buffer
  // with one memcpy per piece.
  const wire::TensorView& out_view() const;
  // Server-side time of the message (queue, prologue, decode, total, batch
  // tokens).
  const wire::TimingView& timing() const;

 private:
  friend class AttendStream;
  struct Data;
  explicit AttendResult(std::unique_ptr<Data> data);
  std::unique_ptr<Data> data_;
};

// One message sent back by Echo (the transport baseline); owns its bytes.
class EchoResult {
 public:
  EchoResult(EchoResult&&) noexcept;
  EchoResult& operator=(EchoResult&&) noexcept;
  ~EchoResult();

  size_t size() const;
  // The payload as received, in pieces (no copy).
  const std::vector<wire::Piece>& pieces() const;
  void CopyTo(void* dst) const;
  std::string ToString() const;

 private:
  friend class EchoStream;
  struct Data;
  explicit EchoResult(std::unique_ptr<Data> data);
  std::unique_ptr<Data> data_;
};

struct StreamOptions {
  // Each message must be answered within this long of its Send; otherwise
  // Receive returns DEADLINE_EXCEEDED and the stream is cancelled (a layer
  // step that late means the server or the network is in trouble, and the
  // answers after it cannot come in order).
  absl::Duration step_timeout = absl::Seconds(30);
  // Deadline of the whole stream, from its opening; infinite: none (a
  // serving node keeps one stream open for its lifetime).
  absl::Duration stream_timeout = absl::InfiniteDuration();
  // Messages sent and not yet answered by the server; Send waits while this
  // many are out (answers already received but not yet taken by Receive do
  // not count). The server reads ahead --max_messages_in_flight (default 8)
  // per stream.
  int max_in_flight = 8;
  // TCP connections the stream's messages are spread over, 1 to
  // kMaxStreamConnections; each has its own stream and its own
  // max_in_flight (the first is the Client's connection, the others are
  // opened for this stream). One HTTP/2 connection's reads and writes are
  // serialised on each side, so a stream keeping several messages in
  // flight moves more over two (on loopback 1.26x the echo messages at 2 in
  // flight: server/bench/README.md). The server orders only the messages of
  // one connection: a message goes on the connection of the newest
  // unreceived message that shares a session layer (session and layer) with
  // it, so it is applied after that one; the others take the connections in
  // turn. Answers are received in the order sent, as on one connection; Send
  // from one thread at a time.
  int connections = 1;
};

inline constexpr int kMaxStreamConnections = 16;

namespace internal {
class RawStream;
class Stripes;
// The metadata every call and stream of a Client sends.
using CallMetadata = std::vector<std::pair<std::string, std::string>>;
}  // namespace internal

// A bidirectional Attend stream: several layer steps in flight, answers in
// the order sent. A message the server refuses fails alone (Receive returns
// its status, the stream goes on); a broken stream fails every later call
// with the stream's status. Destroying an unfinished stream cancels it.
class AttendStream {
 public:
  ~AttendStream();
  AttendStream(const AttendStream&) = delete;
  AttendStream& operator=(const AttendStream&) = delete;

  // Sends one message; its request id (1, 2, 3, ... in the order of Send).
  // Checks the tensor sizes against the segments first (INVALID_ARGUMENT,
  // nothing sent). Waits while StreamOptions::max_in_flight messages are
  // unanswered, at most step_timeout.
  absl::StatusOr<uint64_t> Send(const AttendInput& input);
  // The answer to the oldest message not yet received, waiting for it at
  // most until step_timeout after its Send. FAILED_PRECONDITION when nothing
  // is outstanding (also when another thread's Receive took the last
  // answer). An OK answer is checked to be out [T, H, 512] bf16 (and lse
  // [T, H] fp32) for the message's T and H; anything else is INTERNAL.
  absl::StatusOr<AttendResult> Receive();
  // Messages sent whose answers Receive has not returned yet.
  int outstanding() const;
  // OK while the stream can carry messages; else why it ended.
  absl::Status status() const;
  // Half-closes the stream and waits (at most step_timeout) for the server
  // to end it; answers not yet received stay available to Receive. The
  // call's status.
  absl::Status Finish();

 private:
  friend class Client;
  explicit AttendStream(std::unique_ptr<internal::Stripes> stripes);
  std::unique_ptr<internal::Stripes> stripes_;
};

// Echo: every message comes back unchanged, in order (the load-test
// baseline for the same bytes on the same connection).
class EchoStream {
 public:
  ~EchoStream();
  EchoStream(const EchoStream&) = delete;
  EchoStream& operator=(const EchoStream&) = delete;

  // Sends `payload` as one EchoMessage; its number (1, 2, ...).
  absl::StatusOr<uint64_t> Send(absl::Span<const uint8_t> payload,
                                std::shared_ptr<const void> keep_alive = nullptr);
  absl::StatusOr<EchoResult> Receive();
  int outstanding() const;
  absl::Status status() const;
  absl::Status Finish();

 private:
  friend class Client;
  explicit EchoStream(std::unique_ptr<internal::Stripes> stripes);
  std::unique_ptr<internal::Stripes> stripes_;
};

// One server. Streams opened from it share its channel and may outlive it.
class Client {
 public:
  // INVALID_ARGUMENT for an empty target or half a TLS key pair;
  // UNAVAILABLE when connect_timeout is set and passes.
  static absl::StatusOr<std::unique_ptr<Client>> Connect(const std::string& target,
                                                         const ConnectOptions& options = {});
  ~Client();

  const std::string& target() const { return target_; }
  const std::shared_ptr<grpc::Channel>& channel() const { return channel_; }

  absl::StatusOr<pb::ServerInfo> GetServerInfo(const CallOptions& call = {});
  // grpc.health.v1 Check of `service` ("" is the whole server).
  absl::StatusOr<HealthStatus> CheckHealth(const std::string& service = "",
                                           const CallOptions& call = {});

  absl::StatusOr<pb::CreateSessionResponse> CreateSession(const SessionOptions& options,
                                                          const CallOptions& call = {});
  // Positions first_position .. + num_positions - 1 of every attention layer
  // (one entry per layer, each exactly once). Tensor bytes are referenced,
  // not copied; they must stay unchanged until this returns.
  absl::StatusOr<pb::AppendKVResponse> AppendKV(const std::string& session_id,
                                                int32_t first_position, int32_t num_positions,
                                                absl::Span<const LayerRowsInput> layers,
                                                const CallOptions& call = {});
  // KV blocks freed. NOT_FOUND for an unknown (or already closed) session.
  absl::StatusOr<int64_t> CloseSession(const std::string& session_id,
                                       const CallOptions& call = {});
  absl::StatusOr<std::vector<pb::SessionInfo>> ListSessions(const CallOptions& call = {});

  // The same-host data plane (only on the server's host: PERMISSION_DENIED
  // elsewhere). Registers `bytes` of the POSIX shared-memory object `name`
  // (which must exist) with the server; the region's id. HostRegion does
  // all of it.
  absl::StatusOr<uint64_t> RegisterRegion(const std::string& name, int64_t bytes,
                                          const CallOptions& call = {});
  // Registers the first `bytes` of the device memory that `cuda_ipc_handle`
  // (a cudaIpcMemHandle_t's bytes) exports, on the GPU `device_uuid`; the
  // region's id. UNIMPLEMENTED from a server without a GPU. CudaRegion
  // (client/cuda_region.h) does all of it.
  absl::StatusOr<uint64_t> RegisterCudaRegion(const std::string& cuda_ipc_handle,
                                              const std::string& device_uuid, int64_t bytes,
                                              const CallOptions& call = {});
  // NOT_FOUND for a region this client does not hold.
  absl::Status UnregisterRegion(uint64_t region_id, const CallOptions& call = {});
  absl::StatusOr<std::vector<pb::RegionInfo>> ListRegions(const CallOptions& call = {});
  // This client's identity for its regions: a random value sent as the
  // mla-client-id metadata of every call and stream, so that the server
  // tells this client from others on the same host (and keeps its regions
  // across its connections).
  const std::string& client_id() const { return client_id_; }

  absl::StatusOr<std::unique_ptr<AttendStream>> OpenAttendStream(
      const StreamOptions& options = {});
  absl::StatusOr<std::unique_ptr<EchoStream>> OpenEchoStream(const StreamOptions& options = {});

 private:
  Client(std::string target, std::shared_ptr<grpc::Channel> channel,
         const ConnectOptions& options);

  template <typename Request, typename Response>
  absl::Status Unary(absl::string_view method, const Request& request, Response* response,
                     const CallOptions& call);
  // A unary call of any method on serialized bytes; the answer's slices.
  // Errors read "<what>: ...".
  absl::StatusOr<std::vector<grpc::Slice>> UnaryRaw(const char* method,
                                                    const grpc::ByteBuffer& request,
                                                    const CallOptions& call,
                                                    absl::string_view what);
  // A stream of `method` on options.connections connections.
  absl::StatusOr<std::unique_ptr<internal::Stripes>> OpenStripes(absl::string_view method,
                                                                 const StreamOptions& options);
  // A unary call's deadline (`call`, else the connect options') and this
  // client's metadata.
  void Prepare(grpc::ClientContext& context, const CallOptions& call) const;

  const std::string target_;
  const std::shared_ptr<grpc::Channel> channel_;
  const ConnectOptions options_;
  const std::string client_id_;
  internal::CallMetadata metadata_;  // the client id, and the token if any
};

// ---- Placement over several servers.

// The rendezvous weight of `session_key` on `target`:
//   SplitMix64(Fnv1a64(session_key) ^ SplitMix64(Fnv1a64(target)))
// (FNV-1a 64 over the bytes; SplitMix64's finaliser), the same in every
// process and language, so that a Python client places a key where this one
// does.
uint64_t RendezvousWeight(absl::string_view session_key, absl::string_view target);

// The index into `targets` of the highest weight for `session_key` (ties, of
// probability 2^-64, go to the smaller target string); -1 when `targets` is
// empty. Removing a target moves only the keys that were placed on it;
// adding one moves only the keys it now wins.
int RendezvousPlace(absl::string_view session_key, absl::Span<const std::string> targets);

// The servers of a Kubernetes StatefulSet (deploy/k8s/base): each pod has a
// stable DNS name behind the headless Service, which gRPC resolves; placing
// sessions on the names (not the addresses) lets a restarted pod keep its
// keys.
struct StatefulSetPods {
  std::string name;          // the StatefulSet's, e.g. "mla-offload"
  int replicas = 1;
  std::string service;       // the headless Service; empty: NAME-headless
  std::string name_space;    // empty: the client's own namespace
  std::string cluster_domain;  // with name_space, e.g. "cluster.local"; may be empty
  int port = 50051;
};

// NAME-0.SERVICE[.NAMESPACE.svc[.DOMAIN]]:PORT ... NAME-(replicas-1), for
// Cluster::Connect; INVALID_ARGUMENT naming the field that is wrong.
absl::StatusOr<std::vector<std::string>> StatefulSetTargets(const StatefulSetPods& pods);

// Whether gRPC target `target` reaches a server on this host the way the
// server counts same-host peers for regions (server/regions/region_access.h): a
// Unix socket ("unix:PATH", "unix-abstract:NAME") or a loopback address
// ("localhost:PORT", "127.x.y.z:PORT", "[::1]:PORT", with or without an
// "ipv4:"/"ipv6:" scheme). A name that may resolve to this host is not
// counted: the server would see a non-loopback peer and refuse regions.
bool IsSameHostTarget(absl::string_view target);

// Where Cluster::Place may put a session.
struct PlaceOptions {
  // Only on a server of this host (IsSameHostTarget): for sessions whose
  // tensors go through shared-memory regions (HostRegion).
  bool same_host = false;
};

// A session created through a Cluster: where it lives. Send every later call
// for it to cluster.client(server), not to Place(key) again: placement
// changes when servers are marked lost or alive, a session does not move.
struct PlacedSession {
  int server = -1;
  std::string target;
  pb::CreateSessionResponse session;
};

// Several servers, one Client each, and the placement of sessions on them
// (the file comment says what happens when a server is lost).
class Cluster {
 public:
  // INVALID_ARGUMENT when `targets` is empty or repeats a target.
  static absl::StatusOr<std::unique_ptr<Cluster>> Connect(std::vector<std::string> targets,
                                                          const ConnectOptions& options = {});

  int size() const { return static_cast<int>(clients_.size()); }
  const std::string& target(int server) const { return targets_[server]; }
  Client& client(int server) const { return *clients_[server]; }

  // The live server with the highest rendezvous weight for the key, among
  // the servers of this host with `where.same_host` (the weights over that
  // subset: a key keeps its server while the subset does); UNAVAILABLE when
  // every server is marked lost, FAILED_PRECONDITION when no live server is
  // on this host.
  absl::StatusOr<int> Place(absl::string_view session_key, const PlaceOptions& where = {}) const;
  // Places the session and creates it there.
  absl::StatusOr<PlacedSession> CreateSession(absl::string_view session_key,
                                              const SessionOptions& options,
                                              const CallOptions& call = {},
                                              const PlaceOptions& where = {});

  // A lost server takes no new sessions; only keys that were placed on it
  // move (each to its next-highest weight). MarkAlive undoes it (new
  // sessions of its keys go back to it; existing sessions stay where they
  // were created).
  void MarkLost(int server);
  void MarkAlive(int server);
  bool alive(int server) const;

 private:
  Cluster(std::vector<std::string> targets, std::vector<std::unique_ptr<Client>> clients);

  const std::vector<std::string> targets_;
  const std::vector<std::unique_ptr<Client>> clients_;
  mutable absl::Mutex mutex_;
  std::vector<bool> alive_ ABSL_GUARDED_BY(mutex_);
};

}  // namespace mla::client

#endif  // MLA_OFFLOAD_CLIENT_MLA_CLIENT_H_

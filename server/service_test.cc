// Tests of the gRPC service (server/service.h) that need the server in this
// process: the whole stack of server/offload_server.h on the CPU backend,
// talked to over loopback with the generated stubs, with the engine thread
// held where a test needs an interleaving (a task queued on the scheduler
// that waits for the test to let it go) and the service's hook between
// parsing an Attend message and queueing it. Nothing here sleeps to make a
// race likely: each interleaving is forced.
//
// What the answers contain is tested elsewhere (tests/integration against
// the float64 reference); here only codes, messages, order and whether state
// changed are checked.
#include "server/service.h"

#include <arpa/inet.h>
#include <ifaddrs.h>
#include <netinet/in.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <grpcpp/generic/generic_stub.h>
#include <grpcpp/grpcpp.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <future>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "absl/strings/escaping.h"
#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "absl/time/time.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "kernels/cpu_backend.h"
#include "kernels/geometry.h"
#include "kernels/model_profile.h"
#include "proto/mla_offload.grpc.pb.h"
#include "server/access/auth.h"
#include "server/engine/session.h"
#include "server/metrics/registry.h"
#include "server/offload_server.h"
#include "server/regions/testing/regions.h"
#include "server/testing/engine_hold.h"
#include "tests/support/test_rows.h"

namespace mla {
namespace {

namespace pb = ::mla_offload::v1;
using ::testing::HasSubstr;

constexpr char kFlash[] = "deepseek-v4-flash";
constexpr int kHeads = 8;
constexpr int kSwaLayer = 0;  // V4-Flash layer 0 is SWA-only

std::string Bytes(const std::vector<uint16_t>& values) {
  return std::string(reinterpret_cast<const char*>(values.data()), values.size() * 2);
}

void SetTensor(pb::Tensor* tensor, pb::DType dtype, std::vector<int64_t> shape, std::string data) {
  tensor->set_dtype(dtype);
  for (int64_t dim : shape) tensor->add_shape(dim);
  tensor->set_data(std::move(data));
}

// A one-token step of `session` at `position` on the SWA layer.
pb::AttendRequest Step(const std::string& session, int32_t position) {
  pb::AttendRequest request;
  request.set_request_id(1000 + position);
  request.set_layer(kSwaLayer);
  pb::Segment* segment = request.add_segments();
  segment->set_session_id(session);
  segment->set_position(position);
  segment->set_num_tokens(1);
  SetTensor(request.mutable_q(), pb::DTYPE_BF16, {1, kHeads, kHeadDim},
            Bytes(TestRows(7000 + position, kHeads)));
  SetTensor(request.mutable_kv(), pb::DTYPE_BF16, {1, kHeadDim}, Bytes(TestRows(9000 + position, 1)));
  return request;
}

class ServiceTest : public ::testing::Test {
 protected:
  void Start(const std::function<void(OffloadServerOptions&)>& change = nullptr) {
    OffloadServerOptions options;
    options.engine.kv_blocks = 2000;
    options.engine.max_position = 4096;
    options.engine.models = {*FindModelProfile(kFlash)};
    options.scheduler.batch_wait = absl::ZeroDuration();
    options.service.version = "service_test";
    if (change) change(options);
    absl::StatusOr<std::unique_ptr<OffloadServer>> server =
        OffloadServer::Start(std::make_unique<CpuBackend>(2), options, registry_);
    ASSERT_TRUE(server.ok()) << server.status();
    server_ = *std::move(server);
    channel_ = grpc::CreateChannel(absl::StrCat("127.0.0.1:", server_->port()),
                                   grpc::InsecureChannelCredentials());
    stub_ = pb::MlaOffload::NewStub(channel_);
  }

  void TearDown() override {
    stub_.reset();
    channel_.reset();
    server_.reset();
  }

  static void Deadline(grpc::ClientContext& context, absl::Duration timeout) {
    context.set_deadline(std::chrono::system_clock::now() + absl::ToChronoNanoseconds(timeout));
  }

  std::string CreateSession() {
    pb::CreateSessionRequest request;
    request.set_model(kFlash);
    request.set_num_heads(kHeads);
    pb::CreateSessionResponse response;
    grpc::ClientContext context;
    Deadline(context, absl::Seconds(10));
    const grpc::Status status = stub_->CreateSession(&context, request, &response);
    EXPECT_TRUE(status.ok()) << status.error_message();
    return response.session_id();
  }

  pb::ListSessionsResponse List() {
    pb::ListSessionsResponse response;
    grpc::ClientContext context;
    Deadline(context, absl::Seconds(10));
    const grpc::Status status = stub_->ListSessions(&context, pb::ListSessionsRequest(), &response);
    EXPECT_TRUE(status.ok()) << status.error_message();
    return response;
  }

  pb::ServerInfo Info(absl::Duration timeout = absl::Seconds(10)) {
    pb::ServerInfo info;
    grpc::ClientContext context;
    Deadline(context, timeout);
    const grpc::Status status = stub_->GetServerInfo(&context, pb::GetServerInfoRequest(), &info);
    EXPECT_TRUE(status.ok()) << status.error_message();
    return info;
  }

  // Waits until every call queued on the engine in FIFO order before it has
  // run: a CloseSession of no session is answered in order.
  void Barrier() {
    pb::CloseSessionRequest request;
    request.set_session_id("no such session");
    pb::CloseSessionResponse response;
    grpc::ClientContext context;
    Deadline(context, absl::Seconds(10));
    EXPECT_EQ(stub_->CloseSession(&context, request, &response).error_code(),
              grpc::StatusCode::NOT_FOUND);
  }

  // A raw call of `method` with `bytes` as the request.
  grpc::Status RawUnary(const std::string& method, const std::string& bytes) {
    grpc::GenericStub generic(channel_);
    grpc::ClientContext context;
    Deadline(context, absl::Seconds(10));
    grpc::Slice slice(bytes);
    grpc::ByteBuffer request(&slice, 1), response;
    std::promise<grpc::Status> done;
    generic.UnaryCall(&context, absl::StrCat("/mla_offload.v1.MlaOffload/", method), {}, &request,
                      &response, [&done](grpc::Status status) { done.set_value(status); });
    return done.get_future().get();
  }

  metrics::Registry registry_;
  std::unique_ptr<OffloadServer> server_;
  std::shared_ptr<grpc::Channel> channel_;
  std::unique_ptr<pb::MlaOffload::Stub> stub_;
};

// Eight steps of one layer in flight on one stream. While message 1 sits
// between parsing and queueing, message 0 is answered, which lets the
// stream read on; the service must not start reading message 2 until
// message 1 is queued. Before the fix it did: message 2 could then be
// queued first, fail FAILED_PRECONDITION, and so did every later step.
// The hook gives the read of message 2 a second to start; with the fix it
// never can.
// A second server on a port in use refuses to start (gRPC's default
// SO_REUSEPORT would let it bind, and new connections would be split
// between the two servers); the first one goes on serving.
TEST_F(ServiceTest, ASecondServerOnAPortInUseRefusesToStart) {
  Start();
  OffloadServerOptions options;
  options.engine.kv_blocks = 100;
  options.engine.max_position = 4096;
  options.engine.models = {*FindModelProfile(kFlash)};
  options.listen = absl::StrCat("127.0.0.1:", server_->port());
  metrics::Registry registry;
  absl::StatusOr<std::unique_ptr<OffloadServer>> second =
      OffloadServer::Start(std::make_unique<CpuBackend>(1), options, registry);
  ASSERT_FALSE(second.ok()) << "a second server listens on port " << server_->port();
  EXPECT_EQ(second.status().code(), absl::StatusCode::kUnavailable) << second.status();
  EXPECT_NE(second.status().message().find("address in use"), absl::string_view::npos)
      << second.status();
  EXPECT_FALSE(CreateSession().empty()) << "the first server stopped answering";
}

// A Unix domain socket beside the TCP port (for clients on the same host):
// the service answers on it as on TCP, a second server refuses a path that
// exists, and the socket goes when the server stops.
TEST_F(ServiceTest, ServesOnAUnixSocketBesideTcp) {
  // Short: a socket's path has at most 107 characters (test temp dirs are longer).
  const std::string path = absl::StrCat("/tmp/mla_service_test_", ::getpid(), ".sock");
  std::remove(path.c_str());
  Start([&](OffloadServerOptions& options) { options.unix_sockets = {path}; });
  struct stat socket_file;
  ASSERT_EQ(::stat(path.c_str(), &socket_file), 0) << path;
  EXPECT_TRUE(S_ISSOCK(socket_file.st_mode));
  std::unique_ptr<pb::MlaOffload::Stub> over_unix = pb::MlaOffload::NewStub(
      grpc::CreateChannel("unix:" + path, grpc::InsecureChannelCredentials()));
  const std::string session = CreateSession();  // over TCP
  pb::GetServerInfoRequest request;
  pb::ServerInfo info;
  grpc::ClientContext context;
  Deadline(context, absl::Seconds(10));
  const grpc::Status status = over_unix->GetServerInfo(&context, request, &info);
  ASSERT_TRUE(status.ok()) << status.error_message();
  EXPECT_EQ(info.sessions(), 1) << "the same server answers on both";

  OffloadServerOptions options;
  options.engine.kv_blocks = 100;
  options.engine.max_position = 4096;
  options.engine.models = {*FindModelProfile(kFlash)};
  options.unix_sockets = {path};
  metrics::Registry registry;
  absl::StatusOr<std::unique_ptr<OffloadServer>> second =
      OffloadServer::Start(std::make_unique<CpuBackend>(1), options, registry);
  ASSERT_FALSE(second.ok()) << "a second server took " << path;
  EXPECT_EQ(second.status().code(), absl::StatusCode::kFailedPrecondition) << second.status();
  EXPECT_THAT(std::string(second.status().message()), ::testing::HasSubstr("the path exists"));
  options.unix_sockets = {"/tmp/" + std::string(120, 'x')};
  second = OffloadServer::Start(std::make_unique<CpuBackend>(1), options, registry);
  ASSERT_FALSE(second.ok());
  EXPECT_THAT(std::string(second.status().message()),
              ::testing::HasSubstr("a Unix socket's at most 107"));

  over_unix.reset();
  TearDown();
  EXPECT_NE(::stat(path.c_str(), &socket_file), 0) << path << " is left after the server stopped";
}

TEST_F(ServiceTest, AStreamsMessagesRunInTheOrderTheyWereSent) {
  std::mutex mutex;
  std::condition_variable changed;
  std::vector<uint64_t> queued;
  uint64_t reads_started = 0;
  std::vector<std::string> violations;
  Start([&](OffloadServerOptions& options) {
    options.service.before_read_attend = [&](uint64_t sequence) {
      std::lock_guard<std::mutex> lock(mutex);
      reads_started = std::max(reads_started, sequence + 1);
      if (sequence > queued.size()) {
        violations.push_back(absl::StrCat("the read of message ", sequence, " started while only ",
                                          queued.size(), " were queued"));
      }
      changed.notify_all();
    };
    options.service.before_queue_attend = [&](uint64_t sequence) {
      std::unique_lock<std::mutex> lock(mutex);
      if (sequence == 1) {
        changed.wait_for(lock, std::chrono::seconds(1), [&] { return reads_started > 2; });
      }
      queued.push_back(sequence);
    };
  });
  const std::string session = CreateSession();
  grpc::ClientContext context;
  Deadline(context, absl::Seconds(30));
  auto stream = stub_->Attend(&context);
  constexpr int kSteps = 8;
  for (int p = 0; p < kSteps; ++p) ASSERT_TRUE(stream->Write(Step(session, p)));
  stream->WritesDone();
  for (int p = 0; p < kSteps; ++p) {
    pb::AttendResponse response;
    ASSERT_TRUE(stream->Read(&response)) << "answer " << p;
    EXPECT_EQ(response.request_id(), 1000u + p);
    EXPECT_EQ(response.status().code(), 0) << "step " << p << ": " << response.status().message();
  }
  EXPECT_TRUE(stream->Finish().ok());
  std::lock_guard<std::mutex> lock(mutex);
  EXPECT_THAT(violations, ::testing::IsEmpty());
  EXPECT_THAT(queued, ::testing::ElementsAre(0, 1, 2, 3, 4, 5, 6, 7));
}

// GetServerInfo is answered while the engine is busy (it waited behind
// every queued batch before); its counts are the engine's last published
// state.
TEST_F(ServiceTest, ServerInfoDoesNotWaitForTheEngine) {
  Start();
  const std::string session = CreateSession();
  EngineHold hold(server_->scheduler());
  const absl::Time start = absl::Now();
  const pb::ServerInfo info = Info(absl::Seconds(2));
  EXPECT_LT(absl::Now() - start, absl::Seconds(2));
  EXPECT_EQ(info.sessions(), 1);
  EXPECT_EQ(info.version(), "service_test");
  EXPECT_GT(info.kv_blocks_used(), 0);
  ASSERT_EQ(info.models_size(), 1);
  EXPECT_EQ(info.models(0).name(), kFlash);
}

// A unary call whose deadline passes while it waits for the engine does
// nothing when the engine reaches it: no session is created (it held blocks
// until its TTL before), no AppendKV applied.
TEST_F(ServiceTest, CallsWhoseDeadlinePassedInTheQueueDoNothing) {
  Start();
  const std::string session = CreateSession();
  const pb::ServerInfo before = Info();
  {
    EngineHold hold(server_->scheduler());
    pb::CreateSessionRequest create;
    create.set_model(kFlash);
    create.set_num_heads(kHeads);
    pb::CreateSessionResponse created;
    grpc::ClientContext create_context;
    Deadline(create_context, absl::Milliseconds(200));
    EXPECT_EQ(stub_->CreateSession(&create_context, create, &created).error_code(),
              grpc::StatusCode::DEADLINE_EXCEEDED);

    pb::AppendKVRequest append;
    append.set_session_id(session);
    append.set_first_position(0);
    append.set_num_positions(1);
    const ModelProfile& profile = **FindModelProfile(kFlash);
    for (int layer = 0; layer < profile.num_attention_layers(); ++layer) {
      pb::LayerRows* rows = append.add_layers();
      rows->set_layer(layer);
      SetTensor(rows->mutable_swa_kv(), pb::DTYPE_BF16, {1, kHeadDim}, Bytes(TestRows(layer, 1)));
    }
    pb::AppendKVResponse appended;
    grpc::ClientContext append_context;
    Deadline(append_context, absl::Milliseconds(200));
    EXPECT_EQ(stub_->AppendKV(&append_context, append, &appended).error_code(),
              grpc::StatusCode::DEADLINE_EXCEEDED);
    // The server's deadline is the client's timeout counted from when the
    // request arrived: later than the client's by the request's way there.
    // Hold the engine until that has surely passed too.
    absl::SleepFor(absl::Seconds(1));
  }
  Barrier();
  const pb::ListSessionsResponse sessions = List();
  ASSERT_EQ(sessions.sessions_size(), 1);
  EXPECT_EQ(sessions.sessions(0).session_id(), session);
  EXPECT_EQ(sessions.sessions(0).next_position(), 0) << "the late AppendKV was applied";
  EXPECT_EQ(Info().kv_blocks_used(), before.kv_blocks_used());
}

// Messages of a stream that was cancelled while they waited for the engine
// are not run: the client that sent them will never see what they did.
TEST_F(ServiceTest, ACancelledStreamsQueuedMessagesDoNotRun) {
  Start();
  const std::string session = CreateSession();
  {
    EngineHold hold(server_->scheduler());
    grpc::ClientContext context;
    auto stream = stub_->Attend(&context);
    ASSERT_TRUE(stream->Write(Step(session, 0)));
    // Queued once the server has read it: it is then counted.
    const absl::Time give_up = absl::Now() + absl::Seconds(10);
    while (server_->scheduler().queued_messages() == 0 && absl::Now() < give_up) {
      std::this_thread::yield();
    }
    ASSERT_EQ(server_->scheduler().queued_messages(), 1);
    context.TryCancel();
    while (server_->service().open_streams() > 0 && absl::Now() < give_up) {
      std::this_thread::yield();
    }
    ASSERT_EQ(server_->service().open_streams(), 0) << "the server did not see the cancel";
    stream->Finish().IgnoreError();
  }
  Barrier();
  // Layer 0 still expects position 0: the step at 1 is out of order, and the
  // step at 0 runs.
  grpc::ClientContext context;
  Deadline(context, absl::Seconds(10));
  auto stream = stub_->Attend(&context);
  pb::AttendResponse response;
  ASSERT_TRUE(stream->Write(Step(session, 1)));
  ASSERT_TRUE(stream->Read(&response));
  EXPECT_EQ(response.status().code(), static_cast<int>(grpc::StatusCode::FAILED_PRECONDITION))
      << "the cancelled stream's step ran: " << response.status().message();
  EXPECT_THAT(response.status().message(), HasSubstr("expects position 0"));
  ASSERT_TRUE(stream->Write(Step(session, 0)));
  ASSERT_TRUE(stream->Read(&response));
  EXPECT_EQ(response.status().code(), 0) << response.status().message();
  stream->WritesDone();
  EXPECT_TRUE(stream->Finish().ok());
}

// A unary request that does not parse is INVALID_ARGUMENT naming what did
// not parse (gRPC's own deserialisation answered with an empty message).
TEST_F(ServiceTest, UnaryRequestsThatDoNotParseSayWhy) {
  Start();
  struct Case {
    std::string method;
    std::string bytes;
    std::string field;
  };
  const std::vector<Case> cases = {
      {"CreateSession", std::string("\x0a\x40" "abc", 5), "CreateSessionRequest.model"},
      {"CreateSession", std::string("\x0a\x02\xc3\x28", 4), "CreateSessionRequest.model"},
      {"AppendKV", std::string("\x22\x04\x12\x02\x10\xff", 6),
       "AppendKVRequest.layers[0].swa_kv.shape[0]"},
      {"CloseSession", std::string("\x0a", 1), "CloseSessionRequest"},
      {"ListSessions", std::string("\x08\x80", 2), "ListSessionsRequest"},
      {"GetServerInfo", std::string("\x0b", 1), "GetServerInfoRequest"},
  };
  for (const Case& c : cases) {
    const grpc::Status status = RawUnary(c.method, c.bytes);
    EXPECT_EQ(status.error_code(), grpc::StatusCode::INVALID_ARGUMENT)
        << c.method << ": " << status.error_message();
    EXPECT_THAT(status.error_message(), HasSubstr(c.field)) << c.method;
  }
  EXPECT_EQ(List().sessions_size(), 0);
}

// Client strings are echoed in error messages at most 64 bytes long: a 16
// KiB model name or session id used to push the real error out of the
// trailers ("metadata size exceeds limit").
TEST_F(ServiceTest, ErrorsEchoClientStringsBounded) {
  Start();
  const std::string huge(16 << 10, 'x');
  pb::CreateSessionRequest create;
  create.set_model(huge);
  create.set_num_heads(kHeads);
  pb::CreateSessionResponse created;
  grpc::ClientContext create_context;
  Deadline(create_context, absl::Seconds(10));
  const grpc::Status bad_model = stub_->CreateSession(&create_context, create, &created);
  EXPECT_EQ(bad_model.error_code(), grpc::StatusCode::INVALID_ARGUMENT) << bad_model.error_message();
  EXPECT_THAT(bad_model.error_message(), HasSubstr("is not served here"));
  EXPECT_THAT(bad_model.error_message(), HasSubstr("(16384 bytes)"));
  EXPECT_LT(bad_model.error_message().size(), 512u);

  pb::CloseSessionRequest close;
  close.set_session_id(huge);
  pb::CloseSessionResponse closed;
  grpc::ClientContext close_context;
  Deadline(close_context, absl::Seconds(10));
  const grpc::Status unknown = stub_->CloseSession(&close_context, close, &closed);
  EXPECT_EQ(unknown.error_code(), grpc::StatusCode::NOT_FOUND) << unknown.error_message();
  EXPECT_THAT(unknown.error_message(), HasSubstr("does not exist"));
  EXPECT_LT(unknown.error_message().size(), 512u);

  grpc::ClientContext context;
  Deadline(context, absl::Seconds(10));
  auto stream = stub_->Attend(&context);
  ASSERT_TRUE(stream->Write(Step(huge, 0)));
  pb::AttendResponse response;
  ASSERT_TRUE(stream->Read(&response));
  EXPECT_EQ(response.status().code(), static_cast<int>(grpc::StatusCode::NOT_FOUND));
  EXPECT_THAT(response.status().message(), HasSubstr("does not exist"));
  EXPECT_LT(response.status().message().size(), 512u);
  stream->WritesDone();
  EXPECT_TRUE(stream->Finish().ok());
}

// A drain waits for Echo streams as it waits for Attend streams (it cut them
// at once before): an Echo stream open when the drain begins still echoes,
// and the drain ends when it closes.
TEST_F(ServiceTest, ADrainLetsOpenEchoStreamsFinish) {
  Start();
  grpc::ClientContext context;
  Deadline(context, absl::Seconds(30));
  auto echo = stub_->Echo(&context);
  pb::EchoMessage message;
  message.set_payload("before the drain");
  ASSERT_TRUE(echo->Write(message));
  pb::EchoMessage back;
  ASSERT_TRUE(echo->Read(&back));
  EXPECT_EQ(server_->service().open_streams(), 1) << "an open Echo stream is not counted";

  std::thread drain([this] { server_->Drain(absl::Seconds(20)); });
  const absl::Time give_up = absl::Now() + absl::Seconds(10);
  while (!server_->service().draining() && absl::Now() < give_up) std::this_thread::yield();
  ASSERT_TRUE(server_->service().draining());
  message.set_payload("while draining");
  ASSERT_TRUE(echo->Write(message));
  ASSERT_TRUE(echo->Read(&back));
  EXPECT_EQ(back.payload(), "while draining");
  echo->WritesDone();
  EXPECT_TRUE(echo->Finish().ok());
  drain.join();
}

// The value of an unlabelled sample in the registry's text; -1 when absent.
double MetricValue(const metrics::Registry& registry, const std::string& name) {
  const std::string text = registry.RenderText();
  const size_t at = text.find("\n" + name + " ");
  if (at == std::string::npos) return -1;
  return std::strtod(text.c_str() + at + name.size() + 2, nullptr);
}

// A client that sends many Attend messages and reads none of the answers:
// the stream stops reading once its unanswered bytes reach the bound (the
// server takes a bounded number of messages, not all of them, and holds a
// bounded number of bytes), and the client's writes are then held by flow
// control. Once the client reads, every answer comes, in order, and the
// stream ends normally. gRPC's own buffers are made small on both ends so
// that what the server takes is the service's doing.
TEST_F(ServiceTest, AStreamWhoseAnswersAreNotReadStopsReadingAtItsByteBound) {
  constexpr int64_t kBound = int64_t{2} << 20;
  constexpr int kTokens = 16;
  constexpr int kMessages = 100;
  std::mutex mutex;
  uint64_t reads_started = 0;
  Start([&](OffloadServerOptions& options) {
    options.service.max_unanswered_bytes = kBound;
    options.service.max_messages_in_flight = 1024;  // only the bytes bound the read-ahead
    options.transport.lookahead_bytes = 256 << 10;
    options.transport.write_buffer_size = 64 << 10;
    options.transport.bdp_probe = 0;
    options.service.before_read_attend = [&](uint64_t sequence) {
      std::lock_guard<std::mutex> lock(mutex);
      reads_started = std::max(reads_started, sequence + 1);
    };
  });
  const std::string session = CreateSession();
  grpc::ChannelArguments args;
  args.SetInt(GRPC_ARG_HTTP2_BDP_PROBE, 0);
  args.SetInt(GRPC_ARG_HTTP2_STREAM_LOOKAHEAD_BYTES, 256 << 10);
  args.SetMaxReceiveMessageSize(-1);
  std::unique_ptr<pb::MlaOffload::Stub> stub = pb::MlaOffload::NewStub(grpc::CreateCustomChannel(
      absl::StrCat("127.0.0.1:", server_->port()), grpc::InsecureChannelCredentials(), args));
  grpc::ClientContext context;
  Deadline(context, absl::Seconds(60));
  auto stream = stub->Attend(&context);
  // Each message: 16 tokens of q (128 KiB) and kv (16 KiB); each answer
  // 128 KiB of out.
  std::thread writer([&] {
    for (int m = 0; m < kMessages; ++m) {
      pb::AttendRequest request;
      request.set_request_id(m);
      request.set_layer(kSwaLayer);
      pb::Segment* segment = request.add_segments();
      segment->set_session_id(session);
      segment->set_position(m * kTokens);
      segment->set_num_tokens(kTokens);
      SetTensor(request.mutable_q(), pb::DTYPE_BF16, {kTokens, kHeads, kHeadDim},
                Bytes(TestRows(7000 + m, kTokens * kHeads)));
      SetTensor(request.mutable_kv(), pb::DTYPE_BF16, {kTokens, kHeadDim},
                Bytes(TestRows(9000 + m, kTokens)));
      if (!stream->Write(request)) return;
    }
    stream->WritesDone();
  });

  // The stream pauses; then nothing it read waits for the engine.
  const absl::Time give_up = absl::Now() + absl::Seconds(30);
  while (MetricValue(registry_, "mla_stream_read_pauses_total") < 1 && absl::Now() < give_up) {
    absl::SleepFor(absl::Milliseconds(5));
  }
  ASSERT_GE(MetricValue(registry_, "mla_stream_read_pauses_total"), 1)
      << "the stream never stopped reading";
  while (server_->scheduler().queued_messages() > 0 && absl::Now() < give_up) {
    absl::SleepFor(absl::Milliseconds(5));
  }
  Barrier();
  // Messages held unanswered: fewer than bound / 128 KiB + 1; written ones
  // sit in gRPC's write buffer and the client's window (about 6 more).
  {
    std::lock_guard<std::mutex> lock(mutex);
    EXPECT_LT(reads_started, 40u) << "the server read on although no answer was read";
  }
  const double held = MetricValue(registry_, "mla_stream_unanswered_bytes");
  EXPECT_GT(held, 0);
  EXPECT_LE(held, kBound + (int64_t{160} << 10));

  for (int m = 0; m < kMessages; ++m) {
    pb::AttendResponse response;
    ASSERT_TRUE(stream->Read(&response)) << "answer " << m;
    EXPECT_EQ(response.request_id(), static_cast<uint64_t>(m));
    EXPECT_EQ(response.status().code(), 0) << "message " << m << ": " << response.status().message();
  }
  writer.join();
  EXPECT_TRUE(stream->Finish().ok());
  {
    std::lock_guard<std::mutex> lock(mutex);
    EXPECT_EQ(reads_started, static_cast<uint64_t>(kMessages) + 1) << "and the end of the stream";
  }
  EXPECT_EQ(MetricValue(registry_, "mla_stream_unanswered_bytes"), 0);
}

// gRPC 1.51 cannot bound the number of connections; its memory quota
// bounds what they hold. A message that would take the connections past it
// ends its stream with RESOURCE_EXHAUSTED (gRPC's ENHANCE_YOUR_CALM) instead
// of growing the server, and the server goes on answering what fits (a
// call may first meet the GOAWAY that gRPC sends connections without
// streams under pressure: UNAVAILABLE, which a client retries).
TEST_F(ServiceTest, PastTheTransportMemoryQuotaGrpcRefusesInsteadOfGrowing) {
  Start([](OffloadServerOptions& options) {
    options.connections.max_transport_memory_bytes = 1 << 20;
  });
  const auto echo = [this](size_t bytes) {
    grpc::ClientContext context;
    Deadline(context, absl::Seconds(30));
    auto stream = stub_->Echo(&context);
    pb::EchoMessage message;
    message.set_payload(std::string(bytes, 'x'));
    pb::EchoMessage back;
    if (stream->Write(message) && stream->Read(&back)) stream->WritesDone();
    return stream->Finish();
  };
  const grpc::Status refused = echo(3 << 20);
  EXPECT_EQ(refused.error_code(), grpc::StatusCode::RESOURCE_EXHAUSTED) << refused.error_message();
  grpc::Status small;
  for (int attempt = 0; attempt < 5; ++attempt) {
    small = echo(1000);
    if (small.error_code() != grpc::StatusCode::UNAVAILABLE) break;
  }
  EXPECT_TRUE(small.ok()) << small.error_code() << " " << small.error_message();
}

// Without authentication the server is one tenant: the per-tenant limits
// do not apply (the pool bounds it, as before tenants), so a loopback server
// takes more sessions, KV blocks and streams than they say.
TEST_F(ServiceTest, WithoutAuthenticationThePerTenantLimitsDoNotApply) {
  Start([](OffloadServerOptions& options) {
    options.service.tenants.max_sessions = 1;
    options.service.tenants.max_kv_blocks = 1;
    options.service.tenants.max_streams = 1;
  });
  for (int i = 0; i < 3; ++i) EXPECT_FALSE(CreateSession().empty());
  EXPECT_EQ(List().sessions_size(), 3);
  grpc::ClientContext first_context, second_context;
  Deadline(first_context, absl::Seconds(30));
  Deadline(second_context, absl::Seconds(30));
  auto first = stub_->Echo(&first_context);
  auto second = stub_->Echo(&second_context);
  for (auto* echo : {first.get(), second.get()}) {
    pb::EchoMessage message, back;
    message.set_payload("two streams");
    ASSERT_TRUE(echo->Write(message));
    ASSERT_TRUE(echo->Read(&back));
    EXPECT_EQ(back.payload(), "two streams");
    echo->WritesDone();
    EXPECT_TRUE(echo->Finish().ok());
  }
}

// ---- Regions (the same-host data plane).

// Bytes of a region for a reference.
void SetRegion(pb::RegionRef* ref, uint64_t id, int64_t offset, int64_t bytes) {
  ref->set_region_id(id);
  ref->set_offset(offset);
  ref->set_byte_size(bytes);
}

// The Attend message `inline_step` with q and kv at the start of region
// `id` (copied into `memory` there) and out after them.
pb::AttendRequest InRegion(const pb::AttendRequest& inline_step, uint64_t id, uint8_t* memory) {
  pb::AttendRequest request = inline_step;
  const std::string& q = inline_step.q().data();
  const std::string& kv = inline_step.kv().data();
  std::memcpy(memory, q.data(), q.size());
  std::memcpy(memory + q.size(), kv.data(), kv.size());
  request.mutable_q()->clear_data();
  SetRegion(request.mutable_q()->mutable_region(), id, 0, q.size());
  request.mutable_kv()->clear_data();
  SetRegion(request.mutable_kv()->mutable_region(), id, q.size(), kv.size());
  SetRegion(request.mutable_out_region(), id, q.size() + kv.size(), q.size());
  return request;
}

class RegionServiceTest : public ServiceTest {
 protected:
  // A unary call of `stub` as the client `client_id` ("": none).
  template <typename Request, typename Response>
  grpc::Status Call(grpc::Status (pb::MlaOffload::Stub::*method)(grpc::ClientContext*,
                                                                  const Request&, Response*),
                    const Request& request, Response* response, const std::string& client_id = "",
                    pb::MlaOffload::Stub* stub = nullptr) {
    grpc::ClientContext context;
    Deadline(context, absl::Seconds(10));
    if (!client_id.empty()) context.AddMetadata("mla-client-id", client_id);
    return ((stub != nullptr ? *stub : *stub_).*method)(&context, request, response);
  }

  absl::StatusOr<uint64_t> Register(const SharedMemory& memory, const std::string& client_id = "",
                                    pb::MlaOffload::Stub* stub = nullptr) {
    pb::RegisterRegionRequest request;
    request.set_kind(pb::REGION_KIND_SYSTEM_SHM);
    request.set_name(memory.name());
    request.set_byte_size(memory.bytes());
    pb::RegisterRegionResponse response;
    const grpc::Status status =
        Call(&pb::MlaOffload::Stub::RegisterRegion, request, &response, client_id, stub);
    if (!status.ok()) {
      return absl::Status(static_cast<absl::StatusCode>(status.error_code()),
                          status.error_message());
    }
    return response.region_id();
  }

  // The inline step at `position` of layer 0 runs: the refused steps
  // before it changed nothing.
  void ExpectStepRuns(const std::string& session, int32_t position) {
    grpc::ClientContext context;
    Deadline(context, absl::Seconds(30));
    auto stream = stub_->Attend(&context);
    pb::AttendResponse answer;
    ASSERT_TRUE(stream->Write(Step(session, position)));
    ASSERT_TRUE(stream->Read(&answer));
    EXPECT_EQ(answer.status().code(), 0) << answer.status().message();
    stream->WritesDone();
    EXPECT_TRUE(stream->Finish().ok());
  }

  std::vector<uint64_t> Regions(const std::string& client_id = "") {
    pb::ListRegionsResponse response;
    const grpc::Status status = Call(&pb::MlaOffload::Stub::ListRegions, pb::ListRegionsRequest(),
                                     &response, client_id);
    EXPECT_TRUE(status.ok()) << status.error_message();
    std::vector<uint64_t> ids;
    for (const pb::RegionInfo& info : response.regions()) ids.push_back(info.region_id());
    return ids;
  }
};

// A region unregistered while a step that uses it waits for the engine:
// the step still reads q and kv from it and writes its answer there (the
// server keeps it mapped, though the client has unlinked it too), and the
// answer is bit for bit the inline one; the next reference is NOT_FOUND and
// changes nothing.
TEST_F(RegionServiceTest, ARegionUnregisteredWhileAStepUsesItStaysMappedForThatStep) {
  Start();
  const std::string twin = CreateSession();
  const std::string session = CreateSession();
  SharedMemory memory(1 << 20);
  absl::StatusOr<uint64_t> id = Register(memory);
  ASSERT_TRUE(id.ok()) << id.status();
  EXPECT_THAT(Regions(), ::testing::ElementsAre(*id));

  grpc::ClientContext context;
  Deadline(context, absl::Seconds(30));
  auto stream = stub_->Attend(&context);
  pb::AttendResponse inline_answer;
  ASSERT_TRUE(stream->Write(Step(twin, 0)));
  ASSERT_TRUE(stream->Read(&inline_answer));
  ASSERT_EQ(inline_answer.status().code(), 0) << inline_answer.status().message();
  const pb::AttendRequest step = InRegion(Step(session, 0), *id, memory.data());
  const int64_t out_at = step.out_region().offset();
  {
    EngineHold hold(server_->scheduler());
    ASSERT_TRUE(stream->Write(step));
    const absl::Time give_up = absl::Now() + absl::Seconds(10);
    while (server_->scheduler().queued_messages() == 0 && absl::Now() < give_up) {
      std::this_thread::yield();
    }
    ASSERT_EQ(server_->scheduler().queued_messages(), 1);
    pb::UnregisterRegionRequest unregister;
    unregister.set_region_id(*id);
    pb::UnregisterRegionResponse unregistered;
    const grpc::Status status =
        Call(&pb::MlaOffload::Stub::UnregisterRegion, unregister, &unregistered);
    ASSERT_TRUE(status.ok()) << status.error_message();
    EXPECT_TRUE(Regions().empty());
    shm_unlink(memory.name().c_str());
  }
  pb::AttendResponse answer;
  ASSERT_TRUE(stream->Read(&answer));
  EXPECT_EQ(answer.status().code(), 0) << answer.status().message();
  EXPECT_FALSE(answer.has_out()) << "the answer is in the region";
  EXPECT_FALSE(answer.has_lse());
  EXPECT_GT(answer.timing().total_us(), 0);
  const std::string& expected = inline_answer.out().data();
  EXPECT_EQ(std::memcmp(memory.data() + out_at, expected.data(), expected.size()), 0);

  ASSERT_TRUE(stream->Write(InRegion(Step(session, 1), *id, memory.data())));
  ASSERT_TRUE(stream->Read(&answer));
  EXPECT_EQ(answer.status().code(), static_cast<int>(grpc::StatusCode::NOT_FOUND));
  EXPECT_THAT(answer.status().message(),
              HasSubstr("AttendRequest.q.region: region 1 is not registered by this client"));
  stream->WritesDone();
  EXPECT_TRUE(stream->Finish().ok());
  ExpectStepRuns(session, 1);
}

// The FP8 output on the wire: out as [T, H, 512] e4m3fn and out_scales as
// [T, H, 4] UE8M0 (516 bytes a head, against bf16's 1024), or written into
// out_region and out_scales_region, bit for bit the inline answer. Each
// malformed combination is refused naming the field and what to change,
// and changes nothing: the step then runs at the same position.
TEST_F(RegionServiceTest, Fp8AnswersGoInlineOrIntoTheirRegions) {
  Start();
  const std::string twin = CreateSession();
  const std::string session = CreateSession();
  SharedMemory memory(1 << 20);
  absl::StatusOr<uint64_t> id = Register(memory);
  ASSERT_TRUE(id.ok()) << id.status();

  grpc::ClientContext context;
  Deadline(context, absl::Seconds(30));
  auto stream = stub_->Attend(&context);
  pb::AttendRequest inline_step = Step(twin, 0);
  inline_step.set_fp8_output(true);
  inline_step.set_return_lse(true);
  pb::AttendResponse inline_answer;
  ASSERT_TRUE(stream->Write(inline_step));
  ASSERT_TRUE(stream->Read(&inline_answer));
  ASSERT_EQ(inline_answer.status().code(), 0) << inline_answer.status().message();
  EXPECT_EQ(inline_answer.out().dtype(), pb::DTYPE_E4M3FN);
  EXPECT_THAT(inline_answer.out().shape(), ::testing::ElementsAre(1, kHeads, kHeadDim));
  EXPECT_EQ(inline_answer.out().data().size(), size_t{kHeads} * 512);
  EXPECT_EQ(inline_answer.out_scales().dtype(), pb::DTYPE_UE8M0);
  EXPECT_THAT(inline_answer.out_scales().shape(), ::testing::ElementsAre(1, kHeads, 4));
  EXPECT_EQ(inline_answer.out_scales().data().size(), size_t{kHeads} * 4);
  EXPECT_EQ(inline_answer.lse().data().size(), size_t{kHeads} * 4);

  // Into regions: q, kv, then out (its e4m3 bytes), the scales and lse.
  const auto into_regions = [&](int32_t position) {
    pb::AttendRequest step = InRegion(Step(session, position), *id, memory.data());
    step.set_fp8_output(true);
    step.set_return_lse(true);
    const int64_t out_at = step.out_region().offset();
    SetRegion(step.mutable_out_region(), *id, out_at, kHeads * 512);
    SetRegion(step.mutable_out_scales_region(), *id, out_at + kHeads * 512, kHeads * 4);
    SetRegion(step.mutable_lse_region(), *id, out_at + kHeads * 516, kHeads * 4);
    return step;
  };
  struct Refusal {
    std::string what;
    std::function<void(pb::AttendRequest&)> change;
    std::string words;
  };
  const std::vector<Refusal> refusals = {
      {"scales without fp8_output", [](pb::AttendRequest& r) { r.set_fp8_output(false); },
       "AttendRequest.out_scales_region: only with out_region and fp8_output; drop it, or set "
       "both"},
      {"fp8 into out_region without a scales region",
       [](pb::AttendRequest& r) { r.clear_out_scales_region(); },
       "AttendRequest.out_scales_region: an answer written into out_region sends no tensors, so "
       "fp8_output needs an out_scales_region too"},
      {"a bf16-sized out_region",
       [](pb::AttendRequest& r) { r.mutable_out_region()->set_byte_size(kHeads * 1024); },
       "out_region.byte_size: the answer's out [T, H, 512] e4m3fn is 4096 bytes (T = 1, H = 8); "
       "the reference names 8192: name exactly 4096"},
      {"scales one byte short",
       [](pb::AttendRequest& r) { r.mutable_out_scales_region()->set_byte_size(kHeads * 4 - 1); },
       "out_scales_region.byte_size: the answer's out_scales [T, H, 4] UE8M0 is 32 bytes"},
      {"scales at an offset not a multiple of 4",
       [](pb::AttendRequest& r) {
         r.mutable_out_scales_region()->set_offset(r.out_scales_region().offset() + 2);
       },
       "is not a multiple of 4"},
      {"scales past the region",
       [](pb::AttendRequest& r) { r.mutable_out_scales_region()->set_offset(int64_t{1} << 62); },
       "AttendRequest.out_scales_region: bytes [4611686018427387904, 4611686018427387904 + 32)"},
  };
  for (const Refusal& refusal : refusals) {
    pb::AttendRequest step = into_regions(0);
    refusal.change(step);
    pb::AttendResponse answer;
    ASSERT_TRUE(stream->Write(step));
    ASSERT_TRUE(stream->Read(&answer));
    EXPECT_EQ(answer.status().code(), static_cast<int>(grpc::StatusCode::INVALID_ARGUMENT))
        << refusal.what << ": " << answer.status().message();
    EXPECT_THAT(answer.status().message(), HasSubstr(refusal.words)) << refusal.what;
  }
  EXPECT_EQ(List().sessions(0).next_position(), 0) << "a refused step moved a session";
  EXPECT_EQ(List().sessions(1).next_position(), 0) << "a refused step moved a session";

  const pb::AttendRequest step = into_regions(0);
  const int64_t out_at = step.out_region().offset();
  pb::AttendResponse answer;
  ASSERT_TRUE(stream->Write(step));
  ASSERT_TRUE(stream->Read(&answer));
  ASSERT_EQ(answer.status().code(), 0) << answer.status().message();
  EXPECT_FALSE(answer.has_out() || answer.has_out_scales() || answer.has_lse())
      << "the answer is in the regions";
  const std::string expected = inline_answer.out().data() + inline_answer.out_scales().data() +
                               inline_answer.lse().data();
  EXPECT_EQ(std::memcmp(memory.data() + out_at, expected.data(), expected.size()), 0);
  stream->WritesDone();
  EXPECT_TRUE(stream->Finish().ok());
  ExpectStepRuns(session, 1);
}

// Clients that send an mla-client-id are told apart by it (over TCP and
// over a Unix socket alike): one's region does not exist for another, in
// its list, for references and to unregister. A malformed id is refused.
TEST_F(RegionServiceTest, AClientsRegionsDoNotExistForAnother) {
  Start();
  SharedMemory memory(1 << 20);
  const std::string a = "client-a-0123456789", b = "client-b-0123456789";
  absl::StatusOr<uint64_t> id = Register(memory, a);
  ASSERT_TRUE(id.ok()) << id.status();
  EXPECT_THAT(Regions(a), ::testing::ElementsAre(*id));
  EXPECT_TRUE(Regions(b).empty());
  EXPECT_TRUE(Regions().empty()) << "the connection without an id is another client";
  pb::UnregisterRegionRequest unregister;
  unregister.set_region_id(*id);
  pb::UnregisterRegionResponse unregistered;
  EXPECT_EQ(Call(&pb::MlaOffload::Stub::UnregisterRegion, unregister, &unregistered, b).error_code(),
            grpc::StatusCode::NOT_FOUND);
  const std::string session = CreateSession();
  grpc::ClientContext context;
  Deadline(context, absl::Seconds(30));
  context.AddMetadata("mla-client-id", b);
  auto stream = stub_->Attend(&context);
  ASSERT_TRUE(stream->Write(InRegion(Step(session, 0), *id, memory.data())));
  pb::AttendResponse answer;
  ASSERT_TRUE(stream->Read(&answer));
  EXPECT_EQ(answer.status().code(), static_cast<int>(grpc::StatusCode::NOT_FOUND));
  EXPECT_THAT(answer.status().message(), HasSubstr("is not registered by this client"));
  stream->WritesDone();
  EXPECT_TRUE(stream->Finish().ok());
  EXPECT_THAT(Regions(a), ::testing::ElementsAre(*id)) << "the owner's region is untouched";

  const absl::Status bad = Register(memory, "short").status();
  EXPECT_EQ(bad.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(std::string(bad.message()), HasSubstr("mla-client-id metadata: short is not 16"));
  ExpectStepRuns(session, 0);
}

// CUDA IPC is reserved in the contract, not served yet; kinds it does not
// name are refused; a draining server takes no regions.
TEST_F(RegionServiceTest, CudaIpcIsUnimplementedAndADrainTakesNoRegions) {
  Start();
  SharedMemory memory(4096);
  pb::RegisterRegionRequest request;
  request.set_kind(pb::REGION_KIND_CUDA_IPC);
  request.set_cuda_ipc_handle(std::string(64, '\0'));
  request.set_device_uuid("GPU-00000000-0000-0000-0000-000000000000");
  request.set_byte_size(4096);
  pb::RegisterRegionResponse response;
  grpc::Status status = Call(&pb::MlaOffload::Stub::RegisterRegion, request, &response);
  EXPECT_EQ(status.error_code(), grpc::StatusCode::UNIMPLEMENTED) << status.error_message();
  EXPECT_THAT(status.error_message(), HasSubstr("REGION_KIND_SYSTEM_SHM"));
  request.set_kind(static_cast<pb::RegionKind>(9));
  status = Call(&pb::MlaOffload::Stub::RegisterRegion, request, &response);
  EXPECT_EQ(status.error_code(), grpc::StatusCode::INVALID_ARGUMENT) << status.error_message();
  EXPECT_THAT(status.error_message(), HasSubstr("RegisterRegionRequest.kind: 9"));
  server_->service().StartDraining();
  EXPECT_EQ(Register(memory).status().code(), absl::StatusCode::kUnavailable);
  EXPECT_TRUE(Regions().empty());
}

// --allow_cuda_ipc=false: a CUDA IPC handle is refused before the backend
// sees it (here the CPU backend, which would say UNIMPLEMENTED), naming the
// flag; shared memory regions are still taken.
TEST_F(RegionServiceTest, CudaIpcIsRefusedWhenNotAllowed) {
  Start([](OffloadServerOptions& options) { options.service.allow_cuda_ipc = false; });
  pb::RegisterRegionRequest request;
  request.set_kind(pb::REGION_KIND_CUDA_IPC);
  request.set_cuda_ipc_handle(std::string(64, '\0'));
  request.set_device_uuid("GPU-00000000-0000-0000-0000-000000000000");
  request.set_byte_size(4096);
  pb::RegisterRegionResponse response;
  const grpc::Status status = Call(&pb::MlaOffload::Stub::RegisterRegion, request, &response);
  EXPECT_EQ(status.error_code(), grpc::StatusCode::PERMISSION_DENIED) << status.error_message();
  EXPECT_THAT(status.error_message(), HasSubstr("--allow_cuda_ipc=false"));
  SharedMemory memory(4096);
  EXPECT_TRUE(Register(memory).ok());
}

// ---- Authentication (tenants by bearer token).

constexpr char kAlphaToken[] = "alpha-token";

class AuthServiceTest : public RegionServiceTest {
 protected:
  // The server with a tokens file of one tenant, alpha, then `change`.
  void StartWithTokens(const std::function<void(OffloadServerOptions&)>& change = nullptr) {
    const char* dir = std::getenv("TEST_TMPDIR");
    const std::string path =
        absl::StrCat(dir != nullptr ? dir : "/tmp", "/",
                     ::testing::UnitTest::GetInstance()->current_test_info()->name(), ".tokens");
    const Sha256Digest hash = Sha256(kAlphaToken);
    std::ofstream(path) << "alpha "
                        << absl::BytesToHexString(absl::string_view(
                               reinterpret_cast<const char*>(hash.data()), hash.size()))
                        << "\n";
    Start([&](OffloadServerOptions& options) {
      options.auth.tokens_file = path;
      if (change) change(options);
    });
  }

  // A context for a call as alpha, or with no token.
  static void Authorise(grpc::ClientContext& context, bool as_alpha) {
    Deadline(context, absl::Seconds(10));
    if (as_alpha) context.AddMetadata("authorization", absl::StrCat("Bearer ", kAlphaToken));
  }
};

// A draining server authenticates first: a caller without a token is told
// UNAUTHENTICATED (what it must fix), one with a token UNAVAILABLE.
TEST_F(AuthServiceTest, ADrainAuthenticatesBeforeItRefuses) {
  StartWithTokens();
  server_->service().StartDraining();
  SharedMemory memory(4096);
  for (bool as_alpha : {false, true}) {
    const grpc::StatusCode expected =
        as_alpha ? grpc::StatusCode::UNAVAILABLE : grpc::StatusCode::UNAUTHENTICATED;
    pb::CreateSessionRequest create;
    create.set_model(kFlash);
    create.set_num_heads(kHeads);
    pb::CreateSessionResponse created;
    grpc::ClientContext create_context;
    Authorise(create_context, as_alpha);
    EXPECT_EQ(stub_->CreateSession(&create_context, create, &created).error_code(), expected);

    pb::AppendKVRequest append;
    append.set_session_id("00000000000000000000000000000000");
    append.set_num_positions(1);
    pb::AppendKVResponse appended;
    grpc::ClientContext append_context;
    Authorise(append_context, as_alpha);
    EXPECT_EQ(stub_->AppendKV(&append_context, append, &appended).error_code(), expected);

    pb::RegisterRegionRequest region;
    region.set_kind(pb::REGION_KIND_SYSTEM_SHM);
    region.set_name(memory.name());
    region.set_byte_size(memory.bytes());
    pb::RegisterRegionResponse registered;
    grpc::ClientContext region_context;
    Authorise(region_context, as_alpha);
    EXPECT_EQ(stub_->RegisterRegion(&region_context, region, &registered).error_code(), expected);
  }
}

// A tenant exactly at --max_kv_blocks_per_tenant may still append what adds
// no page: the count is the pages the planner finds missing, not what the
// request's shapes would suggest (here compressed_kv rows on an SWA-only
// layer, which hold no bytes and which the engine takes as no rows).
TEST_F(AuthServiceTest, AnAppendKVThatAddsNoPageIsTakenAtTheBlockLimit) {
  const ModelProfile& profile = **FindModelProfile(kFlash);
  StartWithTokens([&](OffloadServerOptions& options) {
    options.service.tenants.max_kv_blocks = int64_t{profile.num_attention_layers()} * kSwaRingBlocks;
  });
  pb::CreateSessionRequest create;
  create.set_model(kFlash);
  create.set_num_heads(kHeads);
  pb::CreateSessionResponse created;
  grpc::ClientContext create_context;
  Authorise(create_context, true);
  ASSERT_TRUE(stub_->CreateSession(&create_context, create, &created).ok());

  pb::AppendKVRequest append;
  append.set_session_id(created.session_id());
  append.set_first_position(0);
  append.set_num_positions(1);
  for (int layer = 0; layer < profile.num_attention_layers(); ++layer) {
    pb::LayerRows* rows = append.add_layers();
    rows->set_layer(layer);
    SetTensor(rows->mutable_swa_kv(), pb::DTYPE_BF16, {1, kHeadDim}, Bytes(TestRows(layer, 1)));
    if (layer == kSwaLayer) {
      rows->set_first_compressed_row(0);
      SetTensor(rows->mutable_compressed_kv(), pb::DTYPE_BF16, {5, 0}, "");
    }
  }
  pb::AppendKVResponse appended;
  grpc::ClientContext append_context;
  Authorise(append_context, true);
  const grpc::Status status = stub_->AppendKV(&append_context, append, &appended);
  EXPECT_TRUE(status.ok()) << status.error_message();
  EXPECT_EQ(appended.next_position(), 1);
  EXPECT_EQ(appended.kv_blocks_used(), int64_t{profile.num_attention_layers()} * kSwaRingBlocks);
}

// The host's first IPv4 address that is not a loopback one; empty if none.
std::string NonLoopbackAddress() {
  ifaddrs* interfaces = nullptr;
  if (getifaddrs(&interfaces) != 0) return "";
  std::string found;
  for (ifaddrs* i = interfaces; i != nullptr && found.empty(); i = i->ifa_next) {
    if (i->ifa_addr == nullptr || i->ifa_addr->sa_family != AF_INET) continue;
    char text[INET_ADDRSTRLEN];
    const in_addr& address = reinterpret_cast<sockaddr_in*>(i->ifa_addr)->sin_addr;
    if ((ntohl(address.s_addr) >> 24) == 127) continue;
    if (inet_ntop(AF_INET, &address, text, sizeof(text)) != nullptr) found = text;
  }
  freeifaddrs(interfaces);
  return found;
}

// A peer that is not on the server's host (here: this host over its
// network address, which the server cannot tell from another host's) may
// neither register nor reference a region: PERMISSION_DENIED saying why,
// and nothing changes.
TEST_F(RegionServiceTest, APeerNotOnTheHostMayNotUseRegions) {
  const std::string address = NonLoopbackAddress();
  if (address.empty()) GTEST_SKIP() << "this host has no network address besides loopback";
  Start([](OffloadServerOptions& options) { options.listen = "0.0.0.0:0"; });
  auto remote = pb::MlaOffload::NewStub(grpc::CreateChannel(
      absl::StrCat(address, ":", server_->port()), grpc::InsecureChannelCredentials()));
  SharedMemory memory(1 << 20);
  const absl::Status refused = Register(memory, "", remote.get()).status();
  EXPECT_EQ(refused.code(), absl::StatusCode::kPermissionDenied) << refused;
  EXPECT_THAT(std::string(refused.message()),
              HasSubstr("regions are for clients on the server's host"));
  EXPECT_THAT(std::string(refused.message()), HasSubstr(absl::StrCat("ipv4:", address)));
  absl::StatusOr<uint64_t> id = Register(memory, "local-client-0123456789");
  ASSERT_TRUE(id.ok()) << id.status();
  const std::string session = CreateSession();
  grpc::ClientContext context;
  Deadline(context, absl::Seconds(30));
  context.AddMetadata("mla-client-id", "local-client-0123456789");
  auto stream = remote->Attend(&context);
  ASSERT_TRUE(stream->Write(InRegion(Step(session, 0), *id, memory.data())));
  pb::AttendResponse answer;
  ASSERT_TRUE(stream->Read(&answer));
  EXPECT_EQ(answer.status().code(), static_cast<int>(grpc::StatusCode::PERMISSION_DENIED))
      << "another host used a local client's region by its id";
  stream->WritesDone();
  EXPECT_TRUE(stream->Finish().ok());
  ExpectStepRuns(session, 0);
}

}  // namespace
}  // namespace mla

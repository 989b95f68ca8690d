// The mla command-line tool run as a process against the real server: each
// subcommand's output and exit status, the .npy round trip of attend (its
// answer must equal the library's for the same step: the tool repeats the
// step as a second tensor-parallel rank would, on the same keys), and bad
// command lines, which must say what to change and exit non-zero.
#include <signal.h>

#include <cstring>
#include <memory>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "client/mla_client.h"
#include "client/test_processes.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "kernels/tool/npy.h"

namespace mla::client {
namespace {

using ::testing::HasSubstr;
using ::testing::Not;

constexpr char kFlash[] = "deepseek-v4-flash";

std::vector<uint16_t> Values(uint64_t seed, size_t count) {
  std::vector<uint16_t> values(count);
  for (size_t i = 0; i < count; ++i) {
    // bf16 values in about [-2, 2], none zero: sign, exponent 126..127, mantissa.
    seed = seed * 6364136223846793005ull + 1442695040888963407ull;
    const uint16_t mantissa = (seed >> 33) & 0x7f;
    const uint16_t exponent = 126 + ((seed >> 45) & 1);
    const uint16_t sign = (seed >> 50) & 1;
    values[i] = static_cast<uint16_t>(sign << 15 | exponent << 7 | mantissa);
  }
  return values;
}

class CliTest : public ::testing::Test {
 protected:
  void SetUp() override {
    absl::StatusOr<std::unique_ptr<TestServer>> server = TestServer::Start();
    ASSERT_TRUE(server.ok()) << server.status();
    server_ = *std::move(server);
    absl::StatusOr<std::unique_ptr<Client>> client = Client::Connect(server_->target());
    ASSERT_TRUE(client.ok()) << client.status();
    client_ = *std::move(client);
    absl::StatusOr<std::string> binary = RunfilePath("client/mla");
    ASSERT_TRUE(binary.ok()) << binary.status();
    binary_ = *binary;
    dir_ = std::getenv("TEST_TMPDIR");
  }

  // Runs `mla --target=<the server> args...`.
  CommandResult Mla(std::vector<std::string> args, bool with_target = true) {
    std::vector<std::string> argv = {binary_};
    if (with_target) argv.push_back("--target=" + server_->target());
    argv.insert(argv.end(), args.begin(), args.end());
    absl::StatusOr<CommandResult> result = RunCommand(argv);
    EXPECT_TRUE(result.ok()) << result.status();
    if (!result.ok()) return CommandResult();
    return *result;
  }

  // A flash session of `heads` heads with `prompt` positions appended.
  std::string Session(int heads, int32_t prompt) {
    SessionOptions options;
    options.model = kFlash;
    options.num_heads = heads;
    absl::StatusOr<pb::CreateSessionResponse> created = client_->CreateSession(options);
    EXPECT_TRUE(created.ok()) << created.status();
    if (!created.ok()) return "";
    if (prompt > 0) {
      std::vector<std::vector<uint16_t>> swa, compressed;
      std::vector<LayerRowsInput> layers;
      const std::vector<int> ratios = {0, 0};  // flash: layers 0, 1 window-only
      absl::StatusOr<pb::ServerInfo> info = client_->GetServerInfo();
      EXPECT_TRUE(info.ok());
      const pb::ModelInfo& model = info->models(0).name() == kFlash ? info->models(0)
                                                                    : info->models(1);
      for (int layer = 0; layer < model.num_attention_layers(); ++layer) {
        const int ratio = model.compress_ratios(layer);
        swa.push_back(Values(layer * 2 + 1, static_cast<size_t>(prompt) * kHeadDim));
        compressed.push_back(
            Values(layer * 2 + 2, ratio == 0 ? 0 : static_cast<size_t>(prompt / ratio) * kHeadDim));
      }
      for (int layer = 0; layer < model.num_attention_layers(); ++layer) {
        layers.push_back({layer, swa[layer], compressed[layer], 0});
      }
      absl::StatusOr<pb::AppendKVResponse> appended =
          client_->AppendKV(created->session_id(), 0, prompt, layers);
      EXPECT_TRUE(appended.ok()) << appended.status();
    }
    return created->session_id();
  }

  std::string Path(absl::string_view name) const { return absl::StrCat(dir_, "/", name); }

  std::unique_ptr<TestServer> server_;
  std::unique_ptr<Client> client_;
  std::string binary_;
  std::string dir_;
};

TEST_F(CliTest, InfoPrintsWhatTheServerRuns) {
  const CommandResult result = Mla({"info"});
  EXPECT_EQ(result.exit_code, 0) << result.err;
  EXPECT_THAT(result.out, HasSubstr("mla-offload 0.1.0"));
  EXPECT_THAT(result.out, HasSubstr("at " + server_->target()));
  EXPECT_THAT(result.out, HasSubstr("backend     cpu (2 threads)"));
  EXPECT_THAT(result.out, HasSubstr("KV cache    0 of 1335 blocks used (64 tokens x 584 bytes each), 0 sessions"));
  EXPECT_THAT(result.out, HasSubstr("deepseek-v4-flash: 43 layers + MTP (44 attention layers), "
                                    "64 query heads"));
  EXPECT_THAT(result.out, HasSubstr("compress ratios by layer: 0 0 4 128 4"));
  EXPECT_THAT(result.out, HasSubstr("positions < 8192"));
}

TEST_F(CliTest, HealthSaysServingAndFailsForAnUnknownService) {
  CommandResult result = Mla({"health"});
  EXPECT_EQ(result.exit_code, 0) << result.err;
  EXPECT_EQ(result.out, server_->target() + ": SERVING\n");
  result = Mla({"health", "--service=mla_offload.v1.MlaOffload"});
  EXPECT_EQ(result.exit_code, 0) << result.err;
  EXPECT_EQ(result.out, server_->target() + " service mla_offload.v1.MlaOffload: SERVING\n");
  result = Mla({"health", "--service=no.such.Service"});
  EXPECT_EQ(result.exit_code, 1);
  EXPECT_THAT(result.err, HasSubstr("NOT_FOUND"));
}

// A draining server (SIGTERM, kept up by an open stream) is NOT_SERVING for
// the service's name: exit 1, so that a script or probe acts on it; "" (the
// process, what liveness asks) stays SERVING.
TEST_F(CliTest, HealthOfADrainingServerExitsOne) {
  // The server waits for open Attend streams; the Echo round trip makes sure
  // the connection (and so the Attend call) is up before the signal.
  absl::StatusOr<std::unique_ptr<AttendStream>> attend = client_->OpenAttendStream();
  ASSERT_TRUE(attend.ok());
  absl::StatusOr<std::unique_ptr<EchoStream>> stream = client_->OpenEchoStream();
  ASSERT_TRUE(stream.ok());
  ASSERT_TRUE((*stream)->Send(std::vector<uint8_t>{1}).ok());
  ASSERT_TRUE((*stream)->Receive().ok());
  server_->Signal(SIGTERM);
  ASSERT_TRUE(server_->WaitForLine("draining", absl::Seconds(2)).has_value());
  CommandResult result;
  const absl::Time deadline = absl::Now() + absl::Seconds(2);
  do {
    result = Mla({"health", "--service=mla_offload.v1.MlaOffload"});
  } while (result.exit_code == 0 && absl::Now() < deadline);
  EXPECT_EQ(result.exit_code, 1) << result.out << result.err;
  EXPECT_EQ(result.out, server_->target() + " service mla_offload.v1.MlaOffload: NOT_SERVING\n");
  result = Mla({"health"});
  EXPECT_EQ(result.exit_code, 0) << result.out << result.err;
  EXPECT_EQ(result.out, server_->target() + ": SERVING\n");
  (*stream)->Finish().IgnoreError();
  (*attend)->Finish().IgnoreError();
}

TEST_F(CliTest, SessionsListAndClose) {
  const std::string a = Session(8, 10);
  const std::string b = Session(16, 0);
  CommandResult result = Mla({"sessions", "list"});
  EXPECT_EQ(result.exit_code, 0) << result.err;
  EXPECT_THAT(result.out, HasSubstr("SESSION"));
  EXPECT_THAT(result.out, ::testing::ContainsRegex(a + " +deepseek-v4-flash +8 +10 +[0-9]+ "));
  EXPECT_THAT(result.out, ::testing::ContainsRegex(b + " +deepseek-v4-flash +16 +0 +[0-9]+ "));
  EXPECT_THAT(result.out, HasSubstr("\n2 sessions\n"));

  absl::StatusOr<std::vector<pb::SessionInfo>> before = client_->ListSessions();
  ASSERT_TRUE(before.ok());
  int64_t blocks = 0;
  for (const pb::SessionInfo& info : *before) {
    if (info.session_id() == a) blocks = info.kv_blocks();
  }
  result = Mla({"sessions", "close", a});
  EXPECT_EQ(result.exit_code, 0) << result.err;
  EXPECT_EQ(result.out, absl::StrCat("closed ", a, ": ", blocks, " KV blocks freed\n"));
  result = Mla({"sessions", "list"});
  EXPECT_THAT(result.out, Not(HasSubstr(a)));
  EXPECT_THAT(result.out, HasSubstr("\n1 session\n"));

  result = Mla({"sessions", "close", a});
  EXPECT_EQ(result.exit_code, 1);
  EXPECT_THAT(result.err, HasSubstr("NOT_FOUND: CloseSession on " + server_->target()));
  EXPECT_THAT(result.err, HasSubstr(a));
  EXPECT_THAT(result.err, HasSubstr("`mla sessions list`"));
}

// attend from .npy files: the tool repeats a step the library sent (a second
// rank of the same step: same q, no kv) and must get the library's answer.
TEST_F(CliTest, AttendFromNpyFilesMatchesTheLibrary) {
  const int heads = 8;
  const std::string id = Session(heads, 50);
  const std::vector<uint16_t> q = Values(77, 2 * heads * kHeadDim);
  const std::vector<uint16_t> kv = Values(78, 2 * kHeadDim);

  absl::StatusOr<std::unique_ptr<AttendStream>> stream = client_->OpenAttendStream();
  ASSERT_TRUE(stream.ok());
  AttendInput input;
  input.layer = 1;
  input.segments = {{id, 50, 2, 0, 0}};
  input.q = q;
  input.kv = kv;
  input.return_lse = true;
  input.derotate_output = true;
  ASSERT_TRUE((*stream)->Send(input).ok());
  absl::StatusOr<AttendResult> expected = (*stream)->Receive();
  ASSERT_TRUE(expected.ok()) << expected.status();
  ASSERT_TRUE((*stream)->Finish().ok());

  ASSERT_TRUE(WriteNpy(Path("q.npy"),
                       NpyArray::FromValues<uint16_t>({2, heads, kHeadDim}, absl::MakeConstSpan(q)))
                  .ok());
  const CommandResult result =
      Mla({"attend", "--session=" + id, "--layer=1", "--position=50", "--q=" + Path("q.npy"),
           "--derotate", "--out=" + Path("out.npy"), "--lse_out=" + Path("lse.npy")});
  ASSERT_EQ(result.exit_code, 0) << result.err;
  EXPECT_THAT(result.out, HasSubstr("positions 50..51 (2 tokens x 8 heads)"));
  EXPECT_THAT(result.out, HasSubstr("out         [2, 8, 512] bf16 -> " + Path("out.npy")));
  EXPECT_THAT(result.out, HasSubstr("lse         [2, 8] fp32 -> " + Path("lse.npy")));
  EXPECT_THAT(result.out, HasSubstr("server      queue "));
  EXPECT_THAT(result.out, HasSubstr(" us, plan "));
  EXPECT_THAT(result.out, HasSubstr(" us, readback "));

  absl::StatusOr<NpyArray> out = ReadNpyAs(Path("out.npy"), NpyDtype::kUint16, {2, heads, kHeadDim});
  ASSERT_TRUE(out.ok()) << out.status();
  const absl::Span<const uint16_t> want_out = expected->out();
  const absl::Span<const uint16_t> got_out = out->values<uint16_t>();
  EXPECT_TRUE(std::equal(got_out.begin(), got_out.end(), want_out.begin(), want_out.end()))
      << "out.npy differs from the library's answer to the same step";
  absl::StatusOr<NpyArray> lse = ReadNpyAs(Path("lse.npy"), NpyDtype::kFloat32, {2, heads});
  ASSERT_TRUE(lse.ok()) << lse.status();
  EXPECT_EQ(std::memcmp(lse->values<float>().data(), expected->lse().data(), 2 * heads * 4), 0)
      << "lse.npy differs from the library's answer";
}

// A C4A layer: the tool sends a new compressed row and an int64 top-k
// (NumPy's default integers); the library, repeating the step as a second
// rank with the same q and top-k, must get the same answer.
TEST_F(CliTest, AttendOnACompressedLayerWithTopK) {
  const int heads = 8;
  const std::string id = Session(heads, 50);  // layer 2 (C4A) holds rows 0..11
  const std::vector<uint16_t> q50 = Values(91, heads * kHeadDim);
  const std::vector<uint16_t> q51 = Values(92, heads * kHeadDim);
  ASSERT_TRUE(WriteNpy(Path("q50.npy"), NpyArray::FromValues<uint16_t>({1, heads, kHeadDim},
                                                                       absl::MakeConstSpan(q50)))
                  .ok());
  ASSERT_TRUE(WriteNpy(Path("q51.npy"), NpyArray::FromValues<uint16_t>({1, heads, kHeadDim},
                                                                       absl::MakeConstSpan(q51)))
                  .ok());
  ASSERT_TRUE(WriteNpy(Path("kv.npy"), NpyArray::FromValues<uint16_t>(
                                           {1, kHeadDim}, Values(93, kHeadDim)))
                  .ok());
  ASSERT_TRUE(WriteNpy(Path("row12.npy"), NpyArray::FromValues<uint16_t>(
                                              {1, kHeadDim}, Values(94, kHeadDim)))
                  .ok());
  const std::vector<int64_t> topk50 = {11, 0, 5, -1};
  const std::vector<int64_t> topk51 = {12, 3, -1, 7};
  ASSERT_TRUE(WriteNpy(Path("topk50.npy"),
                       NpyArray::FromValues<int64_t>({1, 4}, absl::MakeConstSpan(topk50)))
                  .ok());
  ASSERT_TRUE(WriteNpy(Path("topk51.npy"),
                       NpyArray::FromValues<int64_t>({1, 4}, absl::MakeConstSpan(topk51)))
                  .ok());

  CommandResult result =
      Mla({"attend", "--session=" + id, "--layer=2", "--position=50", "--q=" + Path("q50.npy"),
           "--kv=" + Path("kv.npy"), "--topk=" + Path("topk50.npy"),
           // No row completes at 50, but the server wants the next row's index.
           "--first_compressed_row=12", "--out=" + Path("o50.npy")});
  ASSERT_EQ(result.exit_code, 0) << result.err;
  // Position 51 completes compressed row 12 (rows are made every 4 positions).
  result = Mla({"attend", "--session=" + id, "--layer=2", "--position=51",
                "--q=" + Path("q51.npy"), "--kv=" + Path("kv.npy"),
                "--compressed_kv=" + Path("row12.npy"), "--first_compressed_row=12",
                "--topk=" + Path("topk51.npy"), "--out=" + Path("o51.npy")});
  ASSERT_EQ(result.exit_code, 0) << result.err;

  absl::StatusOr<std::unique_ptr<AttendStream>> stream = client_->OpenAttendStream();
  ASSERT_TRUE(stream.ok());
  const std::vector<int32_t> topk(topk51.begin(), topk51.end());
  AttendInput repeat;
  repeat.layer = 2;
  repeat.segments = {{id, 51, 1, 13, 0}};
  repeat.q = q51;
  repeat.topk = topk;
  ASSERT_TRUE((*stream)->Send(repeat).ok());
  absl::StatusOr<AttendResult> expected = (*stream)->Receive();
  ASSERT_TRUE(expected.ok()) << expected.status();
  ASSERT_TRUE((*stream)->Finish().ok());
  absl::StatusOr<NpyArray> out = ReadNpyAs(Path("o51.npy"), NpyDtype::kUint16, {1, heads, kHeadDim});
  ASSERT_TRUE(out.ok()) << out.status();
  const absl::Span<const uint16_t> got = out->values<uint16_t>();
  EXPECT_TRUE(std::equal(got.begin(), got.end(), expected->out().begin(), expected->out().end()))
      << "o51.npy differs from the library's repeat of the same step";

  // The top-k names row 12, which exists only because the tool sent it.
  const std::vector<int32_t> beyond = {13, -1, -1, -1};
  repeat.topk = beyond;
  stream = client_->OpenAttendStream();
  ASSERT_TRUE((*stream)->Send(repeat).ok());
  EXPECT_EQ((*stream)->Receive().status().code(), absl::StatusCode::kInvalidArgument);
}

// Without --first_compressed_row the tool sends the layer's next row,
// position / ratio, from the session's model: 50 on the C4A layer 2 and 1 on
// the C128A layer 3 at position 200, 50 again when position 203 completes it.
TEST_F(CliTest, AttendOnCompressedLayersSendsTheNextRowByDefault) {
  const int heads = 8;
  const std::string id = Session(heads, 200);
  ASSERT_TRUE(WriteNpy(Path("q.npy"), NpyArray::FromValues<uint16_t>(
                                          {1, heads, kHeadDim}, Values(101, heads * kHeadDim)))
                  .ok());
  ASSERT_TRUE(WriteNpy(Path("kv.npy"), NpyArray::FromValues<uint16_t>(
                                           {1, kHeadDim}, Values(102, kHeadDim)))
                  .ok());
  ASSERT_TRUE(WriteNpy(Path("row50.npy"), NpyArray::FromValues<uint16_t>(
                                              {1, kHeadDim}, Values(103, kHeadDim)))
                  .ok());
  const std::vector<int64_t> topk = {49, 0, -1, 7};
  ASSERT_TRUE(
      WriteNpy(Path("topk.npy"), NpyArray::FromValues<int64_t>({1, 4}, absl::MakeConstSpan(topk)))
          .ok());
  for (const char* layer : {"--layer=2", "--layer=3"}) {
    std::vector<std::string> args = {"attend", "--session=" + id, layer, "--position=200",
                                     "--q=" + Path("q.npy"), "--kv=" + Path("kv.npy"),
                                     "--out=" + Path("out.npy")};
    if (std::string(layer) == "--layer=2") args.push_back("--topk=" + Path("topk.npy"));
    const CommandResult result = Mla(args);
    EXPECT_EQ(result.exit_code, 0) << layer << ": " << result.err;
  }
  for (int position = 201; position <= 203; ++position) {
    std::vector<std::string> args = {"attend", "--session=" + id, "--layer=2",
                                     absl::StrCat("--position=", position),
                                     "--q=" + Path("q.npy"), "--kv=" + Path("kv.npy"),
                                     "--topk=" + Path("topk.npy"), "--out=" + Path("out.npy")};
    if (position == 203) args.push_back("--compressed_kv=" + Path("row50.npy"));
    const CommandResult result = Mla(args);
    EXPECT_EQ(result.exit_code, 0) << "position " << position << ": " << result.err;
  }
  // Row 50 exists only because the tool sent it: a rank repeating step 203
  // (whose next row is now 51) may name it.
  const std::vector<int32_t> row50 = {50, -1, -1, -1};
  absl::StatusOr<std::unique_ptr<AttendStream>> stream = client_->OpenAttendStream();
  ASSERT_TRUE(stream.ok());
  const std::vector<uint16_t> q = Values(104, heads * kHeadDim);
  AttendInput repeat;
  repeat.layer = 2;
  repeat.segments = {{id, 203, 1, 51, 0}};
  repeat.q = q;
  repeat.topk = row50;
  ASSERT_TRUE((*stream)->Send(repeat).ok());
  absl::StatusOr<AttendResult> answer = (*stream)->Receive();
  EXPECT_TRUE(answer.ok()) << answer.status();
  EXPECT_TRUE((*stream)->Finish().ok());

  const CommandResult result =
      Mla({"attend", "--session=" + id, "--layer=2", "--position=204", "--q=" + Path("q.npy"),
           "--first_compressed_row=-2"});
  EXPECT_EQ(result.exit_code, 2);
  EXPECT_THAT(result.err, HasSubstr("--first_compressed_row must be a row index, or -1"));
}

TEST_F(CliTest, AttendErrorsSayWhatToChange) {
  const std::string id = Session(8, 10);
  ASSERT_TRUE(WriteNpy(Path("q.npy"), NpyArray::FromValues<uint16_t>(
                                          {1, 8, kHeadDim}, Values(5, 8 * kHeadDim)))
                  .ok());
  ASSERT_TRUE(WriteNpy(Path("q_f32.npy"), NpyArray::Zeros(NpyDtype::kFloat32, {1, 8, kHeadDim}))
                  .ok());
  ASSERT_TRUE(WriteNpy(Path("kv2.npy"), NpyArray::Zeros(NpyDtype::kUint16, {2, kHeadDim})).ok());

  CommandResult result = Mla({"attend", "--position=10", "--q=" + Path("q.npy")});
  EXPECT_EQ(result.exit_code, 2);
  EXPECT_THAT(result.err, HasSubstr("attend needs --session=ID"));

  result = Mla({"attend", "--session=" + id, "--q=" + Path("q.npy")});
  EXPECT_EQ(result.exit_code, 2);
  EXPECT_THAT(result.err, HasSubstr("attend needs --position=P"));

  result = Mla({"attend", "--session=" + id, "--position=10", "--q=" + Path("q_f32.npy")});
  EXPECT_EQ(result.exit_code, 2);
  EXPECT_THAT(result.err, HasSubstr("--q: q_f32.npy: expected dtype <u2"));

  result = Mla({"attend", "--session=" + id, "--position=10", "--q=" + Path("q.npy"),
                "--kv=" + Path("kv2.npy")});
  EXPECT_EQ(result.exit_code, 2);
  EXPECT_THAT(result.err, HasSubstr("--kv: kv2.npy"));

  result = Mla({"attend", "--session=" + id, "--position=10", "--q=" + Path("missing.npy")});
  EXPECT_EQ(result.exit_code, 2);
  EXPECT_THAT(result.err, HasSubstr("missing.npy"));

  // The server's refusals: exit 1 with its code and message.
  result = Mla({"attend", "--session=" + std::string(32, 'f'), "--position=10",
                "--q=" + Path("q.npy"), "--out=" + Path("never.npy")});
  EXPECT_EQ(result.exit_code, 1);
  EXPECT_THAT(result.err, HasSubstr("NOT_FOUND: Attend request 1: "));
  EXPECT_THAT(result.err, HasSubstr(std::string(32, 'f')));
  result = Mla({"attend", "--session=" + id, "--position=30", "--q=" + Path("q.npy"),
                "--out=" + Path("never.npy")});
  EXPECT_EQ(result.exit_code, 1);
  EXPECT_THAT(result.err, HasSubstr("FAILED_PRECONDITION"));
  EXPECT_FALSE(ReadNpy(Path("never.npy")).ok()) << "a refused attend wrote its --out";
}

TEST_F(CliTest, BadCommandLinesExitNonZeroWithTheFix) {
  CommandResult result = Mla({});
  EXPECT_EQ(result.exit_code, 2);
  EXPECT_THAT(result.err, HasSubstr("no command: give one of info, health"));
  result = Mla({"status"});
  EXPECT_EQ(result.exit_code, 2);
  EXPECT_THAT(result.err, HasSubstr("unknown command 'status'"));
  result = Mla({"sessions"});
  EXPECT_EQ(result.exit_code, 2);
  EXPECT_THAT(result.err, HasSubstr("`sessions` needs `list` or `close ID`"));
  result = Mla({"sessions", "close"});
  EXPECT_EQ(result.exit_code, 2);
  EXPECT_THAT(result.err, HasSubstr("expected `sessions close ID`"));
  result = Mla({"info", "extra"});
  EXPECT_EQ(result.exit_code, 2);
  result = Mla({"info", "--timeout_s=0"});
  EXPECT_EQ(result.exit_code, 2);
  EXPECT_THAT(result.err, HasSubstr("--timeout_s must be positive"));
  result = Mla({"info", "--tls_ca=/nonexistent.pem"});
  EXPECT_EQ(result.exit_code, 2);
  EXPECT_THAT(result.err, HasSubstr("--tls_ca needs --tls"));
  // The library's own refusal would name use_tls, which is no flag of the tool.
  result = Mla({"info", "--tls_server_name=mla-offload.test"});
  EXPECT_EQ(result.exit_code, 2);
  EXPECT_THAT(result.err, HasSubstr("--tls_server_name needs --tls"));
  EXPECT_THAT(result.err, Not(HasSubstr("use_tls")));
  result = Mla({"info", "--no_such_flag"});
  EXPECT_NE(result.exit_code, 0);
  EXPECT_THAT(result.err, HasSubstr("no_such_flag"));

  result = Mla({"--target=127.0.0.1:1", "info"}, /*with_target=*/false);
  EXPECT_EQ(result.exit_code, 1);
  EXPECT_THAT(result.err, HasSubstr("UNAVAILABLE: GetServerInfo on 127.0.0.1:1"));
  EXPECT_THAT(result.err, HasSubstr("is an mla_offload_server listening at --target=127.0.0.1:1"));
}

TEST_F(CliTest, HelpExplainsEveryCommandAndFlag) {
  const CommandResult result = Mla({"--help"}, /*with_target=*/false);
  const std::string help = result.out + result.err;
  for (const char* text :
       {"info ", "health ", "sessions list", "sessions close ID", "attend ", "--target",
        "--timeout_s", "--tls_ca", "--session", "--position", "--q ", "--kv ", "--topk",
        "--compressed_kv", "--first_compressed_row", "--lse_out", "--out ", "Exit status"}) {
    EXPECT_THAT(help, HasSubstr(text));
  }
  EXPECT_THAT(help, Not(HasSubstr("--grpc"))) << "--help lists only the tool's own flags";
}

}  // namespace
}  // namespace mla::client

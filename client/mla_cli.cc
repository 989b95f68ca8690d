// mla: the command-line tool for people debugging a deployment of
// mla_offload_server: what a server runs, whether it is healthy, which
// sessions it holds (and closing one), and one Attend message from .npy
// files. Built on client/mla_client.h.
//
// Exit status: 0 done (health: SERVING); 1 the server refused, could not be
// reached, or is not SERVING; 2 a bad command line or input file.
#include <cstdio>
#include <string>
#include <vector>

#include "absl/flags/flag.h"
#include "absl/flags/parse.h"
#include "absl/flags/usage.h"
#include "absl/flags/usage_config.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "client/connect_flags.h"
#include "client/mla_client.h"
#include "kernels/tool/npy.h"

ABSL_FLAG(std::string, target, "127.0.0.1:50051", "HOST:PORT of the server.");
ABSL_FLAG(double, timeout_s, 30, "Deadline of each call (and of the Attend answer), seconds.");
ABSL_FLAG(std::string, service, "", "health: the service to ask about (\"\": the whole server).");
ABSL_FLAG(std::string, session, "", "attend: the session id (see `mla sessions list`).");
ABSL_FLAG(int, layer, 0, "attend: the attention layer.");
ABSL_FLAG(int, position, -1,
          "attend: the position of the first token of q; the session's next position "
          "inserts the kv rows, the last step's first position repeats it (another rank).");
ABSL_FLAG(int, head_offset, 0, "attend: the model's index of q's first head.");
ABSL_FLAG(std::string, q, "", "attend: .npy of q, uint16 (bf16 bits) [T, H, 512].");
ABSL_FLAG(std::string, kv, "",
          "attend: .npy of the tokens' new SWA rows, uint16 (bf16 bits) [T, 512]; omit when "
          "another rank of the step has sent them.");
ABSL_FLAG(std::string, compressed_kv, "",
          "attend: .npy of the new compressed rows, uint16 (bf16 bits) [R, 512] "
          "(C4A/C128A layers, when rows complete).");
ABSL_FLAG(int, first_compressed_row, -1,
          "attend: the index of the first row of --compressed_kv (the server wants it on "
          "C4A/C128A layers even when no row completes); -1: the layer's next row, "
          "--position / the layer's compress ratio (`mla info` lists the ratios), 0 on a "
          "window-only layer.");
ABSL_FLAG(std::string, topk, "",
          "attend: .npy of the indexer's top-k on C4A layers, int32 or int64 [T, K], -1 pads.");
ABSL_FLAG(bool, derotate, false, "attend: de-rotate out[..., 448:512] by the query position.");
ABSL_FLAG(std::string, out, "out.npy", "attend: where to write out, uint16 (bf16 bits) [T, H, 512].");
ABSL_FLAG(std::string, lse_out, "",
          "attend: where to write lse, float32 [T, H]; asks the server for it (default: not "
          "asked).");

namespace mla::client {
namespace {

constexpr char kUsage[] =
    "talks to a running mla_offload_server.\n"
    "\n"
    "  mla [--target=HOST:PORT] COMMAND [ARGS] [--flags]\n"
    "\n"
    "Commands:\n"
    "  info                  what the server runs: version, backend, models, KV cache, limits\n"
    "  health                grpc.health.v1 status (--service); exit 0 only when SERVING\n"
    "  sessions list         the sessions the server holds: id, model, heads, next position,\n"
    "                        KV blocks, idle time (with tokens: your tenant's; an operator's\n"
    "                        token lists every tenant's, with the TENANT column)\n"
    "  sessions close ID     closes a session and frees its KV blocks\n"
    "  attend                sends one Attend message built from .npy files and writes the\n"
    "                        answer to .npy files:\n"
    "                          mla attend --session=ID --layer=0 --position=200 --q=q.npy \\\n"
    "                              --kv=kv.npy --out=out.npy --lse_out=lse.npy\n"
    "                        bf16 tensors are uint16 arrays of their bit patterns.\n"
    "\n"
    "A server with TLS and tokens:\n"
    "  MLA_OFFLOAD_TOKEN=$(cat my.token) mla --target=HOST:PORT --tls --tls_ca=ca.pem info\n"
    "  (or --token_file=my.token; mutual TLS adds --tls_cert and --tls_key)\n"
    "\n"
    "Exit status: 0 done; 1 the server refused, could not be reached, or is not SERVING;\n"
    "2 a bad command line or input file.";

constexpr int kServerError = 1;
constexpr int kUsageError = 2;

int UsageError(const std::string& message) {
  std::fprintf(stderr, "mla: %s\n(mla --help lists the commands and flags)\n", message.c_str());
  return kUsageError;
}

// Prints a failed call with what to change, by code.
int CallError(const absl::Status& status) {
  std::string hint;
  switch (status.code()) {
    case absl::StatusCode::kUnavailable:
      hint = absl::StrCat("is an mla_offload_server listening at --target=",
                          absl::GetFlag(FLAGS_target),
                          "? (give --target=HOST:PORT; a draining server also says UNAVAILABLE)");
      break;
    case absl::StatusCode::kDeadlineExceeded:
      hint = absl::StrCat("no answer within --timeout_s=", absl::GetFlag(FLAGS_timeout_s),
                          "; raise it, or check the server's load");
      break;
    case absl::StatusCode::kUnauthenticated:
      hint = "give the token with --token_file=PATH or $MLA_OFFLOAD_TOKEN (or --token_env)";
      break;
    case absl::StatusCode::kNotFound:
      hint = "`mla sessions list` shows the sessions this server holds";
      break;
    default:
      break;
  }
  std::fprintf(stderr, "mla: %s: %s\n", absl::StatusCodeToString(status.code()).c_str(),
               std::string(status.message()).c_str());
  if (!hint.empty()) std::fprintf(stderr, "mla: %s\n", hint.c_str());
  return kServerError;
}

absl::StatusOr<std::unique_ptr<Client>> ConnectFromFlags() {
  ConnectOptions base;
  base.call_timeout = absl::Seconds(absl::GetFlag(FLAGS_timeout_s));
  absl::StatusOr<ConnectOptions> options = ConnectOptionsFromFlags(base);
  if (!options.ok()) return options.status();
  return Client::Connect(absl::GetFlag(FLAGS_target), *options);
}

// "1 token", "2 tokens".
std::string Count(int64_t count, absl::string_view noun) {
  return absl::StrCat(count, " ", noun, count == 1 ? "" : "s");
}

std::string Join(const google::protobuf::RepeatedField<int32_t>& values) {
  return absl::StrJoin(values.begin(), values.end(), " ");
}

int Info(Client& client) {
  absl::StatusOr<pb::ServerInfo> info = client.GetServerInfo();
  if (!info.ok()) return CallError(info.status());
  std::printf("server      %s at %s\n", info->version().c_str(), client.target().c_str());
  std::printf("backend     %s\n", info->backend().c_str());
  for (const std::string& device : info->devices()) std::printf("device      %s\n", device.c_str());
  std::printf("heads       kernels run at %s; %s\n", Join(info->supported_head_counts()).c_str(),
              info->head_padding().c_str());
  std::printf("KV cache    %lld of %lld blocks used (%d tokens x %d bytes each), %s\n",
              static_cast<long long>(info->kv_blocks_used()),
              static_cast<long long>(info->kv_blocks_total()), info->kv_block_tokens(),
              info->kv_bytes_per_token(), Count(info->sessions(), "session").c_str());
  std::printf("limits      %d tokens per Attend message, %lld bytes per message, positions < %d\n",
              info->max_tokens_per_message(), static_cast<long long>(info->max_message_bytes()),
              info->max_position());
  for (const pb::ModelInfo& model : info->models()) {
    std::printf(
        "model       %s: %d layers + MTP (%d attention layers), %d query heads, head_dim %d, "
        "window %d, top-k %d, softmax scale %g\n",
        model.name().c_str(), model.num_layers(), model.num_attention_layers(),
        model.num_query_heads(), model.head_dim(), model.swa_window(), model.indexer_topk(),
        model.softmax_scale());
    std::printf("            compress ratios by layer: %s\n",
                Join(model.compress_ratios()).c_str());
  }
  return 0;
}

int Health(Client& client) {
  absl::StatusOr<HealthStatus> health = client.CheckHealth(absl::GetFlag(FLAGS_service));
  if (!health.ok()) return CallError(health.status());
  const std::string service = absl::GetFlag(FLAGS_service);
  std::printf("%s%s: %s\n", client.target().c_str(),
              service.empty() ? "" : absl::StrCat(" service ", service).c_str(),
              std::string(HealthStatusName(*health)).c_str());
  return *health == HealthStatus::kServing ? 0 : kServerError;
}

int ListSessions(Client& client) {
  absl::StatusOr<std::vector<pb::SessionInfo>> sessions = client.ListSessions();
  if (!sessions.ok()) return CallError(sessions.status());
  // A server with authentication names each session's tenant (an
  // operator sees several).
  bool tenants = false;
  for (const pb::SessionInfo& session : *sessions) tenants |= !session.tenant().empty();
  std::printf("%-32s  %-18s  %5s  %8s  %9s  %8s%s\n", "SESSION", "MODEL", "HEADS", "NEXT_POS",
              "KV_BLOCKS", "IDLE_S", tenants ? "  TENANT" : "");
  for (const pb::SessionInfo& session : *sessions) {
    std::printf("%-32s  %-18s  %5d  %8d  %9lld  %8.1f%s\n", session.session_id().c_str(),
                session.model().c_str(), session.num_heads(), session.next_position(),
                static_cast<long long>(session.kv_blocks()), session.idle_seconds(),
                tenants ? absl::StrCat("  ", session.tenant()).c_str() : "");
  }
  std::printf("%s\n", Count(static_cast<int64_t>(sessions->size()), "session").c_str());
  return 0;
}

int CloseSession(Client& client, const std::string& id) {
  absl::StatusOr<int64_t> freed = client.CloseSession(id);
  if (!freed.ok()) return CallError(freed.status());
  std::printf("closed %s: %lld KV blocks freed\n", id.c_str(), static_cast<long long>(*freed));
  return 0;
}

// An .npy input of the attend command, checked against its expected shape.
absl::StatusOr<NpyArray> ReadInput(const std::string& flag, const std::string& path,
                                   NpyDtype dtype, std::vector<int64_t> shape) {
  absl::StatusOr<NpyArray> array = ReadNpyAs(path, dtype, shape);
  if (!array.ok()) {
    return absl::InvalidArgumentError(absl::StrCat("--", flag, ": ", array.status().message()));
  }
  return array;
}

// --first_compressed_row, or when it is -1 the layer's next compressed row at
// `position`: position / the compress ratio of the session's model's layer.
// A session or layer the server does not know gives 0, so that the Attend
// message goes out and the server's refusal names what is wrong.
absl::StatusOr<int32_t> FirstCompressedRow(Client& client, const std::string& session, int layer,
                                           int32_t position) {
  const int flag = absl::GetFlag(FLAGS_first_compressed_row);
  if (flag >= 0) return flag;
  absl::StatusOr<std::vector<pb::SessionInfo>> sessions = client.ListSessions();
  if (!sessions.ok()) return sessions.status();
  absl::StatusOr<pb::ServerInfo> info = client.GetServerInfo();
  if (!info.ok()) return info.status();
  for (const pb::SessionInfo& listed : *sessions) {
    if (listed.session_id() != session) continue;
    for (const pb::ModelInfo& model : info->models()) {
      if (model.name() != listed.model() || layer < 0 || layer >= model.compress_ratios_size()) {
        continue;
      }
      const int ratio = model.compress_ratios(layer);
      return ratio == 0 ? 0 : position / ratio;
    }
  }
  return 0;
}

int Attend(Client& client) {
  const std::string session = absl::GetFlag(FLAGS_session);
  if (session.empty()) return UsageError("attend needs --session=ID (see `mla sessions list`)");
  if (absl::GetFlag(FLAGS_q).empty()) return UsageError("attend needs --q=FILE.npy ([T, H, 512] uint16)");
  if (absl::GetFlag(FLAGS_position) < 0) {
    return UsageError(
        "attend needs --position=P, the first token's position (`mla sessions list` shows the "
        "session's next position)");
  }
  if (absl::GetFlag(FLAGS_first_compressed_row) < -1) {
    return UsageError("--first_compressed_row must be a row index, or -1 for the layer's next row");
  }
  absl::StatusOr<NpyArray> q =
      ReadInput("q", absl::GetFlag(FLAGS_q), NpyDtype::kUint16, {kAnyDim, kAnyDim, kHeadDim});
  if (!q.ok()) return UsageError(std::string(q.status().message()));
  const int64_t tokens = q->shape[0];
  if (tokens == 0 || q->shape[1] == 0) return UsageError("--q: no tokens or no heads in q");
  std::optional<NpyArray> kv, compressed, topk;
  if (!absl::GetFlag(FLAGS_kv).empty()) {
    absl::StatusOr<NpyArray> read =
        ReadInput("kv", absl::GetFlag(FLAGS_kv), NpyDtype::kUint16, {tokens, kHeadDim});
    if (!read.ok()) return UsageError(std::string(read.status().message()));
    kv = *std::move(read);
  }
  if (!absl::GetFlag(FLAGS_compressed_kv).empty()) {
    absl::StatusOr<NpyArray> read = ReadInput("compressed_kv", absl::GetFlag(FLAGS_compressed_kv),
                                              NpyDtype::kUint16, {kAnyDim, kHeadDim});
    if (!read.ok()) return UsageError(std::string(read.status().message()));
    compressed = *std::move(read);
  }
  if (!absl::GetFlag(FLAGS_topk).empty()) {
    absl::StatusOr<NpyArray> read =
        ReadInput("topk", absl::GetFlag(FLAGS_topk), NpyDtype::kInt32, {tokens, kAnyDim});
    if (!read.ok()) return UsageError(std::string(read.status().message()));
    topk = *std::move(read);
  }

  AttendInput input;
  input.layer = absl::GetFlag(FLAGS_layer);
  input.head_offset = absl::GetFlag(FLAGS_head_offset);
  const int32_t compressed_rows = compressed.has_value() ? static_cast<int32_t>(compressed->shape[0]) : 0;
  absl::StatusOr<int32_t> first_row =
      FirstCompressedRow(client, session, input.layer, absl::GetFlag(FLAGS_position));
  if (!first_row.ok()) return CallError(first_row.status());
  input.segments = {{session, absl::GetFlag(FLAGS_position), static_cast<int32_t>(tokens),
                     *first_row, compressed_rows}};
  input.q = q->values<uint16_t>();
  if (kv.has_value()) input.kv = kv->values<uint16_t>();
  if (compressed.has_value()) input.compressed_kv = compressed->values<uint16_t>();
  if (topk.has_value()) input.topk = topk->values<int32_t>();
  const std::string lse_path = absl::GetFlag(FLAGS_lse_out);
  input.return_lse = !lse_path.empty();
  input.derotate_output = absl::GetFlag(FLAGS_derotate);

  StreamOptions options;
  options.step_timeout = absl::Seconds(absl::GetFlag(FLAGS_timeout_s));
  absl::StatusOr<std::unique_ptr<AttendStream>> stream = client.OpenAttendStream(options);
  if (!stream.ok()) return CallError(stream.status());
  absl::StatusOr<uint64_t> sent = (*stream)->Send(input);
  if (!sent.ok()) return CallError(sent.status());
  absl::StatusOr<AttendResult> result = (*stream)->Receive();
  if (!result.ok()) return CallError(result.status());
  if (absl::Status finished = (*stream)->Finish(); !finished.ok()) return CallError(finished);

  const int64_t heads = result->num_heads();
  NpyArray out = NpyArray::Zeros(NpyDtype::kUint16, {tokens, heads, kHeadDim});
  result->out_view().CopyTo(out.data.data());
  if (absl::Status written = WriteNpy(absl::GetFlag(FLAGS_out), out); !written.ok()) {
    return UsageError(absl::StrCat("--out: ", written.message()));
  }
  std::printf("attend      session %s, layer %d, positions %d..%lld (%s x %s)\n",
              session.c_str(), input.layer, input.segments[0].position,
              static_cast<long long>(input.segments[0].position + tokens - 1),
              Count(tokens, "token").c_str(), Count(heads, "head").c_str());
  std::printf("out         [%lld, %lld, 512] bf16 -> %s\n", static_cast<long long>(tokens),
              static_cast<long long>(heads), absl::GetFlag(FLAGS_out).c_str());
  if (input.return_lse) {
    const absl::Span<const float> lse = result->lse();
    NpyArray lse_array = NpyArray::FromValues<float>({tokens, heads}, lse);
    if (absl::Status written = WriteNpy(lse_path, lse_array); !written.ok()) {
      return UsageError(absl::StrCat("--lse_out: ", written.message()));
    }
    std::printf("lse         [%lld, %lld] fp32 -> %s\n", static_cast<long long>(tokens),
                static_cast<long long>(heads), lse_path.c_str());
  }
  const wire::TimingView& timing = result->timing();
  std::printf("server      queue %.0f us, plan %.0f us, upload %.0f us, prologue %.0f us, "
              "decode %.0f us, readback %.0f us, total %.0f us (batch of %s); then serialise "
              "%.0f us\n",
              timing.queue_us, timing.plan_us, timing.upload_us, timing.prologue_us,
              timing.decode_us, timing.readback_us, timing.total_us,
              Count(timing.batch_tokens, "token").c_str(), timing.serialize_us);
  return 0;
}

int Main(const std::vector<char*>& args) {
  // args[0] is the program.
  std::vector<std::string> words(args.begin() + 1, args.end());
  if (words.empty()) {
    return UsageError("no command: give one of info, health, sessions list, sessions close ID, "
                      "attend");
  }
  const std::string& command = words[0];
  auto expect_words = [&](size_t count, const char* form) -> int {
    if (words.size() == count) return 0;
    return UsageError(absl::StrCat("`", absl::StrJoin(words, " "), "`: expected `", form, "`"));
  };
  int check = 0;
  if (command == "info" || command == "health" || command == "attend") {
    check = expect_words(1, command.c_str());
  } else if (command == "sessions") {
    if (words.size() >= 2 && words[1] == "list") {
      check = expect_words(2, "sessions list");
    } else if (words.size() >= 2 && words[1] == "close") {
      check = expect_words(3, "sessions close ID");
    } else {
      return UsageError("`sessions` needs `list` or `close ID`");
    }
  } else {
    return UsageError(absl::StrCat("unknown command '", command,
                                   "'; the commands are info, health, sessions list, "
                                   "sessions close ID, attend"));
  }
  if (check != 0) return check;
  if (absl::GetFlag(FLAGS_timeout_s) <= 0) return UsageError("--timeout_s must be positive");

  absl::StatusOr<std::unique_ptr<Client>> client = ConnectFromFlags();
  if (!client.ok()) return UsageError(std::string(client.status().message()));
  if (command == "info") return Info(**client);
  if (command == "health") return Health(**client);
  if (command == "attend") return Attend(**client);
  if (words[1] == "list") return ListSessions(**client);
  return CloseSession(**client, words[2]);
}

}  // namespace
}  // namespace mla::client

int main(int argc, char** argv) {
  absl::FlagsUsageConfig config;
  // --help lists this tool's flags, not those of the libraries it links.
  config.contains_help_flags = [](absl::string_view file) {
    return absl::EndsWith(file, "client/mla_cli.cc") ||
           absl::EndsWith(file, "client/connect_flags.cc");
  };
  config.contains_helpshort_flags = config.contains_help_flags;
  absl::SetFlagsUsageConfig(config);
  absl::SetProgramUsageMessage(mla::client::kUsage);
  std::vector<char*> args = absl::ParseCommandLine(argc, argv);
  return mla::client::Main(args);
}

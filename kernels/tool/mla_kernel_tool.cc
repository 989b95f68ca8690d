// mla_kernel_tool: runs the prologue and decode kernels of one DeepSeek-V4
// layer on .npy files, or a timed and checked random demo (see kUsage).
//
// Exit codes: 0 done, 1 a bad input file or a failed check, 2 a bad command
// line. Every failure is one line on stderr saying what to change.
#include <cstdio>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "absl/flags/flag.h"
#include "absl/flags/parse.h"
#include "absl/flags/usage.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/str_cat.h"
#include "kernels/backend_factory.h"
#include "kernels/tool/commands.h"
#include "kernels/tool/demo.h"
#include "kernels/tool/layer_config.h"

ABSL_FLAG(std::string, backend, "cpu", "compute backend: cpu or cuda");
ABSL_FLAG(int, threads, 0, "threads of the CPU backend; 0 = every hardware thread");
ABSL_FLAG(int, device, 0, "GPU ordinal of the CUDA backend");
ABSL_FLAG(std::string, model, "deepseek-v4-flash",
          "model profile: deepseek-v4-flash or deepseek-v4-pro");
ABSL_FLAG(int, layer, mla::kFirstC4aLayer,
          "layer index (the last one is the MTP layer); it sets the RoPE table kind, the "
          "compress ratio, the softmax scale and eps. -1 = the model's first C4A layer");
ABSL_FLAG(std::string, in, "", "prologue, decode: folder of the input .npy files");
ABSL_FLAG(std::string, out, "", "prologue, decode: folder for the output .npy files (created)");
ABSL_FLAG(int64_t, num_blocks, 0,
          "prologue: blocks of the new SWA pool when --in has no cache.npy; 0 = just enough "
          "for the largest slot in slots.npy");
ABSL_FLAG(int64_t, compressed_num_blocks, 0,
          "prologue: blocks of the new compressed pool when --in has no compressed_cache.npy; "
          "0 = just enough for the largest slot in compressed_slots.npy");
ABSL_FLAG(int, heads, 0, "decode: query heads H to output (the first H of q); 0 = all of q's");
ABSL_FLAG(bool, derotate, false,
          "decode, demo: de-rotate out dims 448..511 by the query position (reads "
          "positions.npy)");
ABSL_FLAG(bool, return_lse, true, "decode: also write lse.npy");
ABSL_FLAG(int, tp, 1, "demo: tensor-parallel ranks; heads per rank H = h_total / tp");
ABSL_FLAG(int64_t, batch, 8, "demo: sequences, one new token each");
ABSL_FLAG(int64_t, context, 8192,
          "demo: context length; token positions are drawn from its last quarter");
ABSL_FLAG(int, runs, 5, "demo: timed runs of each call (the median is reported)");
ABSL_FLAG(uint64_t, seed, 1, "demo: random seed");

namespace mla {
namespace {

constexpr char kUsage[] =
    R"(runs the DeepSeek-V4 sparse MLA kernels of one layer on .npy files.

usage: mla_kernel_tool <prologue|decode|demo> [flags]

  prologue  per-head q RMSNorm + RoPE + head padding, and RoPE + FP8 quantisation
            + insertion of new KV rows into the paged cache (spec section 4)
  decode    sparse MLA decode with attention sink over the paged cache (section 5)
  demo      a random V4-shaped decode step through --backend: timings, tokens/s,
            GB/s, and a check against the float64 reference (exit 1 if it fails)

--model and --layer pick the layer (RoPE kind, compress ratio, softmax scale,
eps); by default the model's first C4A layer. Files are NumPy .npy, little
endian, C order; bf16 travels as its uint16 bit pattern (<u2); an <i4 file may
also be <i8 with values that fit int32. N = tokens, H = query heads per rank,
Hp = H padded to 8, 16, 32, 64 or 128; a cache pool is [blocks, 37440] bytes,
64 tokens of 584 bytes a block; a global slot is block * 64 + offset.

prologue --in=DIR --out=DIR [--num_blocks=B] [--compressed_num_blocks=B]
 in  q.npy                <u2 [N, H, 512]   q before the per-head norm
     positions.npy        <i4 [N]           RoPE positions
     kv.npy               <u2 [N, 512]      new SWA rows (optional, with slots)
     slots.npy            <i4 [N]           their slots; -1 writes nothing
     compressed_kv.npy    <u2 [M, 512]      new compressed rows: optional, the
     compressed_rows.npy  <i4 [M]           three together, C4A/C128A layers;
     compressed_slots.npy <i4 [M]           row j is rotated at j * ratio
     cache.npy            |u1 [B, 37440]    SWA pool to insert into (optional;
                                            else zeroed, --num_blocks blocks)
     compressed_cache.npy |u1 [B, 37440]    compressed pool (optional; else
                                            zeroed, --compressed_num_blocks)
 out q_out.npy            <u2 [N, Hp, 512]  heads H..Hp-1 are +0
     cache.npy            |u1 [B, 37440]
     compressed_cache.npy |u1 [B, 37440]    when compressed rows were given

decode --in=DIR --out=DIR [--heads=H] [--derotate] [--return_lse=false]
 in  q.npy                <u2 [N, Hp, 512]  a prologue's q_out (read from
                                            q_out.npy when there is no q.npy)
     cache.npy            |u1 [B, 37440]    SWA pool
     main_indices.npy     <i4 [N, Kmain]    slots of cache.npy; -1 = skip
     main_lengths.npy     <i4 [N]           entries used per token (optional)
     extra_indices.npy    <i4 [N, Kextra]   slots of compressed_cache.npy
     compressed_cache.npy |u1 [B, 37440]      (optional, the two together)
     extra_lengths.npy    <i4 [N]           entries used per token (optional)
     sinks.npy            <f4 [H]           attention sink logits (optional)
     positions.npy        <i4 [N]           query positions (--derotate only)
 out out.npy              <u2 [N, H, 512]   0 for a token with no keys
     lse.npy              <f4 [N, H]        natural log, sink excluded; +inf
                                            for a token with no keys

demo [--model=M] [--layer=L] [--tp=T] [--batch=N] [--context=C] [--runs=R]

examples:
  mla_kernel_tool prologue --model=deepseek-v4-flash --layer=2 --in=step --out=kv
  (add main_indices.npy and the other decode inputs to kv, then)
  mla_kernel_tool decode --model=deepseek-v4-flash --layer=2 --in=kv --out=result
  mla_kernel_tool demo --model=deepseek-v4-flash --tp=4 --batch=8

exit codes: 0 done, 1 bad input file or failed check, 2 bad command line.)";

// V4's longest context; bounds the demo's RoPE table.
constexpr int64_t kMaxDemoContext = int64_t{1} << 20;
// The demo holds about 400 bytes per position of every sequence on the host.
constexpr int64_t kMaxDemoPositions = int64_t{1} << 23;

constexpr int kExitFailure = 1;
constexpr int kExitUsage = 2;

int Fail(int code, absl::string_view message) {
  std::fprintf(stderr, "mla_kernel_tool: %s%s\n", std::string(message).c_str(),
               code == kExitUsage ? " (see mla_kernel_tool --help)" : "");
  return code;
}

absl::Status CheckAtLeast(absl::string_view flag, int64_t value, int64_t least) {
  if (value >= least) return absl::OkStatus();
  return absl::InvalidArgumentError(
      absl::StrCat("--", flag, "=", value, " must be at least ", least));
}

absl::StatusOr<CommandOptions> CommandOptionsFromFlags(const LayerConfig& layer) {
  CommandOptions options;
  options.in_dir = absl::GetFlag(FLAGS_in);
  options.out_dir = absl::GetFlag(FLAGS_out);
  if (options.in_dir.empty() || options.out_dir.empty()) {
    return absl::InvalidArgumentError("prologue and decode need --in=DIR and --out=DIR");
  }
  options.layer = layer;
  options.num_blocks = absl::GetFlag(FLAGS_num_blocks);
  options.compressed_num_blocks = absl::GetFlag(FLAGS_compressed_num_blocks);
  options.heads = absl::GetFlag(FLAGS_heads);
  options.derotate = absl::GetFlag(FLAGS_derotate);
  options.return_lse = absl::GetFlag(FLAGS_return_lse);
  for (absl::Status status :
       {CheckAtLeast("num_blocks", options.num_blocks, 0),
        CheckAtLeast("compressed_num_blocks", options.compressed_num_blocks, 0),
        CheckAtLeast("heads", options.heads, 0)}) {
    if (!status.ok()) return status;
  }
  return options;
}

absl::StatusOr<DemoOptions> DemoOptionsFromFlags(const LayerConfig& layer) {
  DemoOptions options;
  options.layer = layer;
  options.tp = absl::GetFlag(FLAGS_tp);
  options.batch = absl::GetFlag(FLAGS_batch);
  options.context = absl::GetFlag(FLAGS_context);
  options.runs = absl::GetFlag(FLAGS_runs);
  options.derotate = absl::GetFlag(FLAGS_derotate);
  options.seed = absl::GetFlag(FLAGS_seed);
  for (absl::Status status :
       {CheckAtLeast("tp", options.tp, 1), CheckAtLeast("batch", options.batch, 1),
        CheckAtLeast("context", options.context, 1), CheckAtLeast("runs", options.runs, 1)}) {
    if (!status.ok()) return status;
  }
  const int total_heads = layer.profile->num_query_heads;
  if (total_heads % options.tp != 0) {
    return absl::InvalidArgumentError(absl::StrCat("--tp=", options.tp, " does not divide the ",
                                                   total_heads, " query heads of ",
                                                   layer.profile->name));
  }
  if (options.context > kMaxDemoContext) {
    return absl::InvalidArgumentError(absl::StrCat(
        "--context=", options.context, " is beyond V4's context of ", kMaxDemoContext, " tokens"));
  }
  if (options.batch > kMaxDemoPositions / options.context) {
    return absl::InvalidArgumentError(absl::StrCat(
        "--batch=", options.batch, " times --context=", options.context, " is beyond the ",
        kMaxDemoPositions, " positions the demo holds in memory; lower one of them"));
  }
  return options;
}

int Main(int argc, char** argv) {
  absl::SetProgramUsageMessage(kUsage);
  const std::vector<char*> args = absl::ParseCommandLine(argc, argv);
  if (args.size() < 2) {
    std::fprintf(stderr, "mla_kernel_tool %s\n\nflags: mla_kernel_tool --help\n", kUsage);
    return kExitUsage;
  }
  const std::string command = args[1];
  if (command != "prologue" && command != "decode" && command != "demo") {
    return Fail(kExitUsage,
                absl::StrCat("unknown subcommand '", command, "'; use prologue, decode or demo"));
  }
  if (args.size() > 2) {
    return Fail(kExitUsage, absl::StrCat("unexpected argument '", args[2],
                                         "'; flags are written --name=value"));
  }
  absl::StatusOr<LayerConfig> layer =
      ResolveLayer(absl::GetFlag(FLAGS_model), absl::GetFlag(FLAGS_layer));
  if (!layer.ok()) return Fail(kExitUsage, layer.status().message());
  if (absl::Status status = CheckAtLeast("threads", absl::GetFlag(FLAGS_threads), 0);
      !status.ok()) {
    return Fail(kExitUsage, status.message());
  }
  BackendOptions backend_options;
  backend_options.cpu_threads = absl::GetFlag(FLAGS_threads);
  backend_options.device = absl::GetFlag(FLAGS_device);

  // Every flag is checked before the backend starts (a GPU takes seconds).
  std::function<absl::Status(ComputeBackend&)> run;
  if (command == "demo") {
    absl::StatusOr<DemoOptions> options = DemoOptionsFromFlags(*layer);
    if (!options.ok()) return Fail(kExitUsage, options.status().message());
    run = [options = *options](ComputeBackend& backend) { return RunDemo(backend, options); };
  } else {
    absl::StatusOr<CommandOptions> options = CommandOptionsFromFlags(*layer);
    if (!options.ok()) return Fail(kExitUsage, options.status().message());
    run = [options = *options, prologue = command == "prologue"](ComputeBackend& backend) {
      return prologue ? RunPrologueCommand(backend, options) : RunDecodeCommand(backend, options);
    };
  }
  absl::StatusOr<std::unique_ptr<ComputeBackend>> backend =
      CreateBackend(absl::GetFlag(FLAGS_backend), backend_options);
  if (!backend.ok()) return Fail(kExitUsage, backend.status().message());
  const absl::Status status = run(**backend);
  if (!status.ok()) return Fail(kExitFailure, absl::StrCat(command, ": ", status.message()));
  return 0;
}

}  // namespace
}  // namespace mla

int main(int argc, char** argv) { return mla::Main(argc, argv); }

// make_seeds --out=DIR: writes the fuzzers' starting corpora,
// DIR/codec_fuzzer and DIR/engine_fuzzer, one wire-format message a file
// (tools/fuzz.sh runs it into a fresh directory before each run; nothing
// binary is committed).
//
// engine_fuzzer/: Attend messages that the engine fixture (engine_fixture.h)
// accepts as they are, one for each kind of step (SWA, C4A with top-k and
// new compressed rows, C128A, several tokens, several segments, a rank
// repeating a step, both models, a padded head count); a few near the
// numeric edges that it refuses; reproducers of the fuzzers' findings.
// codec_fuzzer/: the same, plus AttendResponses and the unary requests.
#include <cstdint>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <limits>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include <grpcpp/support/byte_buffer.h>

#include "absl/flags/flag.h"
#include "absl/flags/parse.h"
#include "absl/flags/usage.h"
#include "absl/strings/string_view.h"
#include "kernels/geometry.h"
#include "kernels/model_profile.h"
#include "proto/attend_codec.h"
#include "proto/mla_offload.pb.h"
#include "tests/fuzz/engine_fixture.h"
#include "tests/fuzz/owned_tensor.h"
#include "tests/support/test_rows.h"

ABSL_FLAG(std::string, out, "",
          "Folder to write codec_fuzzer/ and engine_fuzzer/ into (made if missing).");

namespace mla::fuzz {
namespace {

namespace pb = ::mla_offload::v1;

constexpr int32_t kInt32Max = std::numeric_limits<int32_t>::max();

std::string Flat(const grpc::ByteBuffer& buffer) {
  grpc::Slice slice;
  buffer.DumpToSingleSlice(&slice).IgnoreError();
  return std::string(reinterpret_cast<const char*>(slice.begin()), slice.size());
}

wire::TensorView Rows(uint64_t seed, std::vector<int64_t> shape) {
  int64_t rows = 1;
  for (size_t i = 0; i + 1 < shape.size(); ++i) rows *= shape[i];
  return OwnedTensor(wire::DType::kBf16, std::move(shape), TestRows(seed, rows));
}

struct Segment {
  absl::string_view alias;
  int32_t position;
  int32_t tokens;
  int32_t first_row = 0;  // compressed rows the segment brings
  int32_t rows = 0;
};

// A message of `heads` heads at `layer` over the segments: q, kv (unless
// `kv` is false) and the compressed rows the segments bring.
wire::AttendRequestView Attend(uint64_t id, int32_t layer, int heads,
                               const std::vector<Segment>& segments, bool kv = true) {
  wire::AttendRequestView view;
  view.request_id = id;
  view.layer = layer;
  int64_t tokens = 0, rows = 0;
  for (const Segment& segment : segments) {
    view.segments.push_back({std::string(segment.alias), segment.position, segment.tokens,
                             segment.first_row, segment.rows});
    tokens += segment.tokens;
    rows += segment.rows;
  }
  view.q = Rows(3 * id, {tokens, heads, kHeadDim});
  if (kv) view.kv = Rows(3 * id + 1, {tokens, kHeadDim});
  if (rows > 0) view.compressed_kv = Rows(3 * id + 2, {rows, kHeadDim});
  return view;
}

// C4A top-k of `width` per token: the newest compressed rows a token may
// see, then -1.
wire::TensorView TopK(const std::vector<Segment>& segments, int width) {
  std::vector<int32_t> topk;
  int64_t tokens = 0;
  for (const Segment& segment : segments) {
    for (int32_t p = segment.position; p < segment.position + segment.tokens; ++p, ++tokens) {
      const int32_t visible = (p + 1) / 4;
      for (int k = 0; k < width; ++k) topk.push_back(k < visible ? visible - 1 - k : -1);
    }
  }
  return OwnedTensor(wire::DType::kI32, {tokens, width}, std::move(topk));
}

wire::AttendRequestView AttendC4A(uint64_t id, int32_t layer, int heads,
                                  const std::vector<Segment>& segments, int width,
                                  bool kv = true) {
  wire::AttendRequestView view = Attend(id, layer, heads, segments, kv);
  view.topk = TopK(segments, width);
  return view;
}

// Only the small fields: the engine checks them before any tensor.
wire::AttendRequestView Bare(int32_t layer, const std::vector<Segment>& segments) {
  wire::AttendRequestView view;
  view.request_id = 7;
  view.layer = layer;
  for (const Segment& segment : segments) {
    view.segments.push_back({std::string(segment.alias), segment.position, segment.tokens,
                             segment.first_row, segment.rows});
  }
  return view;
}

std::vector<std::pair<std::string, wire::AttendRequestView>> AttendSeeds() {
  // The fixture's next positions: 0, and 131 for flash-prompt (so 130 is the
  // step another rank repeats).
  const Segment sinks0{"flash-sinks", 0, 1};
  const Segment plain0{"flash", 0, 1};
  const Segment prompt_next{"flash-prompt", 131, 1, 32, 1};  // brings C4A row 32
  // A C128A layer holds row 0 and gets none: the segment still says where
  // the rows would continue.
  const Segment prompt_c128a{"flash-prompt", 131, 1, 1, 0};
  const Segment prompt_repeat{"flash-prompt", 130, 1};
  std::vector<std::pair<std::string, wire::AttendRequestView>> seeds;
  auto add = [&](std::string name, wire::AttendRequestView view) {
    seeds.emplace_back(std::move(name), std::move(view));
  };
  wire::AttendRequestView swa = Attend(1, 0, 16, {sinks0});
  swa.return_lse = true;
  add("attend-swa", swa);
  wire::AttendRequestView mtp = Attend(2, 43, 16, {plain0});
  mtp.derotate_output = true;
  add("attend-swa-mtp-derotate", mtp);
  add("attend-c4a-first-step", AttendC4A(3, 2, 16, {sinks0}, 8));
  add("attend-c4a-four-tokens", AttendC4A(4, 2, 16, {{"flash", 0, 4, 0, 1}}, 4));
  wire::AttendRequestView c4a = AttendC4A(5, 2, 16, {prompt_next}, 64);
  c4a.return_lse = true;
  add("attend-c4a-prompt", c4a);
  add("attend-c128a-prompt", Attend(6, 3, 16, {prompt_c128a}));
  add("attend-c128a-prompt-three-tokens", Attend(7, 5, 16, {{"flash-prompt", 131, 3, 1, 0}}));
  add("attend-multi-segment", Attend(8, 0, 16, {sinks0, {"flash", 0, 2}, prompt_c128a}));
  add("attend-multi-segment-c4a", AttendC4A(9, 4, 16, {sinks0, prompt_next}, 16));
  wire::AttendRequestView repeat = AttendC4A(10, 2, 16, {prompt_repeat}, 8, /*kv=*/false);
  repeat.head_offset = 16;
  add("attend-repeated-rank-c4a", repeat);
  wire::AttendRequestView repeat_kv = Attend(11, 3, 16, {prompt_repeat});
  repeat_kv.head_offset = 48;
  add("attend-repeated-rank-c128a-with-kv", repeat_kv);
  wire::AttendRequestView pro = Attend(12, 0, 16, {{"pro-sinks", 0, 1}});
  pro.head_offset = 112;
  add("attend-pro-c128a", pro);
  add("attend-pro-c4a", AttendC4A(13, 2, 16, {{"pro-sinks", 0, 1}}, 16));
  wire::AttendRequestView h4 = AttendC4A(14, 2, 4, {{"flash-h4", 0, 1}}, 4);
  h4.head_offset = 60;
  add("attend-h4-c4a", h4);
  // The FP8 output, on the padded head count and on a C4A step with lse.
  wire::AttendRequestView fp8_h4 = h4;
  fp8_h4.request_id = 17;
  fp8_h4.fp8_output = true;
  fp8_h4.derotate_output = true;
  add("attend-fp8-h4-c4a-derotate", fp8_h4);
  wire::AttendRequestView fp8_c4a = c4a;
  fp8_c4a.request_id = 18;
  fp8_c4a.fp8_output = true;
  add("attend-fp8-c4a-prompt-lse", fp8_c4a);

  // Near the edges, each refused: a head range far past the model's 64
  // heads that ends at the largest int32, positions and counts at the
  // limits, a huge dimension, top-k entries at the int32 extremes.
  wire::AttendRequestView far_heads = swa;
  far_heads.head_offset = kInt32Max - 16;
  add("edge-head-offset", far_heads);
  wire::AttendRequestView far_heads_bare = Bare(0, {sinks0});
  far_heads_bare.head_offset = kInt32Max - 16;
  add("edge-head-offset-bare", far_heads_bare);
  add("edge-position-at-max", Bare(0, {{"flash-sinks", kMaxPosition - 1, 2}}));
  add("edge-position-int32-max", Bare(0, {{"flash-sinks", kInt32Max, 1}}));
  add("edge-num-tokens-int32-max", Bare(0, {{"flash-sinks", 0, kInt32Max}}));
  add("edge-layer-int32-min", Bare(std::numeric_limits<int32_t>::min(), {sinks0}));
  wire::AttendRequestView id_max = swa;
  id_max.request_id = std::numeric_limits<uint64_t>::max();
  add("edge-request-id-max", id_max);
  wire::AttendRequestView huge_q = Bare(0, {sinks0});
  huge_q.q = OwnedTensor<uint16_t>(wire::DType::kBf16,
                                   {1, std::numeric_limits<int64_t>::max(), kHeadDim}, {});
  add("edge-q-shape-int64-max", huge_q);
  // FP8 answer regions: the engine never sees a reference (the service
  // resolves them), so these go as the codec reads them.
  wire::AttendRequestView fp8_regions = swa;
  fp8_regions.fp8_output = true;
  fp8_regions.out_region = wire::RegionRefView{1, 0, 16 * kFp8RowBytes};
  fp8_regions.out_scales_region =
      wire::RegionRefView{1, std::numeric_limits<int64_t>::max() - 3, 16 * kFp8ScaleRowBytes};
  add("edge-fp8-out-scales-region", fp8_regions);
  wire::AttendRequestView topk_extremes = AttendC4A(15, 2, 16, {prompt_next}, 2);
  topk_extremes.topk = OwnedTensor<int32_t>(wire::DType::kI32, {1, 2},
                                            {std::numeric_limits<int32_t>::min(), kInt32Max});
  add("edge-topk-int32-extremes", topk_extremes);

  // Reproducers of the fuzzers' findings (tests/fuzz/README.md): the known
  // ones stay skipped or suppressed until they are fixed, then every run
  // tries them again.
  // The head range's end computed in int32 (Engine::PlanAttend): past
  // INT32_MAX it wraps, passes the check, and the sinks are read from far
  // outside their array (a whole message, so that it gets that far; the
  // fuzzer's own input is testdata/engine_fuzzer/crash-head-offset-overflow).
  wire::AttendRequestView wrapping_heads = swa;
  wrapping_heads.head_offset = kInt32Max - 8;
  add("known-head-offset-overflow", wrapping_heads);
  // Compressed row counts added in int32 (Engine::PlanAttend), a new step
  // and a repeated one.
  wire::AttendRequestView rows_new = AttendC4A(16, 2, 16, {prompt_next}, 8);
  rows_new.segments[0].num_compressed_rows = kInt32Max - 16;
  add("known-compressed-rows-overflow", rows_new);
  wire::AttendRequestView rows_repeat = repeat;
  rows_repeat.segments[0].first_compressed_row = kInt32Max;
  rows_repeat.segments[0].num_compressed_rows = 1;
  add("known-compressed-rows-overflow-repeat", rows_repeat);
  // A top-k shape whose size in bytes overflows int64 (CheckTensor).
  wire::AttendRequestView wide_topk = h4;
  wide_topk.topk = OwnedTensor<int32_t>(wire::DType::kI32, {1, int64_t{1} << 62}, {});
  add("known-topk-shape-overflow", wide_topk);
  // NaN queries: the CPU decode's exp casts a NaN score to int32.
  wire::AttendRequestView nan_query = h4;
  nan_query.q = OwnedTensor(wire::DType::kBf16, {1, 4, kHeadDim},
                            std::vector<uint16_t>(4 * kHeadDim, 0x7fc0));
  add("known-nan-query", nan_query);
  return seeds;
}

std::vector<std::pair<std::string, std::string>> OtherCodecSeeds() {
  std::vector<std::pair<std::string, std::string>> seeds;
  wire::AttendResponseView answer;
  answer.request_id = 1;
  answer.out = Rows(100, {1, 16, kHeadDim});
  answer.lse = OwnedTensor<float>(wire::DType::kF32, {1, 16}, std::vector<float>(16, 5.5f));
  answer.timing = wire::TimingView{12.5, 80.0, 150.25, 260.0, 4};
  seeds.emplace_back("response-out-lse-timing", Flat(wire::SerializeAttendResponse(answer)));
  wire::AttendResponseView refused;
  refused.request_id = std::numeric_limits<uint64_t>::max();
  refused.status = wire::RequestStatusView{3, "head_offset: heads 60..75 are outside the model's "
                                              "64 query heads"};
  refused.timing = wire::TimingView{-0.0, std::numeric_limits<double>::quiet_NaN(), 0, 1e300, -1};
  seeds.emplace_back("response-status-edge-timing", Flat(wire::SerializeAttendResponse(refused)));
  wire::AttendResponseView fp8_answer;
  fp8_answer.request_id = 2;
  fp8_answer.out = OwnedTensor(wire::DType::kE4m3fn, {1, 16, kHeadDim},
                               std::vector<uint8_t>(16 * kFp8RowBytes, 0x38));
  fp8_answer.out_scales = OwnedTensor(wire::DType::kUe8m0, {1, 16, kOutputQuantBlocks},
                                      std::vector<uint8_t>(16 * kFp8ScaleRowBytes, 0x69));
  fp8_answer.timing = wire::TimingView{1.0, 2.0, 3.0, 7.0, 1};
  seeds.emplace_back("response-fp8-out-scales", Flat(wire::SerializeAttendResponse(fp8_answer)));

  const ModelProfile& flash = **FindModelProfile("deepseek-v4-flash");
  const int layers = flash.num_attention_layers();
  auto tensor = [](pb::Tensor* out, pb::DType dtype, std::vector<int64_t> shape,
                   const std::string& data) {
    out->set_dtype(dtype);
    for (int64_t dim : shape) out->add_shape(dim);
    out->set_data(data);
  };
  pb::CreateSessionRequest create;
  create.set_model("deepseek-v4-flash");
  create.set_num_heads(4);
  create.set_idle_ttl_seconds(600);
  tensor(create.mutable_sinks(), pb::DTYPE_F32, {layers, 4},
         std::string(sizeof(float) * layers * 4, '\x3f'));
  seeds.emplace_back("unary-create-session", create.SerializeAsString());
  pb::AppendKVRequest append;
  append.set_session_id("0123456789abcdef0123456789abcdef");
  append.set_first_position(0);
  append.set_num_positions(1);
  for (int layer : {0, 2, 3}) {
    pb::LayerRows* rows = append.add_layers();
    rows->set_layer(layer);
    tensor(rows->mutable_swa_kv(), pb::DTYPE_BF16, {1, kHeadDim},
           std::string(2 * kHeadDim, '\x01'));
    if (layer == 3) rows->set_first_compressed_row(kInt32Max);
  }
  seeds.emplace_back("unary-append-kv", append.SerializeAsString());
  pb::CloseSessionRequest close;
  close.set_session_id("0123456789abcdef0123456789abcdef");
  seeds.emplace_back("unary-close-session", close.SerializeAsString());
  seeds.emplace_back("empty", "");
  return seeds;
}

bool Write(const std::filesystem::path& path, const std::string& bytes) {
  std::ofstream file(path, std::ios::binary);
  file.write(bytes.data(), static_cast<std::streamsize>(bytes.size()));
  file.close();
  if (!file) std::fprintf(stderr, "make_seeds: cannot write %s\n", path.c_str());
  return static_cast<bool>(file);
}

int Main(const std::string& out) {
  const std::filesystem::path codec = std::filesystem::path(out) / "codec_fuzzer";
  const std::filesystem::path engine = std::filesystem::path(out) / "engine_fuzzer";
  std::error_code error;
  std::filesystem::create_directories(codec, error);
  std::filesystem::create_directories(engine, error);
  if (error) {
    std::fprintf(stderr, "make_seeds: cannot make %s: %s\n", out.c_str(), error.message().c_str());
    return 1;
  }
  bool ok = true;
  int written = 0;
  for (const auto& [name, view] : AttendSeeds()) {
    const std::string bytes = Flat(wire::SerializeAttendRequest(view));
    ok = Write(engine / name, bytes) && Write(codec / name, bytes) && ok;
    written += 2;
  }
  for (const auto& [name, bytes] : OtherCodecSeeds()) {
    ok = Write(codec / name, bytes) && ok;
    ++written;
  }
  std::printf("make_seeds: %d seeds in %s\n", written, out.c_str());
  return ok ? 0 : 1;
}

}  // namespace
}  // namespace mla::fuzz

int main(int argc, char** argv) {
  absl::SetProgramUsageMessage(
      "Writes the fuzzers' seed corpora: --out=DIR makes DIR/codec_fuzzer and "
      "DIR/engine_fuzzer.");
  absl::ParseCommandLine(argc, argv);
  const std::string out = absl::GetFlag(FLAGS_out);
  if (out.empty()) {
    std::fprintf(stderr, "make_seeds: --out=DIR is required\n");
    return 2;
  }
  return mla::fuzz::Main(out);
}

// Runs the real mla_kernel_tool binary on .npy files written here and holds
// its outputs to CpuBackend called directly on the same inputs (bit-exact:
// same backend, same inputs), and its errors to their exit codes and messages.
#include <sys/wait.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <limits>
#include <memory>
#include <random>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "kernels/backend.h"
#include "kernels/bf16.h"
#include "kernels/cpu_backend.h"
#include "kernels/geometry.h"
#include "kernels/model_profile.h"
#include "kernels/rope.h"
#include "kernels/tool/npy.h"

namespace mla {
namespace {

using ::testing::HasSubstr;

constexpr char kModel[] = "deepseek-v4-flash";
constexpr int kC4aLayer = 2;  // compress ratio 4, YaRN RoPE
constexpr int kSwaLayer = 0;  // compress ratio 0
constexpr int kRatio = 4;

struct ToolRun {
  int exit_code;
  std::string output;  // stdout and stderr
};

ToolRun RunTool(const std::vector<std::string>& args) {
  const std::string binary =
      absl::StrCat(std::getenv("TEST_SRCDIR"), "/", std::getenv("TEST_WORKSPACE"),
                   "/kernels/tool/mla_kernel_tool");
  const std::string command = absl::StrCat(binary, " ", absl::StrJoin(args, " "), " 2>&1");
  FILE* pipe = popen(command.c_str(), "r");
  EXPECT_NE(pipe, nullptr) << command;
  if (pipe == nullptr) return {-1, ""};
  std::string output;
  char buffer[4096];
  size_t got;
  while ((got = fread(buffer, 1, sizeof(buffer), pipe)) > 0) output.append(buffer, got);
  const int status = pclose(pipe);
  return {WIFEXITED(status) ? WEXITSTATUS(status) : -1, output};
}

// A fresh folder under TEST_TMPDIR.
std::string NewDir(const std::string& name) {
  const std::string dir = absl::StrCat(std::getenv("TEST_TMPDIR"), "/", name);
  std::filesystem::remove_all(dir);
  std::filesystem::create_directories(dir);
  return dir;
}

template <typename T>
void Write(const std::string& dir, const std::string& name, std::vector<int64_t> shape,
           const std::vector<T>& values) {
  ASSERT_TRUE(WriteNpy(absl::StrCat(dir, "/", name), NpyArray::FromValues<T>(shape, values)).ok());
}

NpyArray Read(const std::string& dir, const std::string& name) {
  absl::StatusOr<NpyArray> array = ReadNpy(absl::StrCat(dir, "/", name));
  EXPECT_TRUE(array.ok()) << array.status();
  return array.ok() ? *std::move(array) : NpyArray();
}

std::vector<uint16_t> RandomBf16(size_t count, uint64_t seed) {
  std::mt19937_64 rng(seed);
  std::normal_distribution<float> normal(0.0f, 1.0f);
  std::vector<uint16_t> values(count);
  for (uint16_t& v : values) v = FloatToBf16(normal(rng));
  return values;
}

template <typename T>
std::vector<T> ValuesOf(const NpyArray& array) {
  return std::vector<T>(array.values<T>().begin(), array.values<T>().end());
}

std::string Flags(const std::string& in, const std::string& out, int layer = kC4aLayer) {
  return absl::StrCat("--model=", kModel, " --layer=", layer, " --in=", in, " --out=", out);
}

// The inputs of one prologue and one decode of the C4A layer: 5 tokens of 6
// heads (run at 8); token 2 writes no KV row and attends to nothing.
struct Step {
  static constexpr int64_t kTokens = 5;
  static constexpr int kHeads = 6;
  static constexpr int kPaddedHeads = 8;
  std::vector<uint16_t> q = RandomBf16(kTokens * kHeads * kHeadDim, 1);
  std::vector<int32_t> positions = {100, 200, 7, 64, 1000};
  std::vector<uint16_t> kv = RandomBf16(kTokens * kHeadDim, 2);
  std::vector<int32_t> slots = {0, 1, -1, 70, 3};
  std::vector<uint16_t> compressed_kv = RandomBf16(4 * kHeadDim, 3);
  std::vector<int32_t> compressed_rows = {0, 1, 2, 24};
  std::vector<int32_t> compressed_slots = {5, 6, 7, 64};
  // Decode: global slots of the two pools, -1 skipped, lengths cut the rows.
  std::vector<int32_t> main_indices = {0, 1,  -1, 3, 1, 70, 0, 3,  0, 1,
                                       3, 70, 70, 3, 1, 0,  3, -1, 1, -1};
  std::vector<int32_t> main_lengths = {4, 3, 0, 4, 2};
  std::vector<int32_t> extra_indices = {5, 6, 7, 64, -1, 5, -1, -1, -1, 7, 7, 6, 6, 64, 5};
  std::vector<int32_t> extra_lengths = {3, 3, 3, 2, 1};
  std::vector<float> sinks = {0.5f, -1.0f, 2.0f, -std::numeric_limits<float>::infinity(),
                              0.0f, 1.0f};

  void WritePrologueInputs(const std::string& dir) const {
    Write<uint16_t>(dir, "q.npy", {kTokens, kHeads, kHeadDim}, q);
    Write<int32_t>(dir, "positions.npy", {kTokens}, positions);
    Write<uint16_t>(dir, "kv.npy", {kTokens, kHeadDim}, kv);
    Write<int32_t>(dir, "slots.npy", {kTokens}, slots);
    Write<uint16_t>(dir, "compressed_kv.npy", {4, kHeadDim}, compressed_kv);
    Write<int32_t>(dir, "compressed_rows.npy", {4}, compressed_rows);
    Write<int32_t>(dir, "compressed_slots.npy", {4}, compressed_slots);
  }

  void WriteDecodeInputs(const std::string& dir) const {
    Write<int32_t>(dir, "main_indices.npy", {kTokens, 4}, main_indices);
    Write<int32_t>(dir, "main_lengths.npy", {kTokens}, main_lengths);
    Write<int32_t>(dir, "extra_indices.npy", {kTokens, 3}, extra_indices);
    Write<int32_t>(dir, "extra_lengths.npy", {kTokens}, extra_lengths);
    Write<float>(dir, "sinks.npy", {kHeads}, sinks);
    Write<int32_t>(dir, "positions.npy", {kTokens}, positions);
  }
};

void ExpectArray(const NpyArray& array, NpyDtype dtype, std::vector<int64_t> shape) {
  EXPECT_EQ(NpyDescr(array.dtype), NpyDescr(dtype));
  EXPECT_EQ(array.shape, shape);
}

// One line on stderr, naming what to change.
void ExpectError(const ToolRun& run, int exit_code, const std::string& message) {
  EXPECT_EQ(run.exit_code, exit_code) << run.output;
  EXPECT_THAT(run.output, HasSubstr(message));
  EXPECT_EQ(std::count(run.output.begin(), run.output.end(), '\n'), 1) << run.output;
}

class ToolRoundTripTest : public ::testing::Test {
 protected:
  // Runs the tool's prologue on step_ and the same call on backend_ directly.
  void SetUp() override {
    in_ = NewDir("prologue_in");
    out_ = NewDir("prologue_out");
    step_.WritePrologueInputs(in_);
    const ToolRun run = RunTool({"prologue", Flags(in_, out_)});
    ASSERT_EQ(run.exit_code, 0) << run.output;

    const ModelProfile& profile = **FindModelProfile(kModel);
    rope_ = std::make_unique<RopeTable>(profile.rope_kind(kC4aLayer), 1001);
    swa_pool_.assign(2 * kBlockBytes, 0);
    compressed_pool_.assign(2 * kBlockBytes, 0);
    q_out_.assign(Step::kTokens * Step::kPaddedHeads * kHeadDim, 0xffff);
    std::vector<int32_t> compressed_positions;
    for (int32_t j : step_.compressed_rows) compressed_positions.push_back(j * kRatio);

    PrologueParams params;
    params.num_tokens = Step::kTokens;
    params.num_heads = Step::kHeads;
    params.padded_heads = Step::kPaddedHeads;
    params.q = step_.q.data();
    params.positions = step_.positions.data();
    params.q_out = q_out_.data();
    params.rms_norm_eps = profile.rms_norm_eps;
    params.rope = {rope_->data(), rope_->num_positions()};
    params.swa = {Step::kTokens,
                  step_.kv.data(),
                  step_.positions.data(),
                  step_.slots.data(),
                  {swa_pool_.data(), 2}};
    params.compressed = {4,
                         step_.compressed_kv.data(),
                         compressed_positions.data(),
                         step_.compressed_slots.data(),
                         {compressed_pool_.data(), 2}};
    ASSERT_TRUE(backend_.Prologue(params).ok());
  }

  // The decode of step_ on backend_, over the tool's q_out and pools.
  void DirectDecode(bool derotate, std::vector<uint16_t>& out, std::vector<float>& lse) {
    const ModelProfile& profile = **FindModelProfile(kModel);
    const std::vector<uint16_t> q_out = ValuesOf<uint16_t>(Read(out_, "q_out.npy"));
    std::vector<uint8_t> swa_pool = ValuesOf<uint8_t>(Read(out_, "cache.npy"));
    std::vector<uint8_t> compressed_pool = ValuesOf<uint8_t>(Read(out_, "compressed_cache.npy"));
    out.assign(Step::kTokens * Step::kHeads * kHeadDim, 0xffff);
    lse.assign(Step::kTokens * Step::kHeads, std::nanf(""));
    DecodeParams params;
    params.num_tokens = Step::kTokens;
    params.num_heads = Step::kHeads;
    params.padded_heads = Step::kPaddedHeads;
    params.q = q_out.data();
    params.softmax_scale = profile.softmax_scale;
    params.sinks = step_.sinks.data();
    params.main = {4, step_.main_indices.data(), step_.main_lengths.data(), {swa_pool.data(), 2}};
    params.extra = {
        3, step_.extra_indices.data(), step_.extra_lengths.data(), {compressed_pool.data(), 2}};
    params.derotate = derotate;
    params.positions = step_.positions.data();
    params.rope = {rope_->data(), rope_->num_positions()};
    params.out = out.data();
    params.lse = lse.data();
    ASSERT_TRUE(backend_.Decode(params).ok());
  }

  Step step_;
  std::string in_, out_;
  CpuBackend backend_{2};
  std::unique_ptr<RopeTable> rope_;
  std::vector<uint8_t> swa_pool_, compressed_pool_;
  std::vector<uint16_t> q_out_;
};

TEST_F(ToolRoundTripTest, PrologueWritesWhatCpuBackendComputes) {
  const NpyArray q_out = Read(out_, "q_out.npy");
  const NpyArray cache = Read(out_, "cache.npy");
  const NpyArray compressed_cache = Read(out_, "compressed_cache.npy");
  // The largest slots, 70 and 64, need two blocks in each new pool.
  ExpectArray(q_out, NpyDtype::kUint16, {Step::kTokens, Step::kPaddedHeads, kHeadDim});
  ExpectArray(cache, NpyDtype::kUint8, {2, kBlockBytes});
  ExpectArray(compressed_cache, NpyDtype::kUint8, {2, kBlockBytes});
  EXPECT_TRUE(ValuesOf<uint16_t>(q_out) == q_out_);
  EXPECT_TRUE(ValuesOf<uint8_t>(cache) == swa_pool_);
  EXPECT_TRUE(ValuesOf<uint8_t>(compressed_cache) == compressed_pool_);
}

TEST_F(ToolRoundTripTest, PrologueInsertsIntoAGivenPool) {
  // A second prologue over the first's pools, writing the rows again: the
  // pools come back unchanged and keep their size.
  const std::string again = NewDir("prologue_again");
  step_.WritePrologueInputs(again);
  std::filesystem::copy(absl::StrCat(out_, "/cache.npy"), again);
  std::filesystem::copy(absl::StrCat(out_, "/compressed_cache.npy"), again);
  const ToolRun run = RunTool({"prologue", Flags(again, again)});
  ASSERT_EQ(run.exit_code, 0) << run.output;
  EXPECT_TRUE(ValuesOf<uint8_t>(Read(again, "cache.npy")) == swa_pool_);
  EXPECT_TRUE(ValuesOf<uint8_t>(Read(again, "compressed_cache.npy")) == compressed_pool_);
}

TEST_F(ToolRoundTripTest, DecodeWritesWhatCpuBackendComputes) {
  // The prologue's --out folder, plus the key lists, is the decode's --in.
  step_.WriteDecodeInputs(out_);
  for (bool derotate : {false, true}) {
    const std::string result = NewDir(absl::StrCat("decode_out_", derotate));
    const ToolRun run =
        RunTool({"decode", Flags(out_, result), absl::StrCat("--heads=", Step::kHeads),
                 absl::StrCat("--derotate=", derotate)});
    ASSERT_EQ(run.exit_code, 0) << run.output;
    const NpyArray out = Read(result, "out.npy");
    const NpyArray lse = Read(result, "lse.npy");
    ExpectArray(out, NpyDtype::kUint16, {Step::kTokens, Step::kHeads, kHeadDim});
    ExpectArray(lse, NpyDtype::kFloat32, {Step::kTokens, Step::kHeads});

    std::vector<uint16_t> want_out;
    std::vector<float> want_lse;
    DirectDecode(derotate, want_out, want_lse);
    EXPECT_TRUE(ValuesOf<uint16_t>(out) == want_out) << "derotate " << derotate;
    const std::vector<float> got_lse = ValuesOf<float>(lse);
    EXPECT_EQ(0, std::memcmp(got_lse.data(), want_lse.data(), got_lse.size() * sizeof(float)));

    // Token 2 attends to nothing: out 0, lse +inf; the others see keys.
    for (int h = 0; h < Step::kHeads; ++h) {
      EXPECT_EQ(got_lse[2 * Step::kHeads + h], std::numeric_limits<float>::infinity());
      EXPECT_TRUE(std::isfinite(got_lse[h]));
      for (int d = 0; d < kHeadDim; ++d) {
        EXPECT_EQ(out.values<uint16_t>()[(2 * Step::kHeads + h) * kHeadDim + d], 0);
      }
    }
  }
}

TEST_F(ToolRoundTripTest, DecodeWithoutLseWritesOnlyOut) {
  step_.WriteDecodeInputs(out_);
  const std::string result = NewDir("decode_no_lse");
  const ToolRun run = RunTool({"decode", Flags(out_, result), "--heads=6", "--return_lse=false"});
  ASSERT_EQ(run.exit_code, 0) << run.output;
  EXPECT_TRUE(std::filesystem::exists(absl::StrCat(result, "/out.npy")));
  EXPECT_FALSE(std::filesystem::exists(absl::StrCat(result, "/lse.npy")));
}

TEST_F(ToolRoundTripTest, SinksMustMatchTheHeadsOutput) {
  // Without --heads, decode outputs all 8 heads of q_out; sinks.npy has 6.
  step_.WriteDecodeInputs(out_);
  ExpectError(RunTool({"decode", Flags(out_, out_)}), 1,
              "sinks.npy: expected shape [8], found [6] (H = 8 heads output");
}

TEST(ToolTest, DecodeOfEmptyKeySetsGivesZeroAndInfiniteLse) {
  const std::string dir = NewDir("empty_keys");
  Write<uint16_t>(dir, "q.npy", {2, 8, kHeadDim}, RandomBf16(2 * 8 * kHeadDim, 4));
  Write<uint8_t>(dir, "cache.npy", {1, kBlockBytes}, std::vector<uint8_t>(kBlockBytes, 0));
  Write<int32_t>(dir, "main_indices.npy", {2, 3}, {-1, -1, -1, 5, 6, 7});
  Write<int32_t>(dir, "main_lengths.npy", {2}, {3, 0});
  const ToolRun run = RunTool({"decode", Flags(dir, dir)});
  ASSERT_EQ(run.exit_code, 0) << run.output;
  const NpyArray out = Read(dir, "out.npy");
  const NpyArray lse = Read(dir, "lse.npy");
  ExpectArray(out, NpyDtype::kUint16, {2, 8, kHeadDim});
  for (uint16_t bits : out.values<uint16_t>()) ASSERT_EQ(bits, 0);
  for (float value : lse.values<float>()) ASSERT_EQ(value, std::numeric_limits<float>::infinity());
}

TEST(ToolTest, DemoPassesOnSmallShapes) {
  for (const char* layer : {"--layer=2", "--layer=0", "--layer=3"}) {
    const ToolRun run = RunTool({"demo", "--model=deepseek-v4-flash", layer, "--tp=16", "--batch=2",
                                 "--context=600", "--runs=1", "--threads=2"});
    EXPECT_EQ(run.exit_code, 0) << run.output;
    EXPECT_THAT(run.output, HasSubstr("result    PASS")) << run.output;
    EXPECT_THAT(run.output, HasSubstr("tokens/s"));
  }
}

TEST(ToolTest, NoArgumentsExplainsTheSubcommandsAndFiles) {
  const ToolRun run = RunTool({});
  EXPECT_EQ(run.exit_code, 2);
  for (const char* text : {"prologue", "decode", "demo", "q.npy", "<u2 [N, H, 512]",
                           "main_indices.npy", "lse.npy", "|u1 [B, 37440]"}) {
    EXPECT_THAT(run.output, HasSubstr(text));
  }
}

TEST(ToolTest, HelpShowsTheUsageAndFlags) {
  const ToolRun run = RunTool({"--help"});
  EXPECT_THAT(run.output, HasSubstr("usage: mla_kernel_tool <prologue|decode|demo>"));
  EXPECT_THAT(run.output, HasSubstr("--backend"));
  EXPECT_THAT(run.output, HasSubstr("--num_blocks"));
}

TEST(ToolTest, BadCommandLinesExitWithTwo) {
  ExpectError(RunTool({"rotate"}), 2, "unknown subcommand 'rotate'");
  ExpectError(RunTool({"prologue", "--in=/tmp"}), 2, "need --in=DIR and --out=DIR");
  ExpectError(RunTool({"demo", "--layer=99"}), 2, "--layer=99 is outside deepseek-v4-flash's");
  ExpectError(RunTool({"demo", "--model=v5"}), 2, "unknown model profile 'v5'");
  ExpectError(RunTool({"demo", "--tp=3"}), 2, "--tp=3 does not divide the 64 query heads");
  ExpectError(RunTool({"demo", "--backend=tpu"}), 2, "unknown backend 'tpu'");
}

TEST(ToolTest, MissingFileIsNamed) {
  const std::string dir = NewDir("missing");
  ExpectError(RunTool({"prologue", Flags(dir, dir)}), 1,
              "prologue: q.npy: not found in " + dir +
                  " (--in); expected <u2 (bf16 bits) of shape [*, *, 512]");
}

TEST(ToolTest, WrongDtypeIsNamed) {
  const std::string dir = NewDir("wrong_dtype");
  Write<float>(dir, "q.npy", {1, 8, kHeadDim}, std::vector<float>(8 * kHeadDim, 1.0f));
  ExpectError(RunTool({"prologue", Flags(dir, dir)}), 1,
              "q.npy: expected dtype <u2 (bf16 bits), found <f4");
}

TEST(ToolTest, InconsistentTokenCountIsNamed) {
  const std::string dir = NewDir("token_count");
  Step().WritePrologueInputs(dir);
  Write<int32_t>(dir, "positions.npy", {4}, {1, 2, 3, 4});
  ExpectError(RunTool({"prologue", Flags(dir, dir)}), 1,
              "positions.npy: expected shape [5], found [4] (N = 5 tokens of q.npy)");
}

TEST(ToolTest, OutOfRangeIndicesAreNamed) {
  const std::string dir = NewDir("index_range");
  Write<uint16_t>(dir, "q.npy", {2, 8, kHeadDim}, RandomBf16(2 * 8 * kHeadDim, 5));
  Write<uint8_t>(dir, "cache.npy", {1, kBlockBytes}, std::vector<uint8_t>(kBlockBytes, 0));
  Write<int32_t>(dir, "main_indices.npy", {2, 2}, {0, 1, 2, 999});
  ExpectError(RunTool({"decode", Flags(dir, dir)}), 1,
              "main_indices.npy[1][1] = 999 is outside the pool's slots [0, 64)");
  EXPECT_FALSE(std::filesystem::exists(absl::StrCat(dir, "/out.npy")));

  Write<int32_t>(dir, "main_indices.npy", {2, 2}, {0, 1, 2, -7});
  ExpectError(RunTool({"decode", Flags(dir, dir)}), 1, "main_indices.npy[1][1] = -7");
}

TEST(ToolTest, OutOfRangeSlotsAndRowsAreNamed) {
  const std::string dir = NewDir("slot_range");
  Step().WritePrologueInputs(dir);
  ExpectError(RunTool({"prologue", Flags(dir, dir), "--num_blocks=1"}), 1,
              "slots.npy[3] = 70 is outside the pool's slots [0, 64)");
  ExpectError(RunTool({"prologue", Flags(dir, dir), "--num_blocks=100000"}), 1,
              "a new pool for cache.npy would take 100000 blocks (--num_blocks=100000)");
  Write<int32_t>(dir, "compressed_rows.npy", {4}, {0, -1, 2, 3});
  ExpectError(RunTool({"prologue", Flags(dir, dir)}), 1, "compressed_rows.npy[1] = -1");
}

TEST(ToolTest, CompressedRowsNeedACompressedLayer) {
  const std::string dir = NewDir("swa_layer");
  Step().WritePrologueInputs(dir);
  ExpectError(RunTool({"prologue", Flags(dir, dir, kSwaLayer)}), 1,
              "deepseek-v4-flash layer 0 (swa, compress ratio 0) has no compressed rows");
}

TEST(ToolTest, CompanionFilesComeTogether) {
  const std::string dir = NewDir("companions");
  Step().WritePrologueInputs(dir);
  std::filesystem::remove(absl::StrCat(dir, "/slots.npy"));
  ExpectError(RunTool({"prologue", Flags(dir, dir)}), 1,
              "kv.npy in " + dir + " also needs slots.npy");
}

}  // namespace
}  // namespace mla

// The alignment the CUDA kernels need (CheckCudaAlignment): checked on the
// host before anything is enqueued, so these tests need no GPU and run in
// CI. Each pointer moved off its alignment is refused by name; aligned and
// null pointers pass (null ones are the structural checks' business).
#include <cstdint>
#include <functional>
#include <string>

#include "absl/status/status.h"
#include "gtest/gtest.h"
#include "kernels/backend.h"
#include "kernels/cuda/cuda_backend.h"

namespace mla {
namespace {

// Fake addresses: never dereferenced.
template <typename T>
T* At(uintptr_t address) {
  return reinterpret_cast<T*>(address);
}
constexpr uintptr_t kBase = 0x10000;

PrologueParams AlignedPrologue() {
  PrologueParams p;
  p.q = At<const uint16_t>(kBase);
  p.q_out = At<uint16_t>(kBase + 0x1000);
  p.positions = At<const int32_t>(kBase + 0x2000);
  p.rope.data = At<const float>(kBase + 0x3000);
  for (KvInsertParams* insert : {&p.swa, &p.compressed}) {
    insert->rows = At<const uint16_t>(kBase + 0x4000);
    insert->positions = At<const int32_t>(kBase + 0x5000);
    insert->slots = At<const int32_t>(kBase + 0x6000);
    insert->pool.base = At<uint8_t>(kBase + 0x7000);
  }
  return p;
}

DecodeParams AlignedDecode() {
  DecodeParams p;
  p.q = At<const uint16_t>(kBase);
  p.out = At<uint16_t>(kBase + 0x1000);
  p.lse = At<float>(kBase + 0x2000);
  p.sinks = At<const float>(kBase + 0x3000);
  p.positions = At<const int32_t>(kBase + 0x4000);
  p.rope.data = At<const float>(kBase + 0x5000);
  for (KeyListParams* list : {&p.main, &p.extra}) {
    list->indices = At<const int32_t>(kBase + 0x6000);
    list->lengths = At<const int32_t>(kBase + 0x7000);
    list->pool.base = At<uint8_t>(kBase + 0x8000);
  }
  return p;
}

template <typename Params>
void ExpectRefused(const Params& params, const std::string& name) {
  const absl::Status status = CheckCudaAlignment(params);
  EXPECT_EQ(status.code(), absl::StatusCode::kInvalidArgument) << name;
  EXPECT_NE(status.message().find(name + " must be"), std::string::npos) << status;
}

template <typename T, typename Params>
void Shift(Params& params, T*& pointer, uintptr_t by) {
  pointer = At<T>(reinterpret_cast<uintptr_t>(pointer) + by);
}

TEST(CudaAlignmentTest, AlignedAndNullPointersPass) {
  EXPECT_TRUE(CheckCudaAlignment(AlignedPrologue()).ok());
  EXPECT_TRUE(CheckCudaAlignment(AlignedDecode()).ok());
  EXPECT_TRUE(CheckCudaAlignment(PrologueParams{}).ok());
  EXPECT_TRUE(CheckCudaAlignment(DecodeParams{}).ok());
  // out needs 4 bytes only (the kernels store 4-byte pairs where 16 would not do).
  DecodeParams decode = AlignedDecode();
  Shift(decode, decode.out, 4);
  EXPECT_TRUE(CheckCudaAlignment(decode).ok());
}

TEST(CudaAlignmentTest, ProloguePointersOffTheirAlignmentAreRefused) {
  const std::vector<std::pair<std::string, std::function<void(PrologueParams&)>>> cases = {
      {"prologue: q", [](PrologueParams& p) { Shift(p, p.q, 8); }},
      {"prologue: q_out", [](PrologueParams& p) { Shift(p, p.q_out, 2); }},
      {"prologue: positions", [](PrologueParams& p) { Shift(p, p.positions, 2); }},
      {"prologue: RoPE table", [](PrologueParams& p) { Shift(p, p.rope.data, 1); }},
      {"prologue: swa rows", [](PrologueParams& p) { Shift(p, p.swa.rows, 4); }},
      {"prologue: swa slots", [](PrologueParams& p) { Shift(p, p.swa.slots, 2); }},
      {"prologue: compressed positions",
       [](PrologueParams& p) { Shift(p, p.compressed.positions, 1); }},
      {"prologue: compressed pool", [](PrologueParams& p) { Shift(p, p.compressed.pool.base, 8); }},
  };
  for (const auto& [name, mutate] : cases) {
    PrologueParams params = AlignedPrologue();
    mutate(params);
    ExpectRefused(params, name);
  }
}

TEST(CudaAlignmentTest, DecodePointersOffTheirAlignmentAreRefused) {
  const std::vector<std::pair<std::string, std::function<void(DecodeParams&)>>> cases = {
      {"decode: q", [](DecodeParams& p) { Shift(p, p.q, 4); }},
      {"decode: out", [](DecodeParams& p) { Shift(p, p.out, 2); }},
      {"decode: lse", [](DecodeParams& p) { Shift(p, p.lse, 2); }},
      {"decode: sinks", [](DecodeParams& p) { Shift(p, p.sinks, 1); }},
      {"decode: positions", [](DecodeParams& p) { Shift(p, p.positions, 3); }},
      {"decode: RoPE table", [](DecodeParams& p) { Shift(p, p.rope.data, 2); }},
      {"decode: main list indices", [](DecodeParams& p) { Shift(p, p.main.indices, 2); }},
      {"decode: main list pool", [](DecodeParams& p) { Shift(p, p.main.pool.base, 4); }},
      {"decode: extra list lengths", [](DecodeParams& p) { Shift(p, p.extra.lengths, 1); }},
      {"decode: extra list pool", [](DecodeParams& p) { Shift(p, p.extra.pool.base, 12); }},
  };
  for (const auto& [name, mutate] : cases) {
    DecodeParams params = AlignedDecode();
    mutate(params);
    ExpectRefused(params, name);
  }
}

TEST(CudaAlignmentTest, TheMessageSaysWhatToChange) {
  DecodeParams params = AlignedDecode();
  Shift(params, params.q, 8);
  const std::string message(CheckCudaAlignment(params).message());
  EXPECT_NE(message.find("16-byte aligned"), std::string::npos) << message;
  EXPECT_NE(message.find("0x10008"), std::string::npos) << message;
  EXPECT_NE(message.find("multiples of 16 bytes"), std::string::npos) << message;
}

}  // namespace
}  // namespace mla

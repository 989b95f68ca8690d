#include "kernels/backend.h"

#include <algorithm>

#include "absl/strings/str_cat.h"
#include "kernels/head_padding.h"
#include "kernels/key_lists.h"

namespace mla {
namespace {

absl::Status CheckHeads(int num_heads, int padded_heads) {
  absl::StatusOr<int> expected = PaddedHeadCount(num_heads);
  if (!expected.ok()) return expected.status();
  if (!IsSupportedHeadCount(padded_heads) || padded_heads < num_heads) {
    return absl::InvalidArgumentError(
        absl::StrCat("padded head count ", padded_heads, " must be one of the kernels' (",
                     SupportedHeadCountsText(), ") and at least the head count ", num_heads));
  }
  return absl::OkStatus();
}

absl::Status CheckInsert(const KvInsertParams& insert, const char* name) {
  if (insert.num_rows < 0) {
    return absl::InvalidArgumentError(absl::StrCat(name, ": negative row count"));
  }
  if (insert.num_rows > 0 && (insert.rows == nullptr || insert.positions == nullptr ||
                              insert.slots == nullptr || insert.pool.base == nullptr)) {
    return absl::InvalidArgumentError(
        absl::StrCat(name, ": rows, positions, slots and pool are required for ",
                     insert.num_rows, " rows"));
  }
  return absl::OkStatus();
}

absl::Status CheckKeyList(const KeyListParams& list, const char* name) {
  if (list.width < 0) return absl::InvalidArgumentError(absl::StrCat(name, ": negative width"));
  if (list.width > 0 && (list.indices == nullptr || list.pool.base == nullptr)) {
    return absl::InvalidArgumentError(
        absl::StrCat(name, ": indices and pool are required for width ", list.width));
  }
  return absl::OkStatus();
}

}  // namespace

DeviceBuffer& DeviceBuffer::operator=(DeviceBuffer&& other) noexcept {
  if (this != &other) {
    Reset();
    data_ = other.data_;
    bytes_ = other.bytes_;
    release_ = std::move(other.release_);
    other.data_ = nullptr;
    other.bytes_ = 0;
    other.release_ = nullptr;
  }
  return *this;
}

absl::StatusOr<DeviceBuffer> ComputeBackend::AllocateHost(int64_t bytes) {
  if (bytes < 0) return absl::InvalidArgumentError("cannot allocate a negative size");
  return DeviceBuffer(new uint8_t[std::max<int64_t>(bytes, 1)], bytes,
                      [](void* data) { delete[] static_cast<uint8_t*>(data); });
}

absl::Status ComputeBackend::CopyToDeviceAsync(void* device_dst, const void* host_src,
                                               int64_t bytes) {
  return CopyToDevice(device_dst, host_src, bytes);
}

absl::Status ComputeBackend::CopyToHostAsync(void* host_dst, const void* device_src,
                                             int64_t bytes) {
  return CopyToHost(host_dst, device_src, bytes);
}

absl::Status ComputeBackend::PrologueAndDecode(const PrologueParams& prologue,
                                               const DecodeParams& decode) {
  if (absl::Status status = Prologue(prologue); !status.ok()) return status;
  return Decode(decode);
}

absl::Status ComputeBackend::BuildKeyLists(const KeyListBuildParams& params) {
  if (!host_accessible()) {
    return absl::UnimplementedError(
        absl::StrCat(Describe(), " does not build key lists; its memory is not the host's"));
  }
  return BuildKeyListsOnHost(params);
}

absl::Status ComputeBackend::CheckMark(int mark) {
  if (mark >= 0 && mark < kMaxMarks) return absl::OkStatus();
  return absl::InvalidArgumentError(absl::StrCat("mark ", mark, " is outside 0..", kMaxMarks - 1));
}

absl::Status ComputeBackend::Mark(int mark) {
  if (absl::Status status = CheckMark(mark); !status.ok()) return status;
  host_marks_[mark] = std::chrono::steady_clock::now();
  return absl::OkStatus();
}

absl::Status ComputeBackend::WaitForMark(int mark) { return CheckMark(mark); }

absl::Status ComputeBackend::CopyToDeviceQueued(void* device_dst, const void* host_src,
                                                int64_t bytes) {
  return CopyToDeviceAsync(device_dst, host_src, bytes);
}

absl::Status ComputeBackend::MarkCopies(int mark) { return Mark(mark); }

absl::Status ComputeBackend::JoinCopies() { return absl::OkStatus(); }

double ComputeBackend::MarkedMicros(int from, int to) const {
  if (from < 0 || from >= kMaxMarks || to < 0 || to >= kMaxMarks) return 0;
  const std::chrono::steady_clock::time_point unset{};
  if (host_marks_[from] == unset || host_marks_[to] == unset) return 0;
  return std::chrono::duration<double, std::micro>(host_marks_[to] - host_marks_[from]).count();
}

void DeviceBuffer::Reset() {
  if (data_ != nullptr && release_) release_(data_);
  data_ = nullptr;
  bytes_ = 0;
}

absl::Status CheckPrologueParams(const PrologueParams& params) {
  if (params.num_tokens < 0) return absl::InvalidArgumentError("prologue: negative token count");
  if (absl::Status status = CheckHeads(params.num_heads, params.padded_heads); !status.ok()) {
    return status;
  }
  if (params.num_tokens > 0 &&
      (params.q == nullptr || params.positions == nullptr || params.q_out == nullptr)) {
    return absl::InvalidArgumentError("prologue: q, positions and q_out are required");
  }
  const bool rotates = params.num_tokens > 0 || params.swa.num_rows > 0 ||
                       params.compressed.num_rows > 0;
  if (rotates && (params.rope.data == nullptr || params.rope.num_positions <= 0)) {
    return absl::InvalidArgumentError("prologue: a RoPE table is required");
  }
  if (absl::Status status = CheckInsert(params.swa, "prologue swa rows"); !status.ok()) {
    return status;
  }
  return CheckInsert(params.compressed, "prologue compressed rows");
}

absl::Status CheckDecodeParams(const DecodeParams& params) {
  if (params.num_tokens < 0) return absl::InvalidArgumentError("decode: negative token count");
  if (absl::Status status = CheckHeads(params.num_heads, params.padded_heads); !status.ok()) {
    return status;
  }
  const bool fp8 = params.out_e4m3 != nullptr || params.out_scales != nullptr;
  if (fp8 && params.out != nullptr) {
    return absl::InvalidArgumentError(
        "decode: out (bf16) and out_e4m3/out_scales (FP8) are two formats; set one");
  }
  if (params.num_tokens > 0 &&
      (params.q == nullptr ||
       (fp8 ? params.out_e4m3 == nullptr || params.out_scales == nullptr
            : params.out == nullptr))) {
    return absl::InvalidArgumentError(
        "decode: q and an output (out, or out_e4m3 with out_scales) are required");
  }
  const struct {
    const void* address;
    int64_t alignment;
    const char* name;
  } outputs[] = {{params.out, kDecodeOutAlignment, "out"},
                 {params.out_e4m3, kDecodeE4m3Alignment, "out_e4m3"},
                 {params.out_scales, kDecodeScalesAlignment, "out_scales"},
                 {params.lse, kDecodeLseAlignment, "lse"}};
  for (const auto& output : outputs) {
    if (output.address != nullptr && !AlignedTo(output.address, output.alignment)) {
      const uintptr_t rest =
          reinterpret_cast<uintptr_t>(output.address) % static_cast<uintptr_t>(output.alignment);
      return absl::InvalidArgumentError(absl::StrCat(
          "decode: ", output.name, " must be ", output.alignment,
          "-byte aligned, as the kernels write it; its address is ", rest, " bytes past a multiple"));
    }
  }
  if (params.derotate && params.num_tokens > 0 &&
      (params.positions == nullptr || params.rope.data == nullptr ||
       params.rope.num_positions <= 0)) {
    return absl::InvalidArgumentError("decode: de-rotation needs positions and a RoPE table");
  }
  if (absl::Status status = CheckKeyList(params.main, "decode main list"); !status.ok()) {
    return status;
  }
  if (absl::Status status = CheckKeyList(params.extra, "decode extra list"); !status.ok()) {
    return status;
  }
  const int64_t keys = int64_t{params.main.width} + params.extra.width;
  if (keys > kMaxKeysPerToken) {
    return absl::InvalidArgumentError(
        absl::StrCat("decode: a token's key lists are ", params.main.width, " + ",
                     params.extra.width, " entries wide; at most ", kMaxKeysPerToken,
                     " together"));
  }
  return absl::OkStatus();
}

absl::Status CheckKeyListBuildParams(const KeyListBuildParams& params) {
  if (params.num_tokens < 0) return absl::InvalidArgumentError("key lists: negative token count");
  if (params.extra_width < 0 || params.extra_width > kMaxKeysPerToken - kSwaWindow) {
    return absl::InvalidArgumentError(absl::StrCat("key lists: extra width ", params.extra_width,
                                                   " is outside 0..",
                                                   kMaxKeysPerToken - kSwaWindow));
  }
  if (params.swa_ring_pages < 1 ||
      int64_t{params.swa_ring_pages} * kBlockTokens < kSwaWindow) {
    return absl::InvalidArgumentError(
        absl::StrCat("key lists: an SWA ring of ", params.swa_ring_pages,
                     " pages cannot hold a window of ", kSwaWindow, " rows"));
  }
  if (params.num_pages < 0 || params.num_table_writes < 0) {
    return absl::InvalidArgumentError("key lists: negative page or table write count");
  }
  if (params.num_table_writes > 0 && (params.pages == nullptr || params.table_write_at == nullptr ||
                                      params.table_write_page == nullptr)) {
    return absl::InvalidArgumentError(
        "key lists: table writes need the pages and both write arrays");
  }
  if (params.num_tokens > 0 &&
      (params.positions == nullptr || params.pages == nullptr || params.swa_table == nullptr ||
       params.compressed_table == nullptr || params.extra_rule == nullptr ||
       params.main_indices == nullptr || params.main_lengths == nullptr ||
       params.extra_lengths == nullptr || (params.extra_width > 0 && params.extra_indices == nullptr))) {
    return absl::InvalidArgumentError(
        "key lists: positions, pages, the tables, the rules and every list are required");
  }
  return absl::OkStatus();
}

}  // namespace mla

#include "kernels/tool/staging.h"

#include <algorithm>

#include "absl/strings/str_cat.h"
#include "kernels/geometry.h"
#include "kernels/head_padding.h"
#include "kernels/tool/tool_files.h"
#include "kernels/validation.h"

namespace mla {
namespace {

absl::StatusOr<DeviceBuffer> UploadBytes(ComputeBackend& backend, const void* data, int64_t bytes) {
  absl::StatusOr<DeviceBuffer> buffer = backend.Allocate(bytes);
  if (!buffer.ok()) return buffer.status();
  if (bytes > 0) {
    if (absl::Status status = backend.CopyToDevice(buffer->data(), data, bytes); !status.ok()) {
      return status;
    }
  }
  return buffer;
}

// Fills a call's buffers, remembering the first failure so that a Create()
// reads as a list of arrays and checks once at the end.
class BufferFiller {
 public:
  BufferFiller(ComputeBackend& backend, std::vector<DeviceBuffer>& buffers)
      : backend_(backend), buffers_(buffers) {}

  // A backend copy of `values`; null for an empty span, so that optional
  // arrays stay absent.
  template <typename T>
  const T* Input(absl::Span<const T> values) {
    if (values.empty()) return nullptr;
    return static_cast<const T*>(Add(values.data(), values.size() * sizeof(T)));
  }

  // Room for `count` outputs, every byte 0xff (NaN as bf16 and as float).
  template <typename T>
  T* Output(int64_t count) {
    const std::vector<uint8_t> poison(count * sizeof(T), 0xff);
    return static_cast<T*>(Add(poison.data(), static_cast<int64_t>(poison.size())));
  }

  const absl::Status& status() const { return status_; }

 private:
  void* Add(const void* data, int64_t bytes) {
    if (!status_.ok()) return nullptr;
    absl::StatusOr<DeviceBuffer> buffer = UploadBytes(backend_, data, bytes);
    if (!buffer.ok()) {
      status_ = buffer.status();
      return nullptr;
    }
    buffers_.push_back(*std::move(buffer));
    return buffers_.back().data();
  }

  ComputeBackend& backend_;
  std::vector<DeviceBuffer>& buffers_;
  absl::Status status_;
};

// Guards the spans' sizes, which the kernels trust.
absl::Status CheckCount(absl::string_view name, size_t actual, int64_t expected) {
  if (static_cast<int64_t>(actual) == expected) return absl::OkStatus();
  return absl::InvalidArgumentError(
      absl::StrCat(name, ": holds ", actual, " values where this call needs ", expected));
}

absl::Status CheckInsertSizes(const HostInsert& insert, absl::string_view rows_name,
                              absl::string_view positions_name) {
  const int64_t rows = static_cast<int64_t>(insert.slots.size());
  if (absl::Status status = CheckCount(rows_name, insert.rows.size(), rows * kHeadDim);
      !status.ok()) {
    return status;
  }
  return CheckCount(positions_name, insert.positions.size(), rows);
}

absl::Status CheckInsertValues(const HostInsert& insert, absl::string_view positions_name,
                               absl::string_view slots_name, const DeviceRope& rope,
                               const DevicePool& pool) {
  const int64_t rows = static_cast<int64_t>(insert.slots.size());
  if (absl::Status status =
          CheckPositions(positions_name, insert.positions.data(), rows, rope.num_positions);
      !status.ok()) {
    return status;
  }
  return CheckInsertSlots(slots_name, insert.slots.data(), rows, pool.view().num_slots());
}

KvInsertParams StageInsert(const HostInsert& insert, const DevicePool& pool, BufferFiller& filler) {
  KvInsertParams params;
  params.num_rows = static_cast<int64_t>(insert.slots.size());
  params.rows = filler.Input(insert.rows);
  params.positions = filler.Input(insert.positions);
  params.slots = filler.Input(insert.slots);
  params.pool = pool.view();
  return params;
}

absl::Status CheckKeyListSizes(const HostKeyList& list, int64_t num_tokens,
                               absl::string_view indices_name, absl::string_view lengths_name) {
  if (absl::Status status = CheckCount(indices_name, list.indices.size(), num_tokens * list.width);
      !status.ok()) {
    return status;
  }
  if (list.lengths.empty()) return absl::OkStatus();
  return CheckCount(lengths_name, list.lengths.size(), num_tokens);
}

KeyListParams StageKeyList(const HostKeyList& list, const DevicePool& pool, BufferFiller& filler) {
  KeyListParams params;
  params.width = list.width;
  params.indices = filler.Input(list.indices);
  params.lengths = filler.Input(list.lengths);
  params.pool = pool.view();
  return params;
}

absl::Status CheckKeyListValues(const HostKeyList& list, int64_t num_tokens, absl::string_view name,
                                const DevicePool& pool) {
  return CheckKeyIndices(name, list.indices.data(),
                         list.lengths.empty() ? nullptr : list.lengths.data(), num_tokens,
                         list.width, pool.view().num_slots());
}

template <typename T>
absl::StatusOr<NpyArray> Download(ComputeBackend& backend, const T* source,
                                  std::vector<int64_t> shape) {
  if (absl::Status status = backend.Synchronize(); !status.ok()) return status;
  NpyArray array = NpyArray::Zeros(NpyDtypeOf<T>(), std::move(shape));
  if (!array.data.empty()) {
    if (absl::Status status =
            backend.CopyToHost(array.data.data(), source, static_cast<int64_t>(array.data.size()));
        !status.ok()) {
      return status;
    }
  }
  return array;
}

}  // namespace

absl::StatusOr<DevicePool> UploadPool(ComputeBackend& backend, const NpyArray& blocks) {
  DevicePool pool;
  pool.num_blocks = blocks.shape.empty() ? 0 : blocks.shape[0];
  if (absl::Status status =
          CheckCount(kCacheFile, blocks.data.size(), pool.num_blocks * kBlockBytes);
      !status.ok()) {
    return status;
  }
  absl::StatusOr<DeviceBuffer> buffer =
      UploadBytes(backend, blocks.data.data(), static_cast<int64_t>(blocks.data.size()));
  if (!buffer.ok()) return buffer.status();
  pool.buffer = *std::move(buffer);
  return pool;
}

absl::StatusOr<NpyArray> DownloadPool(ComputeBackend& backend, const DevicePool& pool) {
  return Download(backend, pool.buffer.as<const uint8_t>(), {pool.num_blocks, kBlockBytes});
}

absl::StatusOr<DeviceRope> UploadRope(ComputeBackend& backend, const RopeTable& table) {
  DeviceRope rope;
  rope.num_positions = table.num_positions();
  absl::StatusOr<DeviceBuffer> buffer = UploadBytes(backend, table.data(), table.bytes());
  if (!buffer.ok()) return buffer.status();
  rope.buffer = *std::move(buffer);
  return rope;
}

int64_t RopeRowsFor(std::initializer_list<absl::Span<const int32_t>> positions) {
  int64_t largest = 0;
  for (absl::Span<const int32_t> list : positions) {
    for (int32_t position : list) largest = std::max<int64_t>(largest, position);
  }
  return largest + 1;
}

absl::StatusOr<PreparedPrologue> PreparedPrologue::Create(ComputeBackend& backend,
                                                          const HostPrologue& host,
                                                          const DeviceRope& rope,
                                                          const DevicePool& swa_pool,
                                                          const DevicePool& compressed_pool) {
  absl::StatusOr<int> padded_heads = PaddedHeadCount(host.num_heads);
  if (!padded_heads.ok()) return padded_heads.status();
  const int64_t num_tokens = static_cast<int64_t>(host.positions.size());
  for (absl::Status status : {
           CheckCount(kQFile, host.q.size(), num_tokens * host.num_heads * kHeadDim),
           CheckInsertSizes(host.swa, kKvFile, kPositionsFile),
           CheckInsertSizes(host.compressed, kCompressedKvFile, kCompressedRowsFile),
       }) {
    if (!status.ok()) return status;
  }
  // Values are read only once every size is known to be right.
  for (absl::Status status : {
           CheckPositions(kPositionsFile, host.positions.data(), num_tokens, rope.num_positions),
           CheckInsertValues(host.swa, kPositionsFile, kSlotsFile, rope, swa_pool),
           CheckInsertValues(host.compressed,
                             "compressed row positions (compressed_rows.npy "
                             "times the compress ratio)",
                             kCompressedSlotsFile, rope, compressed_pool),
       }) {
    if (!status.ok()) return status;
  }

  PreparedPrologue prepared(backend);
  BufferFiller filler(backend, prepared.buffers_);
  PrologueParams& params = prepared.params_;
  params.num_tokens = num_tokens;
  params.num_heads = host.num_heads;
  params.padded_heads = *padded_heads;
  params.q = filler.Input(host.q);
  params.positions = filler.Input(host.positions);
  params.q_out = filler.Output<uint16_t>(num_tokens * *padded_heads * kHeadDim);
  params.rms_norm_eps = host.rms_norm_eps;
  params.rope = rope.view();
  params.swa = StageInsert(host.swa, swa_pool, filler);
  params.compressed = StageInsert(host.compressed, compressed_pool, filler);
  if (!filler.status().ok()) return filler.status();
  if (absl::Status status = CheckPrologueParams(params); !status.ok()) return status;
  return prepared;
}

absl::StatusOr<NpyArray> PreparedPrologue::QOut() const {
  return Download(*backend_, params_.q_out, {params_.num_tokens, params_.padded_heads, kHeadDim});
}

absl::StatusOr<PreparedDecode> PreparedDecode::Create(ComputeBackend& backend,
                                                      const HostDecode& host,
                                                      const DevicePool& main_pool,
                                                      const DevicePool& extra_pool,
                                                      const DeviceRope* rope) {
  if (host.num_heads < 1 || host.num_heads > host.padded_heads) {
    return absl::InvalidArgumentError(
        absl::StrCat("decode: ", host.num_heads, " heads requested, q has ", host.padded_heads));
  }
  if (host.q.size() % (int64_t{host.padded_heads} * kHeadDim) != 0) {
    return absl::InvalidArgumentError(absl::StrCat(kQFile, ": holds ", host.q.size(),
                                                   " values, not a whole number of tokens of ",
                                                   host.padded_heads, " heads of ", kHeadDim));
  }
  const int64_t num_tokens =
      static_cast<int64_t>(host.q.size()) / (int64_t{host.padded_heads} * kHeadDim);
  if (host.derotate && rope == nullptr) {
    return absl::InvalidArgumentError("decode: de-rotation needs a RoPE table");
  }
  for (absl::Status status : {
           CheckKeyListSizes(host.main, num_tokens, kMainIndicesFile, kMainLengthsFile),
           CheckKeyListSizes(host.extra, num_tokens, kExtraIndicesFile, kExtraLengthsFile),
           host.sinks.empty() ? absl::OkStatus()
                              : CheckCount(kSinksFile, host.sinks.size(), host.num_heads),
           host.derotate ? CheckCount(kPositionsFile, host.positions.size(), num_tokens)
                         : absl::OkStatus(),
       }) {
    if (!status.ok()) return status;
  }
  // Values are read only once every size is known to be right.
  for (absl::Status status : {
           CheckKeyListValues(host.main, num_tokens, kMainIndicesFile, main_pool),
           CheckKeyListValues(host.extra, num_tokens, kExtraIndicesFile, extra_pool),
           host.derotate ? CheckPositions(kPositionsFile, host.positions.data(), num_tokens,
                                          rope->num_positions)
                         : absl::OkStatus(),
       }) {
    if (!status.ok()) return status;
  }

  PreparedDecode prepared(backend);
  BufferFiller filler(backend, prepared.buffers_);
  DecodeParams& params = prepared.params_;
  params.num_tokens = num_tokens;
  params.num_heads = host.num_heads;
  params.padded_heads = host.padded_heads;
  params.q = filler.Input(host.q);
  params.softmax_scale = host.softmax_scale;
  params.sinks = filler.Input(host.sinks);
  params.main = StageKeyList(host.main, main_pool, filler);
  params.extra = StageKeyList(host.extra, extra_pool, filler);
  params.derotate = host.derotate;
  if (host.derotate) {
    params.positions = filler.Input(host.positions);
    params.rope = rope->view();
  }
  params.out = filler.Output<uint16_t>(num_tokens * host.num_heads * kHeadDim);
  if (host.want_lse) params.lse = filler.Output<float>(num_tokens * host.num_heads);
  if (!filler.status().ok()) return filler.status();
  if (absl::Status status = CheckDecodeParams(params); !status.ok()) return status;
  return prepared;
}

absl::StatusOr<NpyArray> PreparedDecode::Out() const {
  return Download(*backend_, params_.out, {params_.num_tokens, params_.num_heads, kHeadDim});
}

absl::StatusOr<NpyArray> PreparedDecode::Lse() const {
  if (params_.lse == nullptr) {
    return absl::FailedPreconditionError("decode: lse was not requested");
  }
  return Download(*backend_, params_.lse, {params_.num_tokens, params_.num_heads});
}

}  // namespace mla

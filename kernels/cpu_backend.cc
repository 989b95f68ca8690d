#include "kernels/cpu_backend.h"

#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <cstring>
#include <limits>
#include <thread>
#include <vector>

#include "absl/strings/str_cat.h"
#include "kernels/bf16.h"
#include "kernels/geometry.h"
#include "kernels/rope.h"
#include "kernels/validation.h"

namespace mla {
namespace {

// Heads that share one pass over a token's keys: each dequantised key row is
// reused by this many heads, and a work item is (token, head group).
constexpr int kHeadGroup = 16;
// Key rows dequantised at a time (32 rows x 2 KiB stays in L1/L2).
constexpr int kChunkRows = 32;

void Bf16RowToFloat(const uint16_t* src, float* dst) {
  for (int d = 0; d < kHeadDim; ++d) dst[d] = Bf16ToFloat(src[d]);
}

void FloatRowToBf16(const float* src, uint16_t* dst) {
  for (int d = 0; d < kHeadDim; ++d) dst[d] = FloatToBf16(src[d]);
}

// 16 independent partial sums: vectorises without reassociating a reduction.
float Dot512(const float* a, const float* b) {
  float lanes[16] = {};
  for (int d = 0; d < kHeadDim; d += 16) {
    for (int l = 0; l < 16; ++l) lanes[l] += a[d + l] * b[d + l];
  }
  float sum = 0.0f;
  for (float lane : lanes) sum += lane;
  return sum;
}

void NormRopeQuery(const uint16_t* q, const float* cos_sin, float eps, uint16_t* q_out) {
  float x[kHeadDim];
  Bf16RowToFloat(q, x);
  float squares = 0.0f;
  for (int d = 0; d < kHeadDim; ++d) squares += x[d] * x[d];
  const float inv_rms = 1.0f / std::sqrt(squares / kHeadDim + eps);
  for (int d = 0; d < kHeadDim; ++d) x[d] *= inv_rms;
  ApplyRope(cos_sin, /*inverse=*/false, x + kNopeDim);
  FloatRowToBf16(x, q_out);
}

void InsertRows(const KvInsertParams& insert, const RopeTableView& rope, ThreadPool& pool) {
  pool.ParallelFor(insert.num_rows, [&](int64_t r) {
    const int64_t slot = insert.slots[r];
    if (slot < 0) return;
    float y[kHeadDim];
    Bf16RowToFloat(insert.rows + r * kHeadDim, y);
    ApplyRope(rope.data + int64_t{insert.positions[r]} * kRopeDim, /*inverse=*/false,
              y + kNopeDim);
    for (int d = 0; d < kHeadDim; ++d) y[d] = RoundToBf16(y[d]);
    QuantizeRow(y, insert.pool.base + SlotDataOffset(slot),
                insert.pool.base + SlotScaleOffset(slot));
  });
}

absl::Status CheckInsertValues(const KvInsertParams& insert, const RopeTableView& rope,
                               absl::string_view name) {
  if (absl::Status status = CheckInsertSlots(absl::StrCat(name, " slots"), insert.slots,
                                             insert.num_rows, insert.pool.num_slots());
      !status.ok()) {
    return status;
  }
  return CheckPositions(absl::StrCat(name, " positions"), insert.positions, insert.num_rows,
                        rope.num_positions);
}

// Per-thread buffers of one decode work item.
struct DecodeScratch {
  std::vector<const uint8_t*> data_rows;
  std::vector<const uint8_t*> scale_rows;
  std::vector<float> q;       // [group, 512]
  std::vector<float> o;       // [group, 512]
  std::vector<float> keys;    // [kChunkRows, 512]
  float scores[kChunkRows];
};

void AppendKeys(const KeyListParams& list, int64_t t, DecodeScratch& scratch) {
  if (list.width == 0) return;
  const int32_t length = list.lengths == nullptr ? list.width : list.lengths[t];
  const int32_t* row = list.indices + t * list.width;
  for (int32_t k = 0; k < length; ++k) {
    if (row[k] == -1) continue;
    scratch.data_rows.push_back(list.pool.base + SlotDataOffset(row[k]));
    scratch.scale_rows.push_back(list.pool.base + SlotScaleOffset(row[k]));
  }
}

// Heads [h0, h1) of token t: one online softmax over both key lists.
void DecodeHeads(const DecodeParams& p, int64_t t, int h0, int h1, DecodeScratch& scratch) {
  const int group = h1 - h0;
  scratch.data_rows.clear();
  scratch.scale_rows.clear();
  AppendKeys(p.main, t, scratch);
  AppendKeys(p.extra, t, scratch);
  const int64_t num_keys = static_cast<int64_t>(scratch.data_rows.size());

  scratch.q.resize(size_t{kHeadDim} * group);
  scratch.o.assign(size_t{kHeadDim} * group, 0.0f);
  scratch.keys.resize(size_t{kHeadDim} * kChunkRows);
  for (int g = 0; g < group; ++g) {
    Bf16RowToFloat(p.q + (t * p.padded_heads + h0 + g) * kHeadDim, &scratch.q[g * kHeadDim]);
  }
  float running_max[kHeadGroup];
  float running_sum[kHeadGroup];
  std::fill_n(running_max, group, -std::numeric_limits<float>::infinity());
  std::fill_n(running_sum, group, 0.0f);

  for (int64_t start = 0; start < num_keys; start += kChunkRows) {
    const int rows = static_cast<int>(std::min<int64_t>(kChunkRows, num_keys - start));
    for (int c = 0; c < rows; ++c) {
      DequantizeRow(scratch.data_rows[start + c], scratch.scale_rows[start + c],
                    &scratch.keys[c * kHeadDim]);
    }
    for (int g = 0; g < group; ++g) {
      const float* q = &scratch.q[g * kHeadDim];
      float chunk_max = running_max[g];
      for (int c = 0; c < rows; ++c) {
        scratch.scores[c] = p.softmax_scale * Dot512(q, &scratch.keys[c * kHeadDim]);
        chunk_max = std::max(chunk_max, scratch.scores[c]);
      }
      const float alpha = std::exp(running_max[g] - chunk_max);
      float* o = &scratch.o[g * kHeadDim];
      for (int d = 0; d < kHeadDim; ++d) o[d] *= alpha;
      float chunk_sum = 0.0f;
      for (int c = 0; c < rows; ++c) {
        const float prob = std::exp(scratch.scores[c] - chunk_max);
        chunk_sum += prob;
        const float* v = &scratch.keys[c * kHeadDim];
        for (int d = 0; d < kHeadDim; ++d) o[d] += prob * v[d];
      }
      running_sum[g] = running_sum[g] * alpha + chunk_sum;
      running_max[g] = chunk_max;
    }
  }

  for (int g = 0; g < group; ++g) {
    const int h = h0 + g;
    float* o = &scratch.o[g * kHeadDim];
    float lse = std::numeric_limits<float>::infinity();
    if (num_keys > 0) {
      lse = running_max[g] + std::log(running_sum[g]);
      const float sink = p.sinks == nullptr ? -std::numeric_limits<float>::infinity() : p.sinks[h];
      const float factor = 1.0f / (running_sum[g] * (1.0f + std::exp(sink - lse)));
      for (int d = 0; d < kHeadDim; ++d) o[d] *= factor;
      if (p.derotate) {
        ApplyRope(p.rope.data + int64_t{p.positions[t]} * kRopeDim, /*inverse=*/true,
                  o + kNopeDim);
      }
    }
    FloatRowToBf16(o, p.out + (t * p.num_heads + h) * kHeadDim);
    if (p.lse != nullptr) p.lse[t * p.num_heads + h] = lse;
  }
}

}  // namespace

CpuBackend::CpuBackend(int num_threads)
    : pool_(num_threads > 0 ? num_threads
                            : std::max(1, static_cast<int>(std::thread::hardware_concurrency()))) {}

std::string CpuBackend::Describe() const {
  return absl::StrCat("cpu (", pool_.num_threads(), " threads)");
}

absl::StatusOr<DeviceBuffer> CpuBackend::Allocate(int64_t bytes) {
  if (bytes < 0) return absl::InvalidArgumentError("cannot allocate a negative size");
  void* data = std::calloc(std::max<int64_t>(bytes, 1), 1);
  if (data == nullptr) {
    return absl::ResourceExhaustedError(absl::StrCat("cannot allocate ", bytes, " bytes"));
  }
  return DeviceBuffer(data, bytes, [](void* ptr) { std::free(ptr); });
}

absl::Status CpuBackend::CopyToDevice(void* device_dst, const void* host_src, int64_t bytes) {
  if (bytes > 0) std::memcpy(device_dst, host_src, bytes);
  return absl::OkStatus();
}

absl::Status CpuBackend::CopyToHost(void* host_dst, const void* device_src, int64_t bytes) {
  if (bytes > 0) std::memcpy(host_dst, device_src, bytes);
  return absl::OkStatus();
}

absl::Status CpuBackend::Prologue(const PrologueParams& p) {
  if (absl::Status status = CheckPrologueParams(p); !status.ok()) return status;
  if (absl::Status status =
          CheckPositions("prologue positions", p.positions, p.num_tokens, p.rope.num_positions);
      !status.ok()) {
    return status;
  }
  if (absl::Status status = CheckInsertValues(p.swa, p.rope, "prologue swa"); !status.ok()) {
    return status;
  }
  if (absl::Status status = CheckInsertValues(p.compressed, p.rope, "prologue compressed");
      !status.ok()) {
    return status;
  }

  pool_.ParallelFor(p.num_tokens, [&](int64_t t) {
    const float* cos_sin = p.rope.data + int64_t{p.positions[t]} * kRopeDim;
    for (int h = 0; h < p.num_heads; ++h) {
      NormRopeQuery(p.q + (t * p.num_heads + h) * kHeadDim, cos_sin, p.rms_norm_eps,
                    p.q_out + (t * p.padded_heads + h) * kHeadDim);
    }
    std::memset(p.q_out + (t * p.padded_heads + p.num_heads) * kHeadDim, 0,
                sizeof(uint16_t) * kHeadDim * (p.padded_heads - p.num_heads));
  });
  InsertRows(p.swa, p.rope, pool_);
  InsertRows(p.compressed, p.rope, pool_);
  return absl::OkStatus();
}

absl::Status CpuBackend::Decode(const DecodeParams& p) {
  if (absl::Status status = CheckDecodeParams(p); !status.ok()) return status;
  if (absl::Status status = CheckKeyIndices("decode main indices", p.main.indices, p.main.lengths,
                                            p.num_tokens, p.main.width, p.main.pool.num_slots());
      !status.ok()) {
    return status;
  }
  if (absl::Status status =
          CheckKeyIndices("decode extra indices", p.extra.indices, p.extra.lengths, p.num_tokens,
                          p.extra.width, p.extra.pool.num_slots());
      !status.ok()) {
    return status;
  }
  if (p.derotate) {
    if (absl::Status status =
            CheckPositions("decode positions", p.positions, p.num_tokens, p.rope.num_positions);
        !status.ok()) {
      return status;
    }
  }

  const int groups = (p.num_heads + kHeadGroup - 1) / kHeadGroup;
  pool_.ParallelFor(p.num_tokens * groups, [&](int64_t item) {
    thread_local DecodeScratch scratch;
    const int64_t t = item / groups;
    const int h0 = static_cast<int>(item % groups) * kHeadGroup;
    DecodeHeads(p, t, h0, std::min(h0 + kHeadGroup, p.num_heads), scratch);
  });
  return absl::OkStatus();
}

}  // namespace mla

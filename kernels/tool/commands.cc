#include "kernels/tool/commands.h"

#include <algorithm>
#include <cstdio>
#include <filesystem>
#include <initializer_list>
#include <limits>
#include <optional>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "kernels/geometry.h"
#include "kernels/head_padding.h"
#include "kernels/rope.h"
#include "kernels/tool/move_into.h"
#include "kernels/tool/npy.h"
#include "kernels/tool/staging.h"
#include "kernels/tool/tool_files.h"
#include "kernels/validation.h"

namespace mla {
namespace {

// Twice V4's 1M-token context; bounds the RoPE table at 512 MiB.
constexpr int64_t kMaxRopePositions = int64_t{1} << 21;
// 4M slots, 2.4 GB: bounds a new pool, which the host must hold.
constexpr int64_t kMaxNewPoolBlocks = int64_t{1} << 16;

std::string PathOf(absl::string_view dir, absl::string_view name) {
  return absl::StrCat(dir, "/", name);
}

bool Exists(absl::string_view dir, absl::string_view name) {
  std::error_code error;
  return std::filesystem::exists(PathOf(dir, name), error);
}

// An input file and what it must hold. `note` explains the fixed sizes of the
// shape, e.g. "N = 4 tokens of q.npy", and ends any message about the file.
struct FileSpec {
  absl::string_view name;
  NpyDtype dtype;
  std::vector<int64_t> shape;
  std::string note;
};

constexpr char kPoolNote[] = "a pool is [num_blocks, 37440] bytes";

absl::StatusOr<NpyArray> Read(absl::string_view dir, const FileSpec& spec) {
  const std::string suffix = spec.note.empty() ? "" : absl::StrCat(" (", spec.note, ")");
  absl::StatusOr<NpyArray> array = ReadNpy(PathOf(dir, spec.name));
  if (absl::IsNotFound(array.status())) {
    return absl::NotFoundError(absl::StrCat(spec.name, ": not found in ", dir, " (--in); expected ",
                                            NpyDtypeText(spec.dtype), " of shape ",
                                            ShapeText(spec.shape), suffix));
  }
  if (!array.ok()) return array.status();
  if (absl::Status status = ConformNpy(spec.name, spec.dtype, spec.shape, *array); !status.ok()) {
    return absl::InvalidArgumentError(absl::StrCat(status.message(), suffix));
  }
  return array;
}

absl::StatusOr<std::optional<NpyArray>> ReadIfPresent(absl::string_view dir, const FileSpec& spec) {
  if (!Exists(dir, spec.name)) return std::nullopt;
  absl::StatusOr<NpyArray> array = Read(dir, spec);
  if (!array.ok()) return array.status();
  return std::optional<NpyArray>(*std::move(array));
}

// Files that only mean something together: true when all are in `dir`,
// false when none is, an error naming the missing ones otherwise.
absl::StatusOr<bool> AllOrNone(absl::string_view dir,
                               std::initializer_list<absl::string_view> names) {
  std::vector<absl::string_view> present, missing;
  for (absl::string_view name : names) (Exists(dir, name) ? present : missing).push_back(name);
  if (missing.empty()) return true;
  if (present.empty()) return false;
  return absl::InvalidArgumentError(absl::StrCat(
      absl::StrJoin(present, ", "), " in ", dir, " also needs ", absl::StrJoin(missing, ", "),
      ": give all of ", absl::StrJoin(names, ", "), " or none"));
}

template <typename T>
absl::Span<const T> ValuesOrEmpty(const std::optional<NpyArray>& array) {
  return array.has_value() ? array->values<T>() : absl::Span<const T>();
}

absl::Status CheckPositionLimit(absl::string_view name, absl::Span<const int32_t> positions) {
  return CheckPositions(name, positions.data(), static_cast<int64_t>(positions.size()),
                        kMaxRopePositions);
}

// Compressed row j of a ratio-r layer is rotated at position j * r.
absl::StatusOr<std::vector<int32_t>> CompressedRowPositions(absl::Span<const int32_t> rows,
                                                            int ratio) {
  std::vector<int32_t> positions(rows.size());
  for (size_t i = 0; i < rows.size(); ++i) {
    const int64_t position = int64_t{rows[i]} * ratio;
    if (rows[i] < 0 || position >= kMaxRopePositions) {
      return absl::InvalidArgumentError(
          absl::StrCat(kCompressedRowsFile, "[", i, "] = ", rows[i],
                       ": a compressed row index j must be in [0, ", kMaxRopePositions / ratio,
                       ") so that its position j * ", ratio, " fits the RoPE table"));
    }
    positions[i] = static_cast<int32_t>(position);
  }
  return positions;
}

// The pool `name` from `dir`, or a new zeroed one of `flag_blocks` blocks
// (0: just enough for the largest of `slots`).
absl::StatusOr<NpyArray> ReadPoolOrNew(absl::string_view dir, absl::string_view name,
                                       int64_t flag_blocks, absl::string_view flag_name,
                                       absl::Span<const int32_t> slots) {
  if (Exists(dir, name)) {
    if (flag_blocks > 0) {
      return absl::InvalidArgumentError(
          absl::StrCat(name, " is in ", dir, ", so ", flag_name,
                       " (the size of a new pool) does not apply: drop the flag or the file"));
    }
    return Read(dir, {name, NpyDtype::kUint8, {kAnyDim, kBlockBytes}, kPoolNote});
  }
  int64_t blocks = flag_blocks;
  std::string sized_by = absl::StrCat(flag_name, "=", flag_blocks);
  if (blocks == 0) {
    int64_t largest = -1;
    for (int32_t slot : slots) largest = std::max<int64_t>(largest, slot);
    blocks = (largest + kBlockTokens) / kBlockTokens;
    sized_by = absl::StrCat("to hold slot ", largest);
  }
  if (blocks > kMaxNewPoolBlocks) {
    return absl::InvalidArgumentError(
        absl::StrCat("a new pool for ", name, " would take ", blocks, " blocks (", sized_by,
                     "); the tool makes pools of up to ", kMaxNewPoolBlocks, " blocks (",
                     kMaxNewPoolBlocks * kBlockTokens, " slots)"));
  }
  return NpyArray::Zeros(NpyDtype::kUint8, {blocks, kBlockBytes});
}

absl::Status WriteOutputs(
    absl::string_view dir,
    std::initializer_list<std::pair<absl::string_view, const NpyArray*>> outputs) {
  std::error_code error;
  std::filesystem::create_directories(std::string(dir), error);
  if (error) {
    return absl::InvalidArgumentError(
        absl::StrCat("cannot create the --out folder ", dir, ": ", error.message()));
  }
  for (const auto& [name, array] : outputs) {
    if (absl::Status status = WriteNpy(PathOf(dir, name), *array); !status.ok()) return status;
  }
  return absl::OkStatus();
}

std::string Described(absl::string_view name, const NpyArray& array) {
  return absl::StrCat(name, " ", ShapeText(array.shape));
}

// Every input of one prologue call, read and checked.
struct PrologueFiles {
  NpyArray q;  // [N, H, 512]
  int num_heads = 0;
  NpyArray positions;
  std::optional<NpyArray> kv, slots;
  std::optional<NpyArray> compressed_kv, compressed_slots;
  std::vector<int32_t> compressed_positions;  // compressed_rows.npy times the ratio
  NpyArray cache;
  NpyArray compressed_cache;  // no blocks when there are no compressed rows

  bool has_compressed() const { return compressed_kv.has_value(); }
};

absl::StatusOr<PrologueFiles> ReadPrologueFiles(const CommandOptions& options) {
  const std::string& dir = options.in_dir;
  PrologueFiles files;
  if (absl::Status status =
          MoveInto(Read(dir, {kQFile, NpyDtype::kUint16, {kAnyDim, kAnyDim, kHeadDim}}), files.q);
      !status.ok()) {
    return status;
  }
  const int64_t num_tokens = files.q.shape[0];
  // Clamped so that a huge head count reports the supported range, not a wrap.
  files.num_heads = static_cast<int>(std::min<int64_t>(files.q.shape[1], kMaxHeads + 1));
  if (absl::Status status = PaddedHeadCount(files.num_heads).status(); !status.ok()) {
    return absl::InvalidArgumentError(absl::StrCat(kQFile, ": ", status.message()));
  }
  const std::string token_note = absl::StrCat("N = ", num_tokens, " tokens of q.npy");
  if (absl::Status status = MoveInto(
          Read(dir, {kPositionsFile, NpyDtype::kInt32, {num_tokens}, token_note}), files.positions);
      !status.ok()) {
    return status;
  }
  if (absl::Status status = CheckPositionLimit(kPositionsFile, files.positions.values<int32_t>());
      !status.ok()) {
    return status;
  }

  absl::StatusOr<bool> has_kv = AllOrNone(dir, {kKvFile, kSlotsFile});
  if (!has_kv.ok()) return has_kv.status();
  if (*has_kv) {
    // Reads that do not depend on each other are listed together: all run,
    // and the first failure in the list is reported.
    for (absl::Status status : {
             MoveInto(Read(dir, {kKvFile, NpyDtype::kUint16, {num_tokens, kHeadDim}, token_note}),
                      files.kv),
             MoveInto(Read(dir, {kSlotsFile, NpyDtype::kInt32, {num_tokens}, token_note}),
                      files.slots),
         }) {
      if (!status.ok()) return status;
    }
  }

  absl::StatusOr<bool> has_compressed =
      AllOrNone(dir, {kCompressedKvFile, kCompressedRowsFile, kCompressedSlotsFile});
  if (!has_compressed.ok()) return has_compressed.status();
  if (*has_compressed && options.layer.compress_ratio == 0) {
    return absl::InvalidArgumentError(absl::StrCat(
        options.layer.Describe(), " has no compressed rows: remove ", kCompressedKvFile,
        " and its companions, or pick a C4A/C128A layer with "
        "--layer"));
  }
  if (*has_compressed) {
    if (absl::Status status =
            MoveInto(Read(dir, {kCompressedKvFile, NpyDtype::kUint16, {kAnyDim, kHeadDim}}),
                     files.compressed_kv);
        !status.ok()) {
      return status;
    }
    const int64_t num_rows = files.compressed_kv->shape[0];
    const std::string row_note = absl::StrCat("M = ", num_rows, " rows of compressed_kv.npy");
    NpyArray rows;
    for (absl::Status status : {
             MoveInto(Read(dir, {kCompressedRowsFile, NpyDtype::kInt32, {num_rows}, row_note}),
                      rows),
             MoveInto(Read(dir, {kCompressedSlotsFile, NpyDtype::kInt32, {num_rows}, row_note}),
                      files.compressed_slots),
         }) {
      if (!status.ok()) return status;
    }
    if (absl::Status status =
            MoveInto(CompressedRowPositions(rows.values<int32_t>(), options.layer.compress_ratio),
                     files.compressed_positions);
        !status.ok()) {
      return status;
    }
  }

  if (absl::Status status =
          MoveInto(ReadPoolOrNew(dir, kCacheFile, options.num_blocks, "--num_blocks",
                                 ValuesOrEmpty<int32_t>(files.slots)),
                   files.cache);
      !status.ok()) {
    return status;
  }
  files.compressed_cache = NpyArray::Zeros(NpyDtype::kUint8, {0, kBlockBytes});
  if (*has_compressed) {
    if (absl::Status status =
            MoveInto(ReadPoolOrNew(dir, kCompressedCacheFile, options.compressed_num_blocks,
                                   "--compressed_num_blocks",
                                   ValuesOrEmpty<int32_t>(files.compressed_slots)),
                     files.compressed_cache);
        !status.ok()) {
      return status;
    }
  }
  return files;
}

// Every input of one decode call, read and checked.
struct DecodeFiles {
  absl::string_view q_name;
  NpyArray q;  // [N, Hp, 512]
  int num_heads = 0;
  NpyArray cache;
  NpyArray main_indices;
  std::optional<NpyArray> main_lengths;
  std::optional<NpyArray> extra_indices, extra_lengths;
  NpyArray compressed_cache;  // no blocks when there is no extra list
  std::optional<NpyArray> sinks;
  std::optional<NpyArray> positions;  // with --derotate
};

// A prologue's --out folder holds q_out.npy: decode takes it as q.npy when no
// q.npy is there, and refuses to guess between the two.
absl::StatusOr<absl::string_view> DecodeQueryFile(absl::string_view dir) {
  if (!Exists(dir, kQOutFile)) return kQFile;
  if (Exists(dir, kQFile)) {
    return absl::InvalidArgumentError(absl::StrCat(
        "both ", kQFile, " and ", kQOutFile, " are in ", dir,
        ": decode reads the prologue's output under either name; remove or rename one"));
  }
  return kQOutFile;
}

absl::StatusOr<DecodeFiles> ReadDecodeFiles(const CommandOptions& options) {
  const std::string& dir = options.in_dir;
  DecodeFiles files;
  if (absl::Status status = MoveInto(DecodeQueryFile(dir), files.q_name); !status.ok()) {
    return status;
  }
  if (absl::Status status =
          MoveInto(Read(dir, {files.q_name,
                              NpyDtype::kUint16,
                              {kAnyDim, kAnyDim, kHeadDim},
                              "a prologue's q_out: N tokens x Hp padded heads x 512"}),
                   files.q);
      !status.ok()) {
    return status;
  }
  const int64_t num_tokens = files.q.shape[0];
  const int64_t padded_heads = files.q.shape[1];
  if (padded_heads > kMaxHeads || !IsSupportedHeadCount(static_cast<int>(padded_heads))) {
    return absl::InvalidArgumentError(absl::StrCat(
        files.q_name, ": has ", padded_heads, " heads; decode takes a prologue's q_out, whose ",
        "head count is ", SupportedHeadCountsText(), ": run the prologue on it first"));
  }
  files.num_heads = options.heads > 0 ? options.heads : static_cast<int>(padded_heads);
  if (files.num_heads > padded_heads) {
    return absl::InvalidArgumentError(absl::StrCat("--heads=", files.num_heads,
                                                   " is more than the ", padded_heads, " heads of ",
                                                   files.q_name));
  }
  const std::string token_note = absl::StrCat("N = ", num_tokens, " tokens of ", files.q_name);
  for (absl::Status status : {
           MoveInto(Read(dir, {kCacheFile, NpyDtype::kUint8, {kAnyDim, kBlockBytes}, kPoolNote}),
                    files.cache),
           MoveInto(
               Read(dir, {kMainIndicesFile, NpyDtype::kInt32, {num_tokens, kAnyDim}, token_note}),
               files.main_indices),
           MoveInto(
               ReadIfPresent(dir, {kMainLengthsFile, NpyDtype::kInt32, {num_tokens}, token_note}),
               files.main_lengths),
           MoveInto(ReadIfPresent(dir, {kSinksFile,
                                        NpyDtype::kFloat32,
                                        {files.num_heads},
                                        absl::StrCat("H = ", files.num_heads,
                                                     " heads output: --heads, or every head of ",
                                                     files.q_name)}),
                    files.sinks),
       }) {
    if (!status.ok()) return status;
  }

  absl::StatusOr<bool> has_extra = AllOrNone(dir, {kExtraIndicesFile, kCompressedCacheFile});
  if (!has_extra.ok()) return has_extra.status();
  if (!*has_extra && Exists(dir, kExtraLengthsFile)) {
    return absl::InvalidArgumentError(absl::StrCat(kExtraLengthsFile, " in ", dir, " needs ",
                                                   kExtraIndicesFile, " and ",
                                                   kCompressedCacheFile));
  }
  files.compressed_cache = NpyArray::Zeros(NpyDtype::kUint8, {0, kBlockBytes});
  if (*has_extra) {
    for (absl::Status status : {
             MoveInto(
                 Read(dir,
                      {kExtraIndicesFile, NpyDtype::kInt32, {num_tokens, kAnyDim}, token_note}),
                 files.extra_indices),
             MoveInto(ReadIfPresent(
                          dir, {kExtraLengthsFile, NpyDtype::kInt32, {num_tokens}, token_note}),
                      files.extra_lengths),
             MoveInto(
                 Read(dir,
                      {kCompressedCacheFile, NpyDtype::kUint8, {kAnyDim, kBlockBytes}, kPoolNote}),
                 files.compressed_cache),
         }) {
      if (!status.ok()) return status;
    }
  }

  if (options.derotate) {
    if (absl::Status status = MoveInto(
            Read(dir, {kPositionsFile,
                       NpyDtype::kInt32,
                       {num_tokens},
                       absl::StrCat(token_note, "; --derotate needs the query positions")}),
            files.positions);
        !status.ok()) {
      return status;
    }
    if (absl::Status status =
            CheckPositionLimit(kPositionsFile, files.positions->values<int32_t>());
        !status.ok()) {
      return status;
    }
  }
  return files;
}

}  // namespace

absl::Status RunPrologueCommand(ComputeBackend& backend, const CommandOptions& options) {
  absl::StatusOr<PrologueFiles> files = ReadPrologueFiles(options);
  if (!files.ok()) return files.status();
  const LayerConfig& layer = options.layer;
  const RopeTable table(layer.rope_kind, RopeRowsFor({files->positions.values<int32_t>(),
                                                      files->compressed_positions}));
  absl::StatusOr<DeviceRope> rope = UploadRope(backend, table);
  if (!rope.ok()) return rope.status();
  absl::StatusOr<DevicePool> swa_pool = UploadPool(backend, files->cache);
  if (!swa_pool.ok()) return swa_pool.status();
  absl::StatusOr<DevicePool> compressed_pool = UploadPool(backend, files->compressed_cache);
  if (!compressed_pool.ok()) return compressed_pool.status();

  HostPrologue host;
  host.num_heads = files->num_heads;
  host.q = files->q.values<uint16_t>();
  host.positions = files->positions.values<int32_t>();
  host.rms_norm_eps = layer.rms_norm_eps;
  if (files->kv.has_value()) {
    host.swa = {files->kv->values<uint16_t>(), host.positions, files->slots->values<int32_t>()};
  }
  if (files->has_compressed()) {
    host.compressed = {files->compressed_kv->values<uint16_t>(), files->compressed_positions,
                       files->compressed_slots->values<int32_t>()};
  }
  absl::StatusOr<PreparedPrologue> prologue =
      PreparedPrologue::Create(backend, host, *rope, *swa_pool, *compressed_pool);
  if (!prologue.ok()) return prologue.status();
  if (absl::Status status = prologue->Run(); !status.ok()) return status;
  NpyArray q_out, cache, compressed_cache;
  for (absl::Status status : {
           MoveInto(prologue->QOut(), q_out),
           MoveInto(DownloadPool(backend, *swa_pool), cache),
           MoveInto(DownloadPool(backend, *compressed_pool), compressed_cache),
       }) {
    if (!status.ok()) return status;
  }

  absl::Status written =
      files->has_compressed()
          ? WriteOutputs(options.out_dir, {{kQOutFile, &q_out},
                                           {kCacheFile, &cache},
                                           {kCompressedCacheFile, &compressed_cache}})
          : WriteOutputs(options.out_dir, {{kQOutFile, &q_out}, {kCacheFile, &cache}});
  if (!written.ok()) return written;
  std::printf("prologue on %s, %s: %lld tokens x %d heads (run at %d); wrote %s, %s%s to %s\n",
              layer.Describe().c_str(), backend.Describe().c_str(),
              static_cast<long long>(files->q.shape[0]), files->num_heads,
              prologue->params().padded_heads, Described(kQOutFile, q_out).c_str(),
              Described(kCacheFile, cache).c_str(),
              files->has_compressed()
                  ? absl::StrCat(", ", Described(kCompressedCacheFile, compressed_cache)).c_str()
                  : "",
              options.out_dir.c_str());
  return absl::OkStatus();
}

absl::Status RunDecodeCommand(ComputeBackend& backend, const CommandOptions& options) {
  absl::StatusOr<DecodeFiles> files = ReadDecodeFiles(options);
  if (!files.ok()) return files.status();
  const LayerConfig& layer = options.layer;
  std::optional<DeviceRope> rope;
  if (options.derotate) {
    const RopeTable table(layer.rope_kind, RopeRowsFor({files->positions->values<int32_t>()}));
    if (absl::Status status = MoveInto(UploadRope(backend, table), rope); !status.ok()) {
      return status;
    }
  }
  absl::StatusOr<DevicePool> main_pool = UploadPool(backend, files->cache);
  if (!main_pool.ok()) return main_pool.status();
  absl::StatusOr<DevicePool> extra_pool = UploadPool(backend, files->compressed_cache);
  if (!extra_pool.ok()) return extra_pool.status();

  HostDecode host;
  host.num_heads = files->num_heads;
  host.padded_heads = static_cast<int>(files->q.shape[1]);
  host.q = files->q.values<uint16_t>();
  host.softmax_scale = layer.softmax_scale;
  host.sinks = ValuesOrEmpty<float>(files->sinks);
  host.main = {static_cast<int>(files->main_indices.shape[1]),
               files->main_indices.values<int32_t>(), ValuesOrEmpty<int32_t>(files->main_lengths)};
  if (files->extra_indices.has_value()) {
    host.extra = {static_cast<int>(files->extra_indices->shape[1]),
                  files->extra_indices->values<int32_t>(),
                  ValuesOrEmpty<int32_t>(files->extra_lengths)};
  }
  host.derotate = options.derotate;
  host.positions = ValuesOrEmpty<int32_t>(files->positions);
  host.want_lse = options.return_lse;
  absl::StatusOr<PreparedDecode> decode = PreparedDecode::Create(
      backend, host, *main_pool, *extra_pool, rope.has_value() ? &*rope : nullptr);
  if (!decode.ok()) return decode.status();
  if (absl::Status status = decode->Run(); !status.ok()) return status;
  NpyArray out, lse;
  for (absl::Status status : {
           MoveInto(decode->Out(), out),
           options.return_lse ? MoveInto(decode->Lse(), lse) : absl::OkStatus(),
       }) {
    if (!status.ok()) return status;
  }

  absl::Status written = options.return_lse
                             ? WriteOutputs(options.out_dir, {{kOutFile, &out}, {kLseFile, &lse}})
                             : WriteOutputs(options.out_dir, {{kOutFile, &out}});
  if (!written.ok()) return written;
  std::printf(
      "decode on %s, %s: %lld tokens x %d heads (q has %d), main width %d, extra width %d%s; "
      "wrote %s%s to %s\n",
      layer.Describe().c_str(), backend.Describe().c_str(),
      static_cast<long long>(files->q.shape[0]), host.num_heads, host.padded_heads, host.main.width,
      host.extra.width, options.derotate ? ", de-rotated" : "", Described(kOutFile, out).c_str(),
      options.return_lse ? absl::StrCat(", ", Described(kLseFile, lse)).c_str() : "",
      options.out_dir.c_str());
  return absl::OkStatus();
}

}  // namespace mla

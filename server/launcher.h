// The launcher of one device: how planned requests run on the compute
// backend (spec sections 4 and 5).
//
// Run() launches one group of Attend plans in four steps: stage (the
// group's host arrays, and q and kv in token order, written in place on a
// host-accessible backend), prologue (the uploads, then one prologue that
// normalises and rotates the queries and writes the new SWA and compressed
// rows), decode (both key lists of every token, sinks, the optional
// de-rotation) and read back (out and lse into host memory). Each step
// returns its failure at once and Run answers the first; the time of each
// step that ran is reported either way (LaunchTimes). Append() writes an
// AppendKV's rows with the same row staging (RowInsert) and one prologue
// without queries per RoPE kind.
//
// After every prologue and decode the launcher waits for the backend,
// failed or not: Synchronize also clears what the backend holds to report,
// and the next request must not get it. It changes no session: the caller
// commits a plan or gives its pages back. It owns the RoPE tables in backend
// memory (made by Create) and a DeviceArena of scratch buffers; the backend
// and the pool's memory must outlive it. Not thread-safe: the engine thread
// owns it.
#ifndef MLA_OFFLOAD_SERVER_LAUNCHER_H_
#define MLA_OFFLOAD_SERVER_LAUNCHER_H_

#include <cstdint>
#include <memory>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "kernels/backend.h"
#include "kernels/cache_format.h"
#include "kernels/rope.h"
#include "server/append_plan.h"
#include "server/attend_plan.h"
#include "server/device_arena.h"
#include "server/packed_arrays.h"
#include "server/row_insert.h"

namespace mla {

// What one group's launch answers: out ([N, H, 512] bf16) then lse
// ([N, H] f32) of the group's N tokens, in the order of its plans, in host
// memory that `memory` keeps alive.
struct GroupAnswer {
  std::shared_ptr<uint8_t[]> memory;
  const uint8_t* out = nullptr;
  const uint8_t* lse = nullptr;
};

// Wall time of each step of a group's launch, in microseconds; 0 for a step
// that did not run. upload: staging (q and kv out of the messages, the key
// lists and sinks) and the host-to-device copies; prologue and decode: the
// launch until the backend is done; readback: out and lse to host memory.
struct LaunchTimes {
  double upload_us = 0;
  double prologue_us = 0;
  double decode_us = 0;
  double readback_us = 0;
};

class Launcher {
 public:
  // Uploads the RoPE tables of positions below `max_position`.
  static absl::StatusOr<std::unique_ptr<Launcher>> Create(ComputeBackend& backend,
                                                          CachePoolView pool,
                                                          int32_t max_position);

  absl::StatusOr<GroupAnswer> Run(const LaunchGroup& group, LaunchTimes& times);
  absl::Status Append(const AppendPlan& plan);

 private:
  class GroupLaunch;

  Launcher(ComputeBackend& backend, CachePoolView pool, int32_t max_position);
  absl::Status UploadRopeTables();
  RopeTableView rope_view(RopeKind kind) const;
  // Waits for the backend's launches (Synchronize) whatever `launched` is,
  // and returns the first failure: launched's, else the wait's.
  absl::Status Drained(const absl::Status& launched);
  // The device's copy of `packed` (one copy).
  absl::StatusOr<uint8_t*> UploadPacked(const PackedArrays& packed);
  // The rows of one RoPE kind of an AppendKV.
  absl::Status AppendPass(const AppendPlan& plan, RopeKind rope);
  // Uploads `packed` and runs a prologue without queries that writes `swa`
  // and `compressed`, two RowInserts of it.
  absl::Status Insert(const PackedArrays& packed, const RowInsert& swa,
                      const RowInsert& compressed, PrologueParams params);

  ComputeBackend& backend_;
  CachePoolView pool_;
  int32_t max_position_;
  DeviceBuffer rope_tables_[2];  // indexed by RopeKind
  DeviceArena arena_;
};

}  // namespace mla

#endif  // MLA_OFFLOAD_SERVER_LAUNCHER_H_

// The launcher of one device: how planned requests run on the compute
// backend (spec sections 4 and 5).
//
// Start() launches one group of Attend plans. On the host it stages
// everything the launch sends (q, kv and the new compressed rows of every
// message in token order, the writes to the sessions' page tables, the
// top-k rows, the sinks) into one pinned buffer, the queries first, whose copy to the
// device starts while the rest is staged; the copies go on the backend's
// copy queue, beside the kernels of the launch before. Then it enqueues,
// without waiting between them: the copy of the rest, and after it (the
// backend's JoinCopies) the table writes and the key lists (built on the
// backend from the page tables, which stay in backend memory between
// launches, server/engine/block_tables.h: the host translates no key to its slot
// and sends only the table entries that changed), one prologue
// (queries normalised and rotated, new SWA and compressed rows written), one
// decode (both key lists of every token, sinks, the optional de-rotation)
// and one copy of out (bf16, or the FP8 output's e4m3 bytes and scales)
// and lse into a pinned answer buffer from the HostBufferPool, which the
// responses are serialised from. Large tensors
// (q above all) are copied into the staging by a few threads at once. On a
// host-accessible backend the staging is the backend's memory and nothing
// is copied to a device, and a launch of one message reads its q and kv
// where they arrived (a received slice, or the client's region) when each
// lies in one piece. Queries the device copies from directly (a pinned
// region, or a CUDA IPC region's device memory) skip the staging; inputs in
// device memory (wire::TensorView::device) are never touched by the host: a
// launch of one message has its kernels read q and kv there, a larger one
// copies them on the device into its staging's device copy (DeviceCopies).
// A plan answered into regions (AttendPlan::answer_regions) has its out
// (and out_scales) and lse written there: by the decode itself when it is
// its launch's only plan and the regions are the backend's kind of memory
// (host memory on a host-accessible backend, aligned as the decode writes
// it; device memory on a device), else copied out of the decode's output
// plan by plan, beside the inline answers. Each step
// returns its failure at once and Start answers the first; the time of each
// step is reported (LaunchTimes: the backend's marks between the steps).
// Append() writes an AppendKV's rows with the same
// row staging (RowInsert) and one prologue without queries per RoPE kind.
//
// Launches are pipelined: Start() stages a group and enqueues its steps,
// and returns before the backend has done them; Finish() waits for that
// launch alone (the backend's mark after its copy out), so one launch's
// staging on the host overlaps the kernels and copies of the one before.
// At most two launches run at once, each staged in its own pinned buffer;
// starting a third first waits for the oldest, and growing a scratch buffer
// first waits for every running launch (Finish still gives their answers).
// A launch that fails to start waits for the backend (Synchronize, which
// also clears what the backend holds to report: the next launch must not
// get it) and is not running; one found failed by Finish leaves that to
// ClearFailure. Append() waits for the running launches first. A launch
// changes no session: the caller commits a plan or gives its pages back,
// and then settles the launch (Settle), which tells the page tables whether
// what it wrote can be trusted.
// The launcher owns the RoPE tables in backend memory (made by Create), a
// DeviceArena of scratch buffers and the answer pool; the backend and the
// pool's memory must outlive it (answers need not); its destructor waits for
// the running launches.
//
// Threads: the engine thread makes every call but Finish, which one other
// thread may make (the engine's finisher) while the engine thread starts the
// next launch.
#ifndef MLA_OFFLOAD_SERVER_ENGINE_LAUNCHER_H_
#define MLA_OFFLOAD_SERVER_ENGINE_LAUNCHER_H_

#include <cstdint>
#include <deque>
#include <memory>
#include <mutex>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "kernels/backend.h"
#include "kernels/cache_format.h"
#include "kernels/rope.h"
#include "kernels/thread_pool.h"
#include "server/engine/append_plan.h"
#include "server/engine/attend_plan.h"
#include "server/engine/block_tables.h"
#include "server/engine/device_arena.h"
#include "server/engine/host_buffer_pool.h"
#include "server/engine/packed_arrays.h"
#include "server/engine/row_insert.h"

namespace mla {

// What one group's launch answers: the out (and out_scales) and lse of each
// plan answered inline, in host memory that `memory` keeps alive.
struct GroupAnswer {
  std::shared_ptr<uint8_t> memory;
  // Per plan, in the group's order: where its out ([T, H, 512] bf16, or
  // e4m3fn in an FP8 group), out_scales ([T, H, 4] UE8M0, FP8 groups only)
  // and lse ([T, H] f32) lie; null for a plan answered into its regions.
  std::vector<const uint8_t*> out;
  std::vector<const uint8_t*> out_scales;
  std::vector<const uint8_t*> lse;
};

// Time of each step of a group's launch, in microseconds; 0 for a step that
// did not run. upload: staging on the host (q, kv, rows, tables, top-k and
// sinks out of the messages) and the copy to the device; prologue: the key
// lists and the prologue; decode; readback: out and lse to host memory. All
// but the staging are the backend's own times (its marks: events on a GPU).
struct LaunchTimes {
  double upload_us = 0;
  double prologue_us = 0;
  double decode_us = 0;
  double readback_us = 0;
};

class Launcher {
 public:
  // Uploads the RoPE tables of positions below `max_position`. Large
  // tensors are staged by the threads of `copiers`, which must outlive the
  // launcher.
  static absl::StatusOr<std::unique_ptr<Launcher>> Create(ComputeBackend& backend,
                                                          CachePoolView pool,
                                                          int32_t max_position,
                                                          ThreadPool& copiers);

  ~Launcher();

  // Stages `group` and enqueues its launch; returns the launch's number,
  // for Finish, before the backend is done with it. `group` (and what it
  // points to) must stay until Finish.
  absl::StatusOr<int64_t> Start(const LaunchGroup& group);
  // Waits for launch `launch` (from Start, not finished yet) and gives its
  // answer and the time of each of its steps.
  absl::StatusOr<GroupAnswer> Finish(int64_t launch, LaunchTimes& times);
  // After a Finish that failed: waits for the running launches and clears
  // the failure the backend holds (the backend's Synchronize). Engine thread.
  absl::Status ClearFailure();
  // Launch `launch` (started, then finished) succeeded or not, once its
  // plans are committed or their pages back. Engine thread.
  void Settle(int64_t launch, bool succeeded) { tables_.Settle(launch, succeeded); }
  // Generations of the page tables' space begun so far (BlockTables).
  int64_t table_generations() const { return tables_.generation(); }
  absl::Status Append(const AppendPlan& plan);

 private:
  class GroupLaunch;

  Launcher(ComputeBackend& backend, CachePoolView pool, int32_t max_position,
           ThreadPool& copiers, BlockTables tables);
  // Waits for the running launches numbered below `before` (each keeps its
  // answer for Finish).
  void WaitForRunning(int64_t before);
  // The arena's `slot`, at least `bytes` of it; waits for every running
  // launch before the slot grows (the old buffer goes).
  absl::StatusOr<uint8_t*> Scratch(DeviceArena::Slot slot, int64_t bytes);
  absl::Status UploadRopeTables();
  RopeTableView rope_view(RopeKind kind) const;
  // Waits for the backend's launches (Synchronize) whatever `launched` is,
  // and returns the first failure: launched's, else the wait's.
  absl::Status Drained(const absl::Status& launched);
  // Gives `packed` the arena's staging memory `slot` for all of its bytes.
  absl::Status Stage(PackedArrays& packed, DeviceArena::Slot slot);
  // The backend's view of the staged `packed`: the staging itself on a
  // host-accessible backend, else the device's copy (the arena's `slot`),
  // of which bytes [from, to) are enqueued to be copied now, on the copy
  // queue when `queued`.
  absl::StatusOr<uint8_t*> UploadStaged(PackedArrays& packed, size_t from, size_t to,
                                        DeviceArena::Slot slot, bool queued);
  // The rows of one RoPE kind of an AppendKV.
  absl::Status AppendPass(const AppendPlan& plan, RopeKind rope);
  // Copies `tensor` to `dst`; a large one in pieces on the copy threads.
  void CopyOut(const wire::TensorView& tensor, uint8_t* dst);
  // Uploads `packed` and runs a prologue without queries that writes `swa`
  // and `compressed`, two RowInserts of it.
  absl::Status Insert(PackedArrays& packed, const RowInsert& swa,
                      const RowInsert& compressed, PrologueParams params);

  ComputeBackend& backend_;
  CachePoolView pool_;
  int32_t max_position_;
  DeviceBuffer rope_tables_[2];  // indexed by RopeKind
  BlockTables tables_;           // the engine thread's
  DeviceArena arena_;
  HostBufferPool answers_;
  // Threads that copy the messages' large tensors into the staging: one
  // memcpy thread moves well under the host's memory bandwidth.
  ThreadPool& copiers_;
  std::mutex running_mutex_;
  // Started and not finished, in the order they started; with running_mutex_.
  std::deque<std::shared_ptr<GroupLaunch>> running_;
  int64_t next_launch_ = 0;  // the engine thread's
};

}  // namespace mla

#endif  // MLA_OFFLOAD_SERVER_ENGINE_LAUNCHER_H_

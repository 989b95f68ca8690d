// Scratch memory of one backend for its launches: one growable buffer per
// use (a slot), reused from launch to launch, so that a launch allocates
// only when it is larger than every one before it. The staging slot holds
// host memory the backend copies from fastest (pinned on a GPU); a launch
// may reuse it because every copy from it has finished before the launch
// after it stages (the launcher waits for the backend at the end of each
// launch).
//
// A buffer grows to what is asked or to twice its size, whichever is more,
// and never shrinks; growing frees the old one, so a pointer from Reserve is valid until the next
// Reserve of the same slot. Allocation failures are the backend's status,
// with the slot as it was. Not thread-safe: the engine thread owns it.
#ifndef MLA_OFFLOAD_SERVER_DEVICE_ARENA_H_
#define MLA_OFFLOAD_SERVER_DEVICE_ARENA_H_

#include <cstdint>

#include "absl/status/statusor.h"
#include "kernels/backend.h"

namespace mla {

class DeviceArena {
 public:
  enum Slot {
    kStaging,  // host (AllocateHost): a launch's PackedArrays (q, kv, rows, arrays)
    kStaged,   // the device's copy of kStaging, without host access
    kQOut,     // the prologue's queries, [N, Hp, 512] bf16
    kOutput,   // the decode's out then lse, without host access
    kNumSlots
  };

  // `backend` must outlive the arena.
  explicit DeviceArena(ComputeBackend& backend) : backend_(backend) {}

  // Backend memory of at least `bytes` for `slot` (host memory from
  // AllocateHost for kStaging); contents undefined.
  absl::StatusOr<uint8_t*> Reserve(Slot slot, int64_t bytes);

 private:
  ComputeBackend& backend_;
  DeviceBuffer buffers_[kNumSlots];
};

}  // namespace mla

#endif  // MLA_OFFLOAD_SERVER_DEVICE_ARENA_H_

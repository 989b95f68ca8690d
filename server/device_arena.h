// Scratch memory of one backend for its launches: one growable buffer per
// use (a slot), reused from launch to launch, so that a launch allocates
// only when it is larger than every one before it. The staging slots hold
// host memory the backend copies from fastest (pinned on a GPU); a launch
// may reuse them because every copy from them has finished before the
// launch after it stages (the launcher waits for the backend after each
// step).
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
    kQ,             // a launch's queries, [N, H, 512] bf16
    kQOut,          // the prologue's queries, [N, Hp, 512] bf16
    kKv,            // a launch's new SWA rows, [N, 512] bf16
    kPackedArrays,  // the device's copy of a launch's PackedArrays
    kOut,           // the decode's out, without host access
    kLse,           // the decode's lse, without host access
    kQStaging,      // host (AllocateHost): q staged for its copy to the device
    kKvStaging,     // host (AllocateHost): kv staged likewise
    kNumSlots
  };

  // `backend` must outlive the arena.
  explicit DeviceArena(ComputeBackend& backend) : backend_(backend) {}

  // Backend memory of at least `bytes` for `slot` (host memory from
  // AllocateHost for the staging slots); contents undefined.
  absl::StatusOr<uint8_t*> Reserve(Slot slot, int64_t bytes);

 private:
  ComputeBackend& backend_;
  DeviceBuffer buffers_[kNumSlots];
};

}  // namespace mla

#endif  // MLA_OFFLOAD_SERVER_DEVICE_ARENA_H_

// Scratch memory of one backend for its launches: one growable buffer per
// use (a slot), reused from launch to launch, so that a launch allocates
// only when it is larger than every one before it. The two staging slots
// hold host memory the backend copies from fastest (pinned on a GPU), one
// for each of two launches that may run at once, and so are their device
// copies (the next launch's is filled on the copy queue while this one's
// kernels read theirs); the launcher reuses one only after the launch that
// staged in it has finished. The other device slots are shared: the backend
// runs kernels in order, so a launch's kernels have read them before the
// next one's write them.
//
// A buffer grows to what is asked or to twice its size, whichever is more,
// and never shrinks; growing frees the old one, so a pointer from Reserve
// is valid until the next Reserve of the same slot that does not Fit (the
// launcher waits for the running launches before it grows a slot).
// Allocation failures are the backend's status, with the slot as it was.
// Not thread-safe: the engine thread owns it.
#ifndef MLA_OFFLOAD_SERVER_ENGINE_DEVICE_ARENA_H_
#define MLA_OFFLOAD_SERVER_ENGINE_DEVICE_ARENA_H_

#include <cstdint>

#include "absl/status/statusor.h"
#include "kernels/backend.h"

namespace mla {

class DeviceArena {
 public:
  enum Slot {
    kStaging0,  // host (AllocateHost): a launch's PackedArrays (q, kv, rows, arrays)
    kStaging1,  // the same, for the launch staged while one in kStaging0 runs
    kStaged0,   // the device's copy of kStaging0, without host access
    kStaged1,   // of kStaging1 (the copy queue fills one while the other is read)
    kQOut,     // the prologue's queries, [N, Hp, 512] bf16
    kOutput,   // the decode's out then lse, without host access
    kNumSlots
  };

  // `backend` must outlive the arena.
  explicit DeviceArena(ComputeBackend& backend) : backend_(backend) {}

  // Backend memory of at least `bytes` for `slot` (host memory from
  // AllocateHost for the staging slots); contents undefined.
  absl::StatusOr<uint8_t*> Reserve(Slot slot, int64_t bytes);
  // Whether Reserve(slot, bytes) keeps the slot's buffer.
  bool Fits(Slot slot, int64_t bytes) const { return buffers_[slot].bytes() >= bytes; }
  static bool IsStaging(Slot slot) { return slot == kStaging0 || slot == kStaging1; }

 private:
  ComputeBackend& backend_;
  DeviceBuffer buffers_[kNumSlots];
};

}  // namespace mla

#endif  // MLA_OFFLOAD_SERVER_ENGINE_DEVICE_ARENA_H_

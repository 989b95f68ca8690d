// For tests of what runs on a scheduler's engine thread: EngineHold queues a
// task that holds the engine thread until the test lets it go, so that
// whatever the test queues meanwhile waits, and every ordering the test
// checks is forced rather than hoped for.
//
// The constructor returns once the engine thread is held; Release (or the
// destructor) lets it go. Not for production code.
#ifndef MLA_OFFLOAD_SERVER_TESTING_ENGINE_HOLD_H_
#define MLA_OFFLOAD_SERVER_TESTING_ENGINE_HOLD_H_

#include <atomic>
#include <future>

#include "server/scheduler.h"

namespace mla {

class EngineHold {
 public:
  explicit EngineHold(Scheduler& scheduler) {
    scheduler.Run([this](Engine&) {
      holding_.set_value();
      released_.get_future().wait();
      return Scheduler::Reply();
    });
    holding_.get_future().wait();
  }
  ~EngineHold() { Release(); }
  EngineHold(const EngineHold&) = delete;
  EngineHold& operator=(const EngineHold&) = delete;

  void Release() {
    if (!released_once_.exchange(true)) released_.set_value();
  }

 private:
  std::promise<void> holding_;
  std::promise<void> released_;
  std::atomic<bool> released_once_{false};
};

}  // namespace mla

#endif  // MLA_OFFLOAD_SERVER_TESTING_ENGINE_HOLD_H_

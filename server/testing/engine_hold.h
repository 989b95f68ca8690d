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
#include <memory>

#include "server/scheduler.h"

namespace mla {

class EngineHold {
 public:
  explicit EngineHold(Scheduler& scheduler) {
    // The task touches nothing of this object: it may be destroyed (after
    // Release) before the task has woken up.
    auto holding = std::make_shared<std::promise<void>>();
    std::future<void> held = holding->get_future();
    std::shared_future<void> released = released_.get_future().share();
    scheduler.Run([holding, released](Engine&) {
      holding->set_value();
      released.wait();
      return Scheduler::Reply();
    });
    held.wait();
  }
  ~EngineHold() { Release(); }
  EngineHold(const EngineHold&) = delete;
  EngineHold& operator=(const EngineHold&) = delete;

  void Release() {
    if (!released_once_.exchange(true)) released_.set_value();
  }

 private:
  std::promise<void> released_;
  std::atomic<bool> released_once_{false};
};

}  // namespace mla

#endif  // MLA_OFFLOAD_SERVER_TESTING_ENGINE_HOLD_H_

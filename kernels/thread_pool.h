// A fixed pool of worker threads for data-parallel loops on the CPU.
//
// ParallelFor(n, fn) runs fn(i) for every i in [0, n), spreading the indices
// over the workers and the calling thread, and returns when all are done.
// One ParallelFor runs at a time per pool (calls from several threads are
// serialised); fn must not call ParallelFor on the same pool.
#ifndef MLA_OFFLOAD_KERNELS_THREAD_POOL_H_
#define MLA_OFFLOAD_KERNELS_THREAD_POOL_H_

#include <atomic>
#include <condition_variable>
#include <cstdint>
#include <functional>
#include <mutex>
#include <thread>
#include <vector>

namespace mla {

class ThreadPool {
 public:
  // num_threads counts the caller: 1 runs everything on the calling thread.
  explicit ThreadPool(int num_threads);
  ~ThreadPool();
  ThreadPool(const ThreadPool&) = delete;
  ThreadPool& operator=(const ThreadPool&) = delete;

  int num_threads() const { return static_cast<int>(workers_.size()) + 1; }

  void ParallelFor(int64_t n, const std::function<void(int64_t)>& fn);

 private:
  void WorkerLoop();
  void RunShare();

  std::vector<std::thread> workers_;
  std::mutex call_mutex_;  // one ParallelFor at a time
  std::mutex mutex_;
  std::condition_variable work_ready_;
  std::condition_variable work_done_;
  const std::function<void(int64_t)>* fn_ = nullptr;
  int64_t n_ = 0;
  std::atomic<int64_t> next_{0};
  int64_t generation_ = 0;
  int busy_workers_ = 0;
  bool stopping_ = false;
};

}  // namespace mla

#endif  // MLA_OFFLOAD_KERNELS_THREAD_POOL_H_

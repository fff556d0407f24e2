#pragma once
// A small fork-join pool: parallel_for splits [0, n) into contiguous ranges, one per worker, and
// blocks until all are done. Owned by whoever needs it (the CPU backend); no global pool.
// Work is split by index range only, so results never depend on the thread count as long as each
// index's computation is itself sequential.
#include <condition_variable>
#include <functional>
#include <mutex>
#include <thread>
#include <vector>

namespace deepinfer {

class ThreadPool {
 public:
  explicit ThreadPool(int threads = 0);  // 0: hardware_concurrency
  ~ThreadPool();
  ThreadPool(const ThreadPool&) = delete;
  ThreadPool& operator=(const ThreadPool&) = delete;

  int size() const { return (int)workers_.size() + 1; }
  // fn(begin, end) over disjoint ranges covering [0, n). Runs inline when n is small.
  void parallel_for(int64_t n, const std::function<void(int64_t, int64_t)>& fn, int64_t min_chunk = 1);

 private:
  void worker_loop(int index);
  std::vector<std::thread> workers_;
  std::mutex mu_;
  std::condition_variable cv_start_, cv_done_;
  const std::function<void(int64_t, int64_t)>* job_ = nullptr;
  int64_t job_n_ = 0;
  int job_parts_ = 0;
  uint64_t generation_ = 0;
  int pending_ = 0;
  bool stop_ = false;
};

}  // namespace deepinfer

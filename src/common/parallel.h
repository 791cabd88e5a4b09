// A fixed set of worker threads that split one loop between them. The vGPU extender scores
// every candidate node for each pod; kube-scheduler waits on that answer, so a decision over
// 1000 nodes is shared between cores as kube-scheduler's own filter and score plugins are
// (its `parallelism`, 16 by default). Workers live as long as the runner: a decision costs two
// wake-ups, not thread starts.
#pragma once

#include <condition_variable>
#include <cstddef>
#include <functional>
#include <mutex>
#include <thread>
#include <vector>

namespace gpulet {

class ParallelFor {
 public:
  // `threads` workers besides the caller (0: the loop runs on the caller alone).
  explicit ParallelFor(int threads);
  ~ParallelFor();
  ParallelFor(const ParallelFor&) = delete;
  ParallelFor& operator=(const ParallelFor&) = delete;

  // Calls body(begin, end) over [0, n) in chunks of at least `grain` items, on the workers and
  // the caller, and returns when every chunk is done. One loop at a time: concurrent callers
  // take turns. body must not throw.
  void Run(size_t n, size_t grain, const std::function<void(size_t, size_t)>& body);

  int threads() const { return static_cast<int>(workers_.size()); }

 private:
  void Work();
  // Takes and runs chunks of the current loop until none is left.
  void Drain();

  std::mutex run_mu_;  // one Run() at a time
  std::mutex mu_;
  std::condition_variable wake_, done_;
  std::vector<std::thread> workers_;
  const std::function<void(size_t, size_t)>* body_ = nullptr;
  size_t n_ = 0, chunk_ = 1, next_ = 0, pending_ = 0;
  uint64_t round_ = 0;
  bool stop_ = false;
};

}  // namespace gpulet

#include "common/parallel.h"

#include <algorithm>

namespace gpulet {

ParallelFor::ParallelFor(int threads) {
  for (int i = 0; i < threads; ++i) workers_.emplace_back([this] { Work(); });
}

ParallelFor::~ParallelFor() {
  {
    std::lock_guard<std::mutex> l(mu_);
    stop_ = true;
  }
  wake_.notify_all();
  for (std::thread& t : workers_) t.join();
}

void ParallelFor::Run(size_t n, size_t grain, const std::function<void(size_t, size_t)>& body) {
  if (n == 0) return;
  const size_t parts = std::min(workers_.size() + 1,
                                (n + std::max<size_t>(grain, 1) - 1) / std::max<size_t>(grain, 1));
  if (parts <= 1) {
    body(0, n);
    return;
  }
  std::lock_guard<std::mutex> run(run_mu_);
  {
    std::lock_guard<std::mutex> l(mu_);
    body_ = &body;
    n_ = n;
    // A few chunks per thread, so a thread that was descheduled does not hold up the rest.
    chunk_ = std::max<size_t>(1, n / (parts * 4));
    next_ = 0;
    pending_ = (n + chunk_ - 1) / chunk_;
    ++round_;
  }
  wake_.notify_all();
  Drain();
  std::unique_lock<std::mutex> l(mu_);
  done_.wait(l, [&] { return pending_ == 0; });
  body_ = nullptr;
}

void ParallelFor::Drain() {
  while (true) {
    size_t begin, end;
    const std::function<void(size_t, size_t)>* body;
    {
      std::lock_guard<std::mutex> l(mu_);
      if (body_ == nullptr || next_ >= n_) return;
      begin = next_;
      end = next_ = std::min(n_, next_ + chunk_);
      body = body_;
    }
    (*body)(begin, end);
    std::lock_guard<std::mutex> l(mu_);
    if (--pending_ == 0) done_.notify_all();
  }
}

void ParallelFor::Work() {
  uint64_t seen = 0;
  while (true) {
    {
      std::unique_lock<std::mutex> l(mu_);
      wake_.wait(l, [&] { return stop_ || round_ != seen; });
      if (stop_) return;
      seen = round_;
    }
    Drain();
  }
}

}  // namespace gpulet

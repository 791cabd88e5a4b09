// ParallelFor: every index runs exactly once, for any thread count, grain and loop size, and
// concurrent callers take turns without losing work.
#include "common/parallel.h"

#include <gtest/gtest.h>

#include <atomic>
#include <thread>
#include <vector>

namespace gpulet {
namespace {

TEST(ParallelFor, EveryIndexOnce) {
  for (int threads : {0, 1, 3}) {
    ParallelFor pf(threads);
    EXPECT_EQ(pf.threads(), threads);
    for (size_t n : {0u, 1u, 7u, 64u, 1000u, 4097u}) {
      for (size_t grain : {0u, 1u, 64u}) {
        std::vector<std::atomic<int>> hits(n);
        pf.Run(n, grain, [&](size_t b, size_t e) {
          ASSERT_LE(b, e);
          ASSERT_LE(e, n);
          for (size_t i = b; i < e; ++i) hits[i]++;
        });
        for (size_t i = 0; i < n; ++i)
          ASSERT_EQ(hits[i].load(), 1) << threads << " " << n << " " << i;
      }
    }
  }
}

TEST(ParallelFor, ConcurrentCallersTakeTurns) {
  ParallelFor pf(2);
  std::atomic<long> sum{0};
  std::vector<std::thread> callers;
  for (int c = 0; c < 4; ++c) {
    callers.emplace_back([&] {
      for (int r = 0; r < 50; ++r) {
        pf.Run(300, 8, [&](size_t b, size_t e) {
          for (size_t i = b; i < e; ++i) sum += static_cast<long>(i);
        });
      }
    });
  }
  for (auto& t : callers) t.join();
  EXPECT_EQ(sum.load(), 4L * 50 * (299L * 300 / 2));
}

}  // namespace
}  // namespace gpulet

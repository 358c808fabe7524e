// The sparse decode kernel's launch order of query rows when lengths differ
// (src/cuda/attention/sparse_decode/launch_order.h): a permutation, longest first with ties by
// index, and — the point of it — a wave makespan near the balanced ideal on FlashMLA's CONFIG3
// shape where index order is far from it.
#include <gtest/gtest.h>

#include <algorithm>
#include <functional>
#include <numeric>
#include <queue>
#include <random>
#include <vector>

#include "cuda/attention/sparse_decode/launch_order.h"

namespace {

using dsv4::cuda::decode::launch_rank;

std::vector<int> ranks(const std::vector<int>& len) {
  std::vector<int> r(len.size());
  for (size_t i = 0; i < len.size(); ++i) r[i] = launch_rank(len.data(), static_cast<int>(len.size()), static_cast<int>(i));
  return r;
}

TEST(DecodeLaunchOrder, IsTheStableDescendingSort) {
  std::mt19937 rng(7);
  for (int n : {1, 2, 3, 17, 128, 256}) {
    for (int trial = 0; trial < 20; ++trial) {
      std::vector<int> len(n);
      // Few distinct values on some trials, so ties are common.
      const int spread = trial % 2 ? 4 : 1152;
      for (int& v : len) v = static_cast<int>(rng() % spread);
      std::vector<int> expected(n);  // batch at each launch position
      std::iota(expected.begin(), expected.end(), 0);
      std::stable_sort(expected.begin(), expected.end(), [&](int a, int b) { return len[a] > len[b]; });
      const std::vector<int> r = ranks(len);
      std::vector<int> at(n, -1);
      for (int i = 0; i < n; ++i) {
        ASSERT_GE(r[i], 0);
        ASSERT_LT(r[i], n);
        ASSERT_EQ(at[r[i]], -1) << "two batches at launch position " << r[i];
        at[r[i]] = i;
      }
      EXPECT_EQ(at, expected) << "n " << n << " trial " << trial;
    }
  }
}

// CTAs dispatched in launch order onto `slots` free SMs (each takes the next CTA when it is
// done): the finish time of the last one.
double makespan(const std::vector<double>& work_in_launch_order, int slots) {
  std::priority_queue<double, std::vector<double>, std::greater<double>> free_at;
  for (int s = 0; s < slots; ++s) free_at.push(0.0);
  double end = 0.0;
  for (double w : work_in_launch_order) {
    const double t = free_at.top() + w;
    free_at.pop();
    free_at.push(t);
    end = std::max(end, t);
  }
  return end;
}

TEST(DecodeLaunchOrder, BringsConfig3NearTheBalancedIdeal) {
  // FlashMLA's CONFIG3: b 128, s_q 2, H 64 (one CTA per row on 132 SMs), 128 main keys, extra
  // lengths uniform in [0, 1024]; a CTA costs one tile-time of overhead plus one per 64 keys.
  std::mt19937 rng(3);
  const int b = 128, s_q = 2, sms = 132;
  for (int trial = 0; trial < 5; ++trial) {
    std::vector<int> len(b);
    for (int& v : len) v = 128 + static_cast<int>(rng() % 1025);
    auto cost = [&](int batch) { return 1.0 + (len[batch] + 63) / 64; };
    std::vector<double> by_index, ordered(b * s_q);
    const std::vector<int> r = ranks(len);
    for (int batch = 0; batch < b; ++batch)
      for (int s = 0; s < s_q; ++s) {
        by_index.push_back(cost(batch));
        ordered[r[batch] * s_q + s] = cost(batch);
      }
    const double ideal = std::accumulate(by_index.begin(), by_index.end(), 0.0) / sms;
    const double plain = makespan(by_index, sms), longest_first = makespan(ordered, sms);
    // Index order is 1.4-1.6x the ideal on this shape; longest first within 10 % of it.
    EXPECT_GT(plain / ideal, 1.3) << "trial " << trial;
    EXPECT_LT(longest_first / ideal, 1.1) << "trial " << trial;
  }
}

}  // namespace

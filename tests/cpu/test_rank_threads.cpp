// RankThreads (src/layer/rank_threads.h), the host threads of tensor-parallel ranks: every rank's
// work runs at once (a collective that needs all ranks completes), rank 0 on the caller's thread,
// the threads are reused across runs, and a rank's exception reaches the caller after every rank
// has returned.
#include <gtest/gtest.h>

#include <atomic>
#include <stdexcept>
#include <thread>
#include <vector>

#include "dsv4/communicator.h"
#include "dsv4/status.h"
#include "layer/rank_threads.h"

namespace {

TEST(RankThreads, RunsEveryRankAtOnceRankZeroOnTheCaller) {
  constexpr int kRanks = 4;
  dsv4::RankThreads threads(kRanks);
  EXPECT_EQ(threads.size(), kRanks);
  EXPECT_EQ(threads.device(0), -1);  // host ranks
  auto group = dsv4::make_in_process_group(kRanks);
  std::vector<std::thread::id> ids(kRanks);
  for (int run = 0; run < 3; ++run) {
    std::vector<dsv4::HostTensor> t;
    for (int r = 0; r < kRanks; ++r) {
      t.emplace_back(dsv4::DType::fp32, std::vector<int64_t>{2});
      t.back().data<float>()[0] = static_cast<float>(r + run);
      t.back().data<float>()[1] = 1.0f;
    }
    // The in-process all-reduce returns only once every rank has called it: it would never
    // return if the ranks ran one after another.
    threads.run([&](int r) {
      group[static_cast<size_t>(r)]->allreduce_sum(t[static_cast<size_t>(r)], nullptr);
      const std::thread::id me = std::this_thread::get_id();
      if (run == 0) ids[static_cast<size_t>(r)] = me;
      else EXPECT_EQ(ids[static_cast<size_t>(r)], me) << "rank " << r << " moved to another thread";
    });
    for (int r = 0; r < kRanks; ++r) {
      EXPECT_EQ(t[static_cast<size_t>(r)].data<float>()[0], 6.0f + 4 * run);
      EXPECT_EQ(t[static_cast<size_t>(r)].data<float>()[1], 4.0f);
    }
  }
  EXPECT_EQ(ids[0], std::this_thread::get_id());
  for (int r = 1; r < kRanks; ++r) EXPECT_NE(ids[static_cast<size_t>(r)], ids[0]);
}

TEST(RankThreads, TheLowestRanksExceptionReachesTheCallerAfterEveryRankReturned) {
  dsv4::RankThreads threads(3);
  std::atomic<int> returned{0};
  try {
    threads.run([&](int r) {
      ++returned;
      if (r >= 1) throw std::runtime_error("rank " + std::to_string(r));
    });
    FAIL() << "no exception";
  } catch (const std::runtime_error& e) {
    EXPECT_STREQ(e.what(), "rank 1");
  }
  EXPECT_EQ(returned.load(), 3);
  int ran = 0;
  threads.run([&](int r) {  // usable again after a failed run
    if (r == 0) ran = 1;
  });
  EXPECT_EQ(ran, 1);
}

TEST(RankThreads, OneRankRunsOnTheCallerAlone) {
  dsv4::RankThreads threads(1);
  std::thread::id id;
  threads.run([&](int) { id = std::this_thread::get_id(); });
  EXPECT_EQ(id, std::this_thread::get_id());
}

TEST(RankThreads, BadArgumentsAreRefusedNamingThem) {
  EXPECT_THROW(dsv4::RankThreads(0), dsv4::Error);
  try {
    dsv4::RankThreads threads(2, {0});
    FAIL() << "no exception";
  } catch (const dsv4::Error& e) {
    EXPECT_NE(std::string(e.what()).find("devices"), std::string::npos) << e.what();
  }
}

}  // namespace

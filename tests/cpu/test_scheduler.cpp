// The continuous-batching scheduler of `dsv4 run` (tools/dsv4/scheduler.h) against a model of a
// layer's caches built from the library's own PagedCache: a recycling SWA-like cache and a state
// ring. Every planned step must pass the library's pre-step capacity check; every request must
// compute each of its positions in order, once per life, and finish.
#include <gtest/gtest.h>

#include <map>
#include <memory>
#include <string>
#include <vector>

#include "dsv4/paged_cache.h"
#include "dsv4/status.h"
#include "scheduler.h"

namespace {

using dsv4::PagedCache;
using dsv4::RequestStep;
using dsv4::cli::KvCapacity;
using dsv4::cli::Scheduler;
using dsv4::cli::SchedulerOptions;
using dsv4::cli::StepSchedule;

int64_t ceil_div(int64_t a, int64_t b) { return (a + b - 1) / b; }

// Three pools, as in a compressed layer: "window" (an entry per token, blocks of 4, keeps the last
// `window` entries and recycles older blocks), "compressed" (an entry per 4 tokens, blocks of 2,
// keeps everything: it grows with the sequence) and "ring" (2 blocks reserved per request on its
// first step).
class FakeKv final : public KvCapacity {
 public:
  FakeKv(int32_t window_blocks, int32_t compressed_blocks, int32_t ring_blocks, int64_t window)
      : caches_{make("window", 4, window_blocks, window), make("compressed", 2, compressed_blocks, 0),
                make("ring", 2, ring_blocks, 0)} {}

  int num_pools() const override { return 3; }
  std::string pool_name(int p) const override { return caches_[p]->spec().name; }
  int64_t total_blocks(int p) const override { return caches_[p]->pool().num_blocks(); }
  int64_t free_blocks(int p) const override { return caches_[p]->pool().num_free(); }
  int64_t step_blocks(int p, int64_t context, int64_t n) const override {
    if (p == 2) return context == 0 ? 2 : 0;
    const int64_t per = p == 0 ? 1 : 4, bs = caches_[p]->spec().block_size;
    return ceil_div((context + n) / per, bs) - ceil_div(context / per, bs);
  }
  bool grows(int p) const override { return p != 2; }
  int64_t held_blocks(int p, int64_t req) const override {
    if (!caches_[p]->has_request(req)) return 0;
    int64_t n = 0;
    for (int32_t b : caches_[p]->block_table(req)) n += b >= 0;
    return n;
  }

  // Runs a step on the caches the way a layer does: the capacity check first (throws if the
  // scheduler over-committed), then the appends.
  void apply(const std::vector<RequestStep>& steps) {
    std::vector<std::pair<int64_t, int64_t>> growth, entries;
    int64_t new_rings = 0;
    for (const RequestStep& s : steps) {
      growth.push_back({s.context, s.context + s.num_new});
      entries.push_back({s.context / 4, (s.context + s.num_new) / 4});
      if (!ring().has_request(s.req_id)) new_rings += 2;
    }
    dsv4::require_blocks_for_growth("FakeKv", *caches_[0], growth);
    dsv4::require_blocks_for_growth("FakeKv", *caches_[1], entries);
    if (new_rings > ring().pool().num_free()) dsv4::fail("FakeKv: ring cache exhausted");
    for (const RequestStep& s : steps) {
      if (!ring().has_request(s.req_id)) {
        ASSERT_EQ(s.context, 0) << "request " << s.req_id;
        for (auto& c : caches_) c->add_request(s.req_id);
        ring().append(s.req_id, 4);
      }
      ASSERT_EQ(caches_[0]->num_entries(s.req_id), s.context) << "request " << s.req_id;
      caches_[0]->append(s.req_id, s.num_new);
      caches_[1]->append(s.req_id, (s.context + s.num_new) / 4 - s.context / 4);
    }
  }
  void release(int64_t req) {
    for (auto& c : caches_) c->remove_request(req);
  }
  int64_t resident() const {
    int64_t n = 0;
    for (int64_t r = 0; r < 1000; ++r) n += caches_[0]->has_request(r);
    return n;
  }

 private:
  static std::unique_ptr<PagedCache> make(const char* name, int bs, int32_t blocks, int64_t retain) {
    dsv4::CacheSpec spec;
    spec.name = name;
    spec.block_size = bs;
    spec.block_bytes = 16;
    spec.num_blocks = blocks;
    spec.retain = retain;
    return std::make_unique<PagedCache>(spec);
  }
  PagedCache& ring() { return *caches_[2]; }
  std::unique_ptr<PagedCache> caches_[3];
};

struct Req {
  int64_t prompt, decode;
};

struct RunLog {
  std::vector<StepSchedule> steps;
  dsv4::cli::SchedulerStats stats;
  int64_t tokens = 0;
};

// Drives the scheduler to the end, checking every step against an independent mirror of each
// request: contexts continue where the request's caches stand, positions past the prompt come
// one at a time after their predecessor, the budget holds. With `roomy` (no request is ever
// short of blocks) every ready decode is also served before any prefill chunk.
RunLog drive(const SchedulerOptions& opts, FakeKv& kv, const std::vector<Req>& reqs, bool roomy = false) {
  Scheduler s(opts);
  struct Mirror {
    int64_t computed = 0, high = 0;
    bool running = false, finished = false;
  };
  std::vector<Mirror> m(reqs.size());
  for (size_t i = 0; i < reqs.size(); ++i) s.add_request(static_cast<int64_t>(i), reqs[i].prompt, reqs[i].decode);
  RunLog log;
  for (int guard = 0; !s.done(); ++guard) {
    if (guard > 100000) {
      ADD_FAILURE() << "no end";
      break;
    }
    std::vector<int64_t> decode_ready;  // running, next position is one past what is cached
    for (size_t i = 0; i < m.size(); ++i)
      if (m[i].running && m[i].computed >= reqs[i].prompt && m[i].computed == m[i].high)
        decode_ready.push_back(static_cast<int64_t>(i));
    const StepSchedule st = s.schedule(kv);
    for (int64_t id : st.preempted) {
      EXPECT_TRUE(m[id].running) << id;
      kv.release(id);
      m[id].computed = 0;
      m[id].running = false;
    }
    int64_t tokens = 0;
    bool has_chunk = false;
    for (const RequestStep& r : st.steps) {
      Mirror& q = m[r.req_id];
      EXPECT_FALSE(q.finished) << r.req_id;
      EXPECT_EQ(r.context, q.computed) << r.req_id;
      EXPECT_GE(r.num_new, 1);
      // Known positions: the prompt, then one past the furthest computed (its sampled token).
      const int64_t known = std::min(reqs[r.req_id].prompt + reqs[r.req_id].decode,
                                     std::max(reqs[r.req_id].prompt, q.high + 1));
      EXPECT_LE(r.context + r.num_new, known) << "request " << r.req_id << " runs ahead of its tokens";
      tokens += r.num_new;
      has_chunk |= !r.is_decode();
    }
    EXPECT_LE(tokens, opts.token_budget);
    if (roomy && has_chunk)
      for (int64_t id : decode_ready) {
        bool served = false;
        for (const RequestStep& r : st.steps) served |= r.req_id == id;
        EXPECT_TRUE(served) << "decode of request " << id << " skipped for a prefill chunk";
      }
    if (st.steps.empty()) {
      EXPECT_FALSE(st.preempted.empty());
      continue;
    }
    EXPECT_NO_THROW(kv.apply(st.steps));
    if (opts.max_running > 0) {
      EXPECT_LE(kv.resident(), opts.max_running);
    }
    for (const RequestStep& r : st.steps) {
      Mirror& q = m[r.req_id];
      q.running = true;
      q.computed += r.num_new;
      q.high = std::max(q.high, q.computed);
    }
    for (int64_t id : s.complete(st)) {
      EXPECT_EQ(m[id].computed, reqs[id].prompt + reqs[id].decode) << id;
      m[id].finished = true;
      m[id].running = false;
      kv.release(id);
    }
    log.tokens += tokens;
    log.steps.push_back(st);
  }
  for (size_t i = 0; i < m.size(); ++i) EXPECT_TRUE(m[i].finished) << "request " << i;
  EXPECT_EQ(s.num_finished(), static_cast<int64_t>(reqs.size()));
  int64_t positions = 0;
  for (const Req& r : reqs) positions += r.prompt + r.decode;
  EXPECT_EQ(s.progress_tokens(), positions);
  EXPECT_EQ(log.tokens, positions + s.stats().recomputed_tokens);
  log.stats = s.stats();
  return log;
}

const std::vector<Req> kMixed = {{30, 5}, {9, 12}, {50, 3}, {1, 7}, {17, 0}, {26, 9}, {40, 4}, {8, 8}};

TEST(Scheduler, RoomyCacheRunsEveryoneWithoutWaiting) {
  {
    FakeKv kv(1000, 1000, 100, 8);
    const RunLog log = drive({/*token_budget=*/256, 0, 0.01}, kv, kMixed, /*roomy=*/true);
    EXPECT_EQ(log.stats.waited_requests, 0);
    EXPECT_EQ(log.stats.preemptions, 0);
    EXPECT_EQ(log.stats.recomputed_tokens, 0);
    EXPECT_EQ(log.stats.peak_running, 8);  // all admitted by the first step
    EXPECT_EQ(log.steps[0].steps.size(), 8u);
  }
  // First come first served while the budget lasts: the first step is request 0's first chunk.
  FakeKv kv(1000, 1000, 100, 8);
  const RunLog log = drive({/*token_budget=*/16, 0, 0.01}, kv, kMixed, /*roomy=*/true);
  EXPECT_EQ(log.stats.waited_requests, 0);
  EXPECT_EQ(log.stats.preemptions, 0);
  const auto& first = log.steps[0].steps;
  ASSERT_EQ(first.size(), 1u);
  EXPECT_EQ(first[0].req_id, 0);
  EXPECT_EQ(first[0].num_new, 16);
}

// Every pool size from about the least one request needs up: the invariants drive() checks hold
// and everyone finishes, whatever mix of queueing and preemption the sizes cause.
TEST(Scheduler, EveryPoolSizeFinishes) {
  int64_t preemptions = 0, waited = 0;
  for (int w : {16, 20, 24})
    for (int c : {7, 8, 10, 12, 14, 20})
      for (int r : {4, 8, 100}) {
        SCOPED_TRACE("window " + std::to_string(w) + ", compressed " + std::to_string(c) + ", ring " + std::to_string(r));
        FakeKv kv(w, c, r, 8);
        const RunLog log = drive({24, 0, 0.01}, kv, kMixed);
        preemptions += log.stats.preemptions;
        waited += log.stats.waited_requests;
      }
  // The sweep exercised both (the least sizes preempt on every other step).
  EXPECT_GT(preemptions, 20);
  EXPECT_GT(waited, 20);
}

TEST(Scheduler, TinyCacheQueuesAndPreemptsYetFinishesEveryone) {
  // Window 8 (2 blocks + growth), so about 3 requests fit at once; the ring pool allows 4.
  FakeKv kv(16, 10, 8, 8);
  const RunLog log = drive({/*token_budget=*/24, 0, 0.01}, kv, kMixed);
  EXPECT_GT(log.stats.waited_requests, 0);
  EXPECT_GT(log.stats.preemptions, 0);
  EXPECT_GT(log.stats.preempted_requests, 0);
  EXPECT_GT(log.stats.recomputed_tokens, 0);
  EXPECT_LE(log.stats.peak_running, 4);
}

TEST(Scheduler, RingPoolAloneLimitsAdmission) {
  FakeKv kv(1000, 1000, 6, 8);  // three rings
  const RunLog log = drive({/*token_budget=*/64, 0, 0.0}, kv, kMixed);
  EXPECT_EQ(log.stats.peak_running, 3);
  EXPECT_GT(log.stats.waited_requests, 0);
  EXPECT_EQ(log.stats.preemptions, 0);  // rings never grow: no running request is ever short
}

// The watermark keeps admissions off the last blocks of pools running requests grow into...
TEST(Scheduler, WatermarkHoldsBackAdmissionsInGrowingPools) {
  const std::vector<Req> reqs(10, Req{8, 0});  // 2 window blocks each, none recycled
  FakeKv roomy(20, 1000, 100, 0), kept(20, 1000, 100, 0);
  EXPECT_EQ(drive({1000, 0, 0.0}, roomy, reqs).stats.peak_running, 10);
  const RunLog log = drive({1000, 0, 0.25}, kept, reqs);  // 5 blocks kept free after the first
  EXPECT_EQ(log.stats.peak_running, 7);
  EXPECT_EQ(log.stats.waited_requests, 1);  // the queue head; the rest fit once the first 7 finish
}

// ...but not off fixed reservations: a ring pool sized for every request admits every request.
TEST(Scheduler, WatermarkSparesFixedRings) {
  FakeKv kv(10000, 10000, 100, 8);  // rings for exactly 50 requests
  const RunLog log = drive({1000, 0, 0.05}, kv, std::vector<Req>(50, Req{4, 1}));
  EXPECT_EQ(log.stats.peak_running, 50);
  EXPECT_EQ(log.stats.waited_requests, 0);
}

TEST(Scheduler, MaxRunningCapsAdmission) {
  FakeKv kv(1000, 1000, 100, 8);
  const RunLog log = drive({/*token_budget=*/64, /*max_running=*/2, 0.01}, kv, kMixed, /*roomy=*/true);
  EXPECT_EQ(log.stats.peak_running, 2);
  EXPECT_EQ(log.stats.waited_requests, 0);  // waiting for a slot is not waiting for cache
  for (const StepSchedule& st : log.steps) EXPECT_LE(st.steps.size(), 2u);
}

TEST(Scheduler, TokenBudgetOfOneStillFinishes) {
  FakeKv kv(20, 100, 8, 8);
  drive({/*token_budget=*/1, 0, 0.01}, kv, {{5, 3}, {2, 2}, {7, 0}});
}

TEST(Scheduler, ScheduleIsDeterministic) {
  FakeKv a(16, 10, 8, 8), b(16, 10, 8, 8);
  const RunLog x = drive({24, 0, 0.01}, a, kMixed), y = drive({24, 0, 0.01}, b, kMixed);
  ASSERT_EQ(x.steps.size(), y.steps.size());
  for (size_t i = 0; i < x.steps.size(); ++i) {
    ASSERT_EQ(x.steps[i].steps.size(), y.steps[i].steps.size()) << "step " << i;
    EXPECT_EQ(x.steps[i].preempted, y.steps[i].preempted) << "step " << i;
    for (size_t j = 0; j < x.steps[i].steps.size(); ++j) {
      EXPECT_EQ(x.steps[i].steps[j].req_id, y.steps[i].steps[j].req_id);
      EXPECT_EQ(x.steps[i].steps[j].num_new, y.steps[i].steps[j].num_new);
    }
  }
}

TEST(Scheduler, CacheTooSmallForOneRequestIsAClearError) {
  FakeKv kv(3, 100, 8, 0);  // no recycling: a 20-token request needs 5 blocks
  Scheduler s({64, 0, 0.0});
  s.add_request(0, 20, 0);
  StepSchedule st = s.schedule(kv);  // admitted with a chunk shrunk to 12 tokens
  ASSERT_EQ(st.steps.size(), 1u);
  EXPECT_EQ(st.steps[0].num_new, 12);
  kv.apply(st.steps);
  s.complete(st);
  try {
    s.schedule(kv);
    FAIL() << "expected dsv4::Error";
  } catch (const dsv4::Error& e) {
    const std::string msg = e.what();
    EXPECT_NE(msg.find("too small"), std::string::npos) << msg;
    EXPECT_NE(msg.find("'window'"), std::string::npos) << msg;
  }
}

TEST(Scheduler, BadArgumentsAreErrors) {
  EXPECT_THROW(Scheduler({0, 0, 0.01}), dsv4::Error);
  EXPECT_THROW(Scheduler({8, -1, 0.01}), dsv4::Error);
  EXPECT_THROW(Scheduler({8, 0, 1.0}), dsv4::Error);
  Scheduler s({8, 0, 0.01});
  EXPECT_THROW(s.add_request(0, 0, 1), dsv4::Error);
  EXPECT_THROW(s.add_request(0, 4, -1), dsv4::Error);
  s.add_request(0, 4, 1);
  EXPECT_THROW(s.add_request(0, 4, 1), dsv4::Error);
}

TEST(Scheduler, PercentileIsNearestRank) {
  std::vector<double> v;
  for (int i = 100; i >= 1; --i) v.push_back(i);
  EXPECT_EQ(dsv4::cli::percentile(v, 50), 50);
  EXPECT_EQ(dsv4::cli::percentile(v, 99), 99);
  EXPECT_EQ(dsv4::cli::percentile(v, 100), 100);
  EXPECT_EQ(dsv4::cli::percentile({7}, 99), 7);
  EXPECT_EQ(dsv4::cli::percentile({3, 1}, 50), 1);
  EXPECT_EQ(dsv4::cli::percentile({}, 50), 0);
  EXPECT_THROW(dsv4::cli::percentile({1}, 0), dsv4::Error);
}

}  // namespace

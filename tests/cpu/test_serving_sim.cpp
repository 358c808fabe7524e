// `dsv4 run`'s serving loop (tools/dsv4/serving_sim.h) on the tiny config, in process: with pools
// far smaller than the workload the scheduler queues and preempts, yet every request finishes
// with the outputs of a run where everything fits at once, and the float64 check still passes.
#include <gtest/gtest.h>

#include <cmath>
#include <map>
#include <vector>

#include "dsv4/model.h"
#include "kv_pools.h"
#include "serving_sim.h"

namespace {

using dsv4::cli::KvPoolSizes;
using dsv4::cli::SimConfig;
using dsv4::cli::SimReport;

using Outputs = std::map<std::pair<int64_t, int64_t>, std::vector<float>>;  // (req, pos) -> y

struct SimRun {
  SimReport rep;
  Outputs y;
};

const std::vector<int> kLayers = {0, 1, 2};  // SWA, C4A, C128A

SimRun simulate(const SimConfig& sc, const dsv4::LayerCacheOptions& caches) {
  const auto cfg = dsv4::ModelConfig::builtin("tiny");
  dsv4::StackOptions so;
  so.layers = kLayers;
  so.attention.caches = caches;
  dsv4::AttentionStack stack(cfg, so);
  SimRun run;
  run.rep = dsv4::cli::run_serving_sim(stack, sc, {}, [&](int64_t req, int64_t pos, const float* y) {
    run.y[{req, pos}] = std::vector<float>(y, y + cfg.dim);
  });
  return run;
}

// Prompts cross the SWA window and ratio-4 / ratio-128 windows, and decodes carry every request
// past a 256-position boundary, where its compressed caches need one more block.
SimConfig workload() {
  SimConfig sc;
  sc.requests = 4;
  sc.prompt_lens = {300, 250, 490, 230};
  sc.decode_steps = 30;
  sc.chunk = 128;
  sc.check_requests = 2;
  return sc;
}

TEST(ServingSim, TinyPoolQueuesPreemptsAndMatchesAnUnconstrainedRun) {
  const SimConfig sc = workload();
  const auto cfg = dsv4::ModelConfig::builtin("tiny");
  const dsv4::cli::KvWorkload w{dsv4::cli::request_prompts(sc), sc.decode_steps, sc.chunk};
  const KvPoolSizes all = dsv4::cli::size_kv_pools(cfg, kLayers, {}, w, int64_t{1} << 40);
  ASSERT_EQ(all.resident_requests, 4);
  dsv4::LayerCacheOptions roomy_pools;
  roomy_pools.swa_blocks = all.swa_blocks;
  roomy_pools.compressed_blocks = all.compressed_blocks;
  roomy_pools.state_blocks = all.state_blocks;
  const SimRun roomy = simulate(sc, roomy_pools);
  EXPECT_EQ(roomy.rep.scheduler.waited_requests, 0);
  EXPECT_EQ(roomy.rep.scheduler.preemptions, 0);
  EXPECT_EQ(roomy.rep.scheduler.peak_running, 4);
  EXPECT_TRUE(roomy.rep.check_passed);

  // Compressed pools of 4 blocks, where the requests end up needing 2 + 2 + 3 + 2: all four are
  // admitted (one block each), then their growth forces preemptions; SWA pools hold about one
  // request's peak, so admissions wait as well.
  const KvPoolSizes one = dsv4::cli::size_kv_pools(cfg, kLayers, {}, w, all.one_request_bytes);
  dsv4::LayerCacheOptions tight_pools;
  tight_pools.swa_blocks = one.swa_blocks + 1;
  tight_pools.compressed_blocks = 4;
  tight_pools.state_blocks = all.state_blocks;
  const SimRun tight = simulate(sc, tight_pools);
  EXPECT_GT(tight.rep.scheduler.waited_requests, 0);
  EXPECT_GT(tight.rep.scheduler.preemptions, 0);
  EXPECT_GT(tight.rep.scheduler.recomputed_tokens, 0);
  EXPECT_TRUE(tight.rep.check_passed);
  for (const auto& c : tight.rep.checks) EXPECT_EQ(c.tokens, 300 + 250 + 2 * 30) << "layer " << c.layer;

  // Every position of every request, with the same output: a token's y depends only on its
  // request's tokens, never on the batch it ran in or on a recompute (the CPU backend is
  // batch-invariant, so equality is exact).
  int64_t tokens = 0;
  for (int64_t p : sc.prompt_lens) tokens += p + sc.decode_steps;
  ASSERT_EQ(static_cast<int64_t>(roomy.y.size()), tokens);
  ASSERT_EQ(tight.y.size(), roomy.y.size());
  for (const auto& [key, y] : roomy.y) {
    const auto it = tight.y.find(key);
    ASSERT_NE(it, tight.y.end()) << "request " << key.first << " position " << key.second;
    ASSERT_EQ(y, it->second) << "request " << key.first << " position " << key.second;
  }
  int64_t computed = 0;
  for (const auto& p : tight.rep.phases) computed += p.tokens;
  EXPECT_EQ(computed, tokens + tight.rep.scheduler.recomputed_tokens);
}

}  // namespace

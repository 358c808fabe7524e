// The DeepSeek-V3.2 sparse-MLA layer's decode steps as CUDA graphs (SparseMlaOptions::cuda_graphs):
// replayed steps against eager ones, reserve() covering the graph buckets, and the stack passing
// the option on. Skipped without a GPU.
//
// Graphs vs eager, bit for bit: a decode-only step runs padded to its bucket whether graphs are on
// or off (include/dsv4/sparse_mla_layer.h), so both layers launch the same kernels on the same
// shapes, and every kernel treats token rows independently (the padding rows' inputs — zeros in
// the eager step, an earlier step's rows in the graph's fixed rows — never reach a real row).
// What remains is where the kernels run (a replayed graph vs the layer's stream), which changes
// no bit of deterministic kernels. A graph that replays a stale plan, reads the wrong rows or
// misses a write gives other bits.
//
// Configs: tiny-v3.2, and DeepSeek-V3.2's own shapes (128 heads, top-2048, dim 7168) on one layer
// with a few requests; FP8 and bf16 weights, as tests/cuda/test_sparse_mla_layer_cuda.cpp runs.
#include <gtest/gtest.h>

#include <cmath>
#include <cstdio>
#include <cstring>
#include <string>
#include <tuple>
#include <vector>

#include "dsv4/device_tensor.h"
#include "dsv4/model.h"
#include "dsv4/sparse_mla_layer.h"
#include "dsv4/sparse_mla_weights.h"
#include "gpu_test_util.h"
#include "layer_device_step.h"
#include "layer_test_support.h"

namespace dsv4 {
namespace {

constexpr uint64_t kSeed = 11;
using Outputs = dsv4_test::LayerOutputs;

SparseMlaAttention make_layer(const ModelConfig& cfg, const SparseMlaWeights& w, bool graphs) {
  SparseMlaOptions opts;
  opts.backend = Backend::cuda;
  opts.cuda_graphs = graphs;
  opts.cache_blocks = 64;
  opts.block_size = 16;  // block tables several blocks wide, their widths crossing powers of two
  return SparseMlaAttention(cfg, 0, w, opts);
}

// One step with x and y on the GPU (the serving path); y poisoned, so an unwritten row shows.
void step(SparseMlaAttention& a, const std::vector<RequestStep>& steps, Outputs& out) {
  dsv4_test::device_step(a, steps, kSeed, out);
}

// Five prefills (143 and 115 tokens), then decode-only steps of 1, 3 and 4 requests (all bucket 4: padded by 3, by 1
// and not at all) and of 5 requests (bucket 8, padded by 3), each seen 3+ times (eager, capture,
// replays), contexts crossing block-table widths; a mixed step between (eager; the graphs stay),
// then the 3-request bucket again.
Outputs run_schedule(SparseMlaAttention& a) {
  Outputs out;
  std::vector<int64_t> ctx{40, 70, 33, 50, 65};
  step(a, {{0, 0, 40}, {1, 0, 70}, {2, 0, 33}}, out);
  step(a, {{3, 0, 50}, {4, 0, 65}}, out);
  const auto decode = [&](const std::vector<int>& reqs) {
    std::vector<RequestStep> s;
    for (int r : reqs) s.push_back({r, ctx[static_cast<size_t>(r)]++, 1});
    step(a, s, out);
  };
  for (int i = 0; i < 4; ++i) decode({2});
  for (int i = 0; i < 6; ++i) decode({0, 1, 2});
  for (int i = 0; i < 4; ++i) decode({0, 1, 2, 3});
  for (int i = 0; i < 6; ++i) decode({0, 1, 2, 3, 4});
  step(a, {{0, ctx[0]++, 1}, {5, 0, 20}}, out);
  for (int i = 0; i < 3; ++i) decode({0, 1, 2});
  return out;
}

// (config name, FP8 weights)
class SparseMlaGraphTest : public ::testing::TestWithParam<std::tuple<const char*, bool>> {
 protected:
  ModelConfig cfg = ModelConfig::builtin(std::get<0>(GetParam()));
  SparseMlaWeights weights() const {
    return random_sparse_mla_weights(cfg, 0, kSeed, std::get<1>(GetParam()));
  }
};

TEST_P(SparseMlaGraphTest, ReplayedDecodesMatchEagerStepsBitForBit) {
  DSV4_SKIP_WITHOUT_GPU();
  const SparseMlaWeights w = weights();
  SparseMlaAttention eager = make_layer(cfg, w, false);
  SparseMlaAttention graphs = make_layer(cfg, w, true);
  const Outputs want = run_schedule(eager);
  const Outputs got = run_schedule(graphs);
  EXPECT_EQ(eager.graph_captures(), 0);
  EXPECT_EQ(eager.graph_replays(), 0);
  EXPECT_GE(graphs.graph_captures(), 2);  // buckets 4 and 8, more where a table width grew
  EXPECT_GE(graphs.graph_replays(), 10);
  std::printf("  %lld graphs captured, %lld steps replayed\n",
              static_cast<long long>(graphs.graph_captures()), static_cast<long long>(graphs.graph_replays()));
  ASSERT_EQ(want.size(), got.size());
  for (const auto& [key, row] : want) {
    const std::vector<float>& g = got.at(key);
    for (float v : g) ASSERT_TRUE(std::isfinite(v)) << "request " << key.first << " position " << key.second;
    ASSERT_EQ(0, std::memcmp(row.data(), g.data(), row.size() * sizeof(float)))
        << "request " << key.first << " position " << key.second;
  }
}

// reserve() sizes the arena and the upload for the graph buckets too (a capture that outgrew the
// arena would throw), and stays within 2x of what the largest step uses.
TEST_P(SparseMlaGraphTest, ReserveCoversTheBucketsAndStaysTight) {
  DSV4_SKIP_WITHOUT_GPU();
  SparseMlaAttention a = make_layer(cfg, weights(), true);
  // The schedule's limits: 143 tokens (the first step), 5 requests, sequences up to 89 tokens.
  const LayerMemory reserved = a.reserve(/*max_tokens=*/144, /*max_requests=*/5, /*max_context=*/128);
  run_schedule(a);
  const LayerMemory after = a.memory();
  std::printf("  reserved %.1f MiB, the largest step used %.1f MiB\n", reserved.workspace / 1048576.0,
              after.workspace_used / 1048576.0);
  EXPECT_GT(a.graph_replays(), 0);
  EXPECT_LE(after.workspace_used, reserved.workspace);
  EXPECT_EQ(after.workspace, reserved.workspace) << "the arena grew after reserve()";
  EXPECT_EQ(after.step_upload, reserved.step_upload) << "the upload buffer grew after reserve()";
  EXPECT_LE(reserved.workspace, 2 * after.workspace_used);
}

INSTANTIATE_TEST_SUITE_P(ConfigsAndWeights, SparseMlaGraphTest,
                         ::testing::Combine(::testing::Values("tiny-v3.2", "v3.2"), ::testing::Bool()),
                         [](const auto& info) {
                           std::string name = std::get<0>(info.param) == std::string("v3.2") ? "v32" : "tiny_v32";
                           return name + (std::get<1>(info.param) ? "_fp8_weights" : "_bf16_weights");
                         });

// The stack (`dsv4 run`'s unit) passes AttentionOptions::cuda_graphs on to its V3.2 layers.
TEST(SparseMlaGraphStack, StackPassesCudaGraphsOn) {
  DSV4_SKIP_WITHOUT_GPU();
  const ModelConfig cfg = ModelConfig::builtin("tiny-v3.2");
  for (const bool graphs : {true, false}) {
    StackOptions so;
    so.layers = {0, 1};
    so.seed = kSeed;
    so.attention.backend = Backend::cuda;
    so.attention.cuda_graphs = graphs;
    AttentionStack stack(cfg, so);
    std::vector<int64_t> ctx{0, 0};
    for (int s = 0; s < 6; ++s) {
      const std::vector<RequestStep> steps =
          s == 0 ? std::vector<RequestStep>{{0, 0, 24}, {1, 0, 9}}
                 : std::vector<RequestStep>{{0, ctx[0], 1}, {1, ctx[1], 1}};
      const BatchPlan plan = BatchPlan::make(steps);
      for (const RequestStep& r : steps) ctx[static_cast<size_t>(r.req_id)] += r.num_new;
      const dsv4_test::StepIo io = dsv4_test::step_io(plan, cfg.dim, kSeed + s);
      DeviceTensor x = DeviceTensor::from_host(io.x), y(DType::fp32, {plan.num_tokens(), cfg.dim});
      stack.forward(plan, x, y);
    }
    for (int l = 0; l < stack.num_layers(); ++l) {
      EXPECT_EQ(stack.sparse_mla_layer(l).graph_replays() > 0, graphs) << "layer " << l;
      EXPECT_EQ(stack.sparse_mla_layer(l).graph_captures() > 0, graphs) << "layer " << l;
    }
  }
}

}  // namespace
}  // namespace dsv4

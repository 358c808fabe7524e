// Attention::reserve(): the workspace bound it reserves covers what every step within its limits
// takes (measured by the scratch's high-water mark, counted on the CPU exactly as the CUDA arena
// carves it), and bad limits are refused. With per-tensor FP8 caches the decodes' FP8 queries are
// one more temporary.
#include <gtest/gtest.h>

#include <vector>

#include "dsv4/layer.h"
#include "dsv4/weights.h"
#include "layer_test_support.h"

namespace dsv4 {
namespace {

Attention make_layer(const ModelConfig& cfg, int layer, int group, KvLayout layout = KvLayout::model1_fp8) {
  AttentionOptions opts;
  opts.caches.layout = layout;
  opts.caches.q_scale = 0.6f;  // read with FP8_PER_TENSOR only
  opts.caches.swa_blocks = 128;
  opts.caches.compressed_blocks = 128;
  opts.caches.state_blocks = 128;
  opts.prefill_group_requests = group;
  return Attention(cfg, layer, random_attention_weights(cfg, layer, 3, true), opts);
}

void step(Attention& a, const std::vector<RequestStep>& steps) {
  const BatchPlan plan = BatchPlan::make(steps);
  dsv4_test::StepIo xy = dsv4_test::step_io(plan, a.config().dim, 5);
  a.forward(plan, xy.x, xy.y);
}

class LayerWorkspace : public ::testing::TestWithParam<std::tuple<int, int, KvLayout>> {};

TEST_P(LayerWorkspace, ReserveCoversEveryStepWithinItsLimits) {
  const auto [layer, group, layout] = GetParam();
  const ModelConfig cfg = ModelConfig::builtin("tiny");
  Attention a = make_layer(cfg, layer, group, layout);
  // Up to 96 tokens a step over up to 6 requests, sequences up to 600 tokens.
  const LayerMemory reserved = a.reserve(96, 6, 600);
  ASSERT_GT(reserved.workspace, 0);
  step(a, {{0, 0, 96}});
  step(a, {{1, 0, 40}, {2, 0, 30}, {3, 0, 26}});
  for (int i = 0; i < 4; ++i) step(a, {{0, 96 + 90 * i, 90}, {1, 40 + i, 1}, {2, 30 + i, 1}});
  step(a, {{0, 456, 1}, {1, 44, 1}, {2, 34, 1}, {3, 26, 70}, {4, 0, 10}, {5, 0, 5}});
  for (int i = 0; i < 3; ++i)
    step(a, {{0, 457 + i, 1}, {1, 45 + i, 1}, {2, 35 + i, 1}, {3, 96 + i, 1}, {4, 10 + i, 1},
             {5, 5 + i, 1}});
  const LayerMemory after = a.memory();
  EXPECT_GT(after.workspace_used, 0);
  EXPECT_LE(after.workspace_used, reserved.workspace);
}

INSTANTIATE_TEST_SUITE_P(KindsAndGroups, LayerWorkspace,
                         ::testing::Combine(::testing::Values(0, 1, 2), ::testing::Values(1, 4),
                                            ::testing::Values(KvLayout::model1_fp8, KvLayout::fp8_per_tensor)));

TEST(LayerWorkspaceArgs, RefusesBadLimits) {
  const ModelConfig cfg = ModelConfig::builtin("tiny");
  Attention a = make_layer(cfg, 0, 4);
  EXPECT_THROW(a.reserve(0, 1, 16), Error);
  EXPECT_THROW(a.reserve(16, 0, 16), Error);
  EXPECT_THROW(a.reserve(16, 17, 16), Error);
  EXPECT_THROW(a.reserve(16, 1, cfg.max_position + 1), Error);
}

}  // namespace
}  // namespace dsv4

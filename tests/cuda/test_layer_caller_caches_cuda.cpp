// dsv4::Attention on caller-owned caches on the GPU (AttentionOptions::caller_caches): the same
// steps on the layer's own device caches and on a caller's device caches laid out differently
// (padded block stride, scrambled blocks, poisoned storage) give bit-identical outputs for every
// layer kind — both run the same kernels on the same data (decode steps as CUDA graphs alike).
// The CPU twin: tests/cpu/test_layer_caller_caches.cpp.
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <string>
#include <vector>

#include "caller_caches_support.h"
#include "dsv4/device_tensor.h"
#include "dsv4/layer.h"
#include "dsv4/weights.h"
#include "gpu_test_util.h"
#include "layer_test_support.h"

namespace dsv4 {
namespace {

constexpr uint64_t kSeed = 17;

AttentionOptions cuda_options(bool caller) {
  AttentionOptions o;
  o.backend = Backend::cuda;
  o.caches.swa_blocks = 64;
  o.caches.compressed_blocks = 64;
  o.caches.state_blocks = 64;
  o.caller_caches = caller;
  return o;
}

class CallerCachesCuda : public ::testing::TestWithParam<int> {};

TEST_P(CallerCachesCuda, SameOutputsAsSelfManaged) {
  DSV4_SKIP_WITHOUT_GPU();
  const ModelConfig cfg = ModelConfig::builtin("tiny");
  const int layer = GetParam();
  Attention own(cfg, layer, random_attention_weights(cfg, layer, kSeed, true), cuda_options(false));
  Attention caller(cfg, layer, random_attention_weights(cfg, layer, kSeed, true), cuda_options(true));
  dsv4_test::CallerCacheSim sim(cfg, layer, cuda_options(true).caches, 48, /*pad_bytes=*/64,
                                Device::cuda);
  caller.bind_caches(sim.caches());
  std::vector<std::vector<RequestStep>> steps = {
      {{7, 0, 150}, {9, 0, 40}},
      {{7, 150, 1}, {9, 40, 87}},
      {{7, 151, 1}, {9, 127, 1}, {11, 0, 5}},
  };
  // Decode-only steps: eager, captured, then replayed as CUDA graphs in both layers.
  for (int i = 0; i < 5; ++i) steps.push_back({{7, 152 + i, 1}, {9, 128 + i, 1}, {11, 5 + i, 1}});
  int n = 0;
  for (const std::vector<RequestStep>& s : steps) {
    const BatchPlan plan = BatchPlan::make(s);
    dsv4_test::StepIo a = dsv4_test::step_io(plan, cfg.dim, kSeed, /*bf16_representable=*/true);
    dsv4_test::StepIo b = dsv4_test::step_io(plan, cfg.dim, kSeed, /*bf16_representable=*/true);
    own.forward(plan, a.x, a.y);  // host y: waits for the result
    dsv4_test::CallerCacheSim::Step st = sim.step(plan.requests);
    caller.forward(st.view, b.x, b.y);
    for (int64_t i = 0; i < b.y.numel(); ++i) ASSERT_FALSE(std::isnan(b.y.data<float>()[i])) << i;
    ASSERT_EQ(std::memcmp(a.y.data<float>(), b.y.data<float>(), a.y.nbytes()), 0)
        << "step " << n << ": outputs differ";
    ++n;
  }
  EXPECT_GT(caller.graph_replays(), 0);
}

INSTANTIATE_TEST_SUITE_P(Kinds, CallerCachesCuda, ::testing::Values(0, 1, 2),
                         [](const auto& info) {
                           return std::string(info.param == 0 ? "SWA" : info.param == 1 ? "C4A" : "C128A");
                         });

}  // namespace
}  // namespace dsv4

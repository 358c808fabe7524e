// dsv4::AttentionStack: the residual chain h ← h + Attention_l(RMSNorm(h)) of its layers, and a
// step any layer rejects changes no layer.
#include <gtest/gtest.h>

#include <cstring>
#include <random>
#include <vector>

#include "dsv4/model.h"
#include "dsv4/ops.h"
#include "dsv4/weights.h"

namespace dsv4 {
namespace {

constexpr uint64_t kSeed = 7;

HostTensor random_hidden(int64_t T, int dim, uint64_t seed) {
  HostTensor x(DType::fp32, {T, dim});
  std::mt19937_64 rng(seed);
  std::normal_distribution<float> n(0.0f, 1.0f);
  for (int64_t i = 0; i < x.numel(); ++i) x.data<float>()[i] = n(rng);
  return x;
}

StackOptions options(std::vector<int> layers, int32_t compressed_blocks = 64) {
  StackOptions so;
  so.layers = std::move(layers);
  so.seed = kSeed;
  so.attention.caches.swa_blocks = 64;
  so.attention.caches.compressed_blocks = compressed_blocks;
  so.attention.caches.state_blocks = 64;
  return so;
}

// The same ops and the same fp32 adds as chaining the layers by hand: the same bits.
TEST(AttentionStack, IsTheResidualChainOfItsLayers) {
  const ModelConfig cfg = ModelConfig::builtin("tiny");
  AttentionStack stack(cfg, options({0, 1, 2}));
  ASSERT_EQ(stack.num_layers(), 3);
  std::vector<Attention> layers;
  for (int l = 0; l < 3; ++l)
    layers.emplace_back(cfg, l, random_attention_weights(cfg, l, kSeed, true),
                        options({}).attention);
  const std::vector<std::vector<RequestStep>> steps = {{{1, 0, 24}, {2, 0, 9}},
                                                        {{2, 9, 1}, {1, 24, 5}}};
  for (size_t s = 0; s < steps.size(); ++s) {
    const BatchPlan plan = BatchPlan::make(steps[s]);
    const int64_t T = plan.num_tokens();
    const HostTensor x = random_hidden(T, cfg.dim, 100 + s);
    HostTensor y(DType::fp32, {T, cfg.dim});
    y.fill_bytes(0xFF);
    stack.forward(plan, x, y);

    HostTensor h(DType::fp32, {T, cfg.dim}), normed(DType::fp32, {T, cfg.dim}),
        out(DType::fp32, {T, cfg.dim});
    std::memcpy(h.data<float>(), x.data<float>(), h.nbytes());
    for (Attention& a : layers) {
      rms_norm(h, {}, static_cast<float>(cfg.norm_eps), normed);
      a.forward(plan, normed, out);
      for (int64_t i = 0; i < h.numel(); ++i) h.data<float>()[i] += out.data<float>()[i];
    }
    ASSERT_EQ(0, std::memcmp(y.data<float>(), h.data<float>(), h.nbytes())) << "step " << s;
  }
}

// The C4A layer's compressed pool (one block of 64 entries = 256 tokens) cannot take a 300-token
// prompt, which the SWA layer before it could: the stack refuses before the SWA layer runs.
TEST(AttentionStack, RejectedStepChangesNoLayer) {
  const ModelConfig cfg = ModelConfig::builtin("tiny");
  AttentionStack stack(cfg, options({0, 1}, /*compressed_blocks=*/1));
  AttentionStack fresh(cfg, options({0, 1}, 1));
  const HostTensor big = random_hidden(300, cfg.dim, 1);
  HostTensor y_big(DType::fp32, {300, cfg.dim});
  try {
    stack.forward(BatchPlan::make({{3, 0, 300}}), big, y_big);
    FAIL() << "expected dsv4::Error";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("exhausted"), std::string::npos) << e.what();
  }
  // A device view is refused too (the residual stream is on the host).
  const HostTensor x = random_hidden(20, cfg.dim, 2);
  HostTensor y(DType::fp32, {20, cfg.dim}), y_fresh(DType::fp32, {20, cfg.dim});
  TensorView on_gpu(x.view().data, DType::fp32, {20, cfg.dim}, Device::cuda);
  EXPECT_THROW(stack.forward(BatchPlan::make({{3, 0, 20}}), on_gpu, y), Error);

  const BatchPlan ok = BatchPlan::make({{3, 0, 20}});
  stack.forward(ok, x, y);
  fresh.forward(ok, x, y_fresh);
  EXPECT_EQ(0, std::memcmp(y.data<float>(), y_fresh.data<float>(), y.nbytes()));
}

}  // namespace
}  // namespace dsv4

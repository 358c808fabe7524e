// Tensor parallelism emulated on one GPU: V4-Flash's 64 heads split over tp 2, 4, 8 ranks, so the
// CUDA sparse kernels run 32, 16 and 8 heads per rank (padded inside to 64 with zero query rows
// that are never stored, docs/design.md "Tensor parallelism"); each rank's partial y without an
// all-reduce, summed on the host, against the whole layer on the same GPU. dim, q_lora_rank and
// o_lora_rank are reduced as in tests/cpu/test_tensor_parallel.cpp.
//
// Tolerance (not yet measured on a GPU): q, o and z per head / group are the same kernels' outputs
// as in the whole layer, so the difference is wo_b's FP8 GEMM summing G·o_lora columns as tp
// partial sums (fp32 accumulation of FP8 products, then the host's sum) plus any change of
// cuBLASLt algorithm with the narrower K; per token max|Δy| / max|y| < 2e-3, where a wrong head,
// group or slice moves a token by O(1).
#include <gtest/gtest.h>

#include "dsv4/layer.h"
#include "gpu_test_util.h"
#include "layer_test_support.h"

namespace {

class TensorParallelCuda : public ::testing::TestWithParam<int> {};

TEST_P(TensorParallelCuda, SummedPartialOutputsMatchTheWholeLayer) {
  DSV4_SKIP_WITHOUT_GPU();
  const int tp = GetParam();
  dsv4::ModelConfig cfg = dsv4::ModelConfig::builtin("v4-flash");
  cfg.dim = 512;
  cfg.q_lora_rank = 256;
  cfg.o_lora_rank = 128;
  const int layer = dsv4_test::first_layer_of_kind(cfg, dsv4::LayerKind::c4a);
  const dsv4::AttentionWeights w = dsv4::random_attention_weights(cfg, layer, 3, /*fp8=*/true);
  std::vector<dsv4::BatchPlan> plans{dsv4::BatchPlan::make({{7, 0, 12}})};
  for (int i = 0; i < 3; ++i) plans.push_back(dsv4::BatchPlan::make({{7, 12 + i, 1}}));
  const auto run = [&](dsv4::TensorParallel tp_opt) {
    dsv4::AttentionOptions opts;
    opts.backend = dsv4::Backend::cuda;
    opts.caches.swa_blocks = 4;
    opts.tp = tp_opt;
    dsv4::Attention a(cfg, layer, w, opts);
    dsv4_test::LayerOutputs out;
    for (const dsv4::BatchPlan& plan : plans) {
      dsv4_test::StepIo io = dsv4_test::step_io(plan, cfg.dim, 11, /*bf16_representable=*/true);
      a.forward(plan, io.x, io.y);
      dsv4_test::record_outputs(plan, io.y, cfg.dim, out);
    }
    return out;
  };
  const dsv4_test::LayerOutputs whole = run({});
  dsv4_test::LayerOutputs sum;
  for (int r = 0; r < tp; ++r)
    for (const auto& [key, row] : run({r, tp, nullptr})) {
      std::vector<float>& s = sum[key];
      s.resize(row.size(), 0.0f);
      for (size_t i = 0; i < row.size(); ++i) s[i] += row[i];
    }
  double worst = 0;
  for (const auto& [key, row] : whole) worst = std::max(worst, dsv4_test::row_rel_err(sum.at(key), row));
  std::printf("v4-flash heads, tp %d: worst token error %.3g\n", tp, worst);
  EXPECT_LT(worst, 2e-3);
}

INSTANTIATE_TEST_SUITE_P(Ranks, TensorParallelCuda, ::testing::Values(2, 4, 8),
                         [](const auto& info) { return "tp" + std::to_string(info.param); });

}  // namespace

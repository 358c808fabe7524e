// The V4 layer at the released head counts on the CUDA backend (tests/layer_real_heads.h): every
// token against the float64 reference. On top of the CPU backend's drift (measured in
// tests/cpu/test_attention_layer_real_heads.cpp: up to 3.3e-2 per token for v4-pro C4A, medians
// <= 2e-3), the GPU feeds the softmax weights to the P·V MMA as bf16 and accumulates FP8 GEMMs
// on tensor cores, which flips FP8 roundings of a further share of the activations (the CUDA layer
// test measured up to 4.1e-2 per token against the reference on v4-flash, H100, 2026-11-25).
// Bounds: every token < 1e-1 and the median < 2e-2 (not yet measured at these shapes on a GPU:
// the test prints median and max per case for the record); a semantic error moves every token by
// O(1). C4A: 4 entries against top-k 512 / 1024, so the GPU's FP8 indexer scores cannot swap a
// selection. Skipped without a GPU.
#include <gtest/gtest.h>

#include <cstdio>

#include "gpu_test_util.h"
#include "layer_real_heads.h"

namespace {

class RealHeadsCuda : public ::testing::TestWithParam<dsv4_test::RealHeadsCase> {};

TEST_P(RealHeadsCuda, MatchesFloat64Reference) {
  DSV4_SKIP_WITHOUT_GPU();
  const std::vector<double> errs = dsv4_test::real_heads_errors(GetParam(), dsv4::Backend::cuda, 7);
  std::printf("  %d tokens: median %.3e, max %.3e\n", GetParam().tokens, errs[errs.size() / 2],
              errs.back());
  EXPECT_LT(errs.back(), 1e-1);
  EXPECT_LT(errs[errs.size() / 2], 2e-2);
}

INSTANTIATE_TEST_SUITE_P(Models, RealHeadsCuda, ::testing::ValuesIn(dsv4_test::real_heads_cases()),
                         [](const auto& info) { return dsv4_test::real_heads_name(info.param); });

}  // namespace

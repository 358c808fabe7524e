// The layer at the released models' real head counts — V4-Flash (64 heads, dim 4096) and V4-Pro
// (128 heads, dim 7168), each layer kind — against the float64 reference layer, with random FP8
// weights: a short prompt and a few decode steps, so the whole-size projections, the grouped wo_a,
// the 64- and 128-head sparse paths and the real indexer shapes all run in ctest on the CPU (the
// tiny config's 8 heads exercise none of these sizes).
//
// Tolerance: as in test_attention_layer.cpp's MatchesFloat64Reference, the reference rounds where
// the layer stores bf16 / FP8, so what remains is fp32-vs-double accumulation, which now and then
// moves an element across an FP8 rounding boundary (o before wo_a, the inputs of FP8-weight
// projections). At these widths a flip moves a token by less than in the tiny config (it is one
// of 32768–65536 elements behind each output), but flips are more frequent: with V4-Pro's 65536
// elements of o, most C128A tokens carry one. Measured (2026-11-25): median 3e-7 (V4-Flash) to
// 2.5e-3 (V4-Pro C128A), max 3.7e-3 to 1.1e-2. Bound: every token < 5e-2 (`dsv4 run --check`'s
// bound) and the median < 1e-2; a semantic error (a wrong head, scope, position or scale) moves
// every token by O(1e-1).
#include <gtest/gtest.h>

#include "layer_test_support.h"

namespace {

class RealHeadsLayer : public ::testing::TestWithParam<dsv4_test::RealHeadsCase> {};

TEST_P(RealHeadsLayer, MatchesFloat64Reference) {
  const std::vector<double> errs = dsv4_test::real_heads_errors(GetParam(), dsv4::Backend::cpu);
  EXPECT_LT(errs.back(), 5e-2);
  EXPECT_LT(errs[errs.size() / 2], 1e-2);
}

INSTANTIATE_TEST_SUITE_P(Models, RealHeadsLayer, ::testing::ValuesIn(dsv4_test::real_heads_cases()),
                         [](const auto& info) { return dsv4_test::real_heads_case_name(info.param); });

}  // namespace

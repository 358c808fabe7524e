// The per-element math the compressor's CPU op and CUDA kernels share (src/math/compressor.h): softmax_exp against float64 exp, and its edge values.
#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>
#include <limits>
#include <random>

#include "math/compressor.h"

namespace dsv4 {
namespace {

// Relative error vs float64 exp below 3e-7 (about 2.5 ulp: a degree-5 polynomial after an
// almost exact Cody–Waite reduction, every step rounded to fp32) over the softmax domain,
// swept densely near 0 (the weights that matter) and randomly down to the cutoff.
TEST(CompressorMath, SoftmaxExpMatchesFloat64) {
  double worst = 0.0;
  auto check = [&](float x) {
    const double want = std::exp(static_cast<double>(x));
    const double got = compressor_math::softmax_exp(x);
    const double rel = std::fabs(got - want) / want;
    worst = std::max(worst, rel);
    ASSERT_LT(rel, 3e-7) << "x = " << x << ": got " << got << ", want " << want;
  };
  for (float x = 0.0f; x > -20.0f; x -= 1.0f / 4096) check(x);
  std::mt19937 rng(5);
  std::uniform_real_distribution<float> dist(-87.0f, 88.0f);
  for (int i = 0; i < 200000; ++i) check(dist(rng));
  check(-87.0f);
  check(88.0f);
  EXPECT_GT(worst, 0.0);  // a real approximation, not std::exp in disguise
}

TEST(CompressorMath, SoftmaxExpEdgeValues) {
  constexpr float kInf = std::numeric_limits<float>::infinity();
  EXPECT_EQ(compressor_math::softmax_exp(0.0f), 1.0f);  // the max row weighs exactly 1
  EXPECT_EQ(compressor_math::softmax_exp(-0.0f), 1.0f);
  EXPECT_EQ(compressor_math::softmax_exp(-87.5f), 0.0f);
  EXPECT_EQ(compressor_math::softmax_exp(-kInf), 0.0f);
  EXPECT_EQ(compressor_math::softmax_exp(89.0f), kInf);
  EXPECT_TRUE(std::isnan(compressor_math::softmax_exp(std::nanf(""))));
  // Every nonzero result is a normal float (no denormal for CUDA to flush).
  EXPECT_GE(compressor_math::softmax_exp(-87.0f), std::numeric_limits<float>::min());
}

// pool_dim: the softmax-weighted mean of one dim over the rows, against float64.
TEST(CompressorMath, PoolDimIsTheSoftmaxWeightedMean) {
  const float kv0[2] = {1.0f, 0.5f}, kv1[2] = {-2.0f, 0.25f}, kv2[2] = {0.75f, 4.0f};
  const float s0[2] = {0.3f, -1.0f}, s1[2] = {1.2f, 2.0f}, s2[2] = {-0.4f, 0.0f};
  const float* kv[3] = {kv0, kv1, kv2};
  const float* s[3] = {s0, s1, s2};
  for (int d = 0; d < 2; ++d) {
    double num = 0.0, den = 0.0;
    for (int i = 0; i < 3; ++i) {
      num += std::exp(double{s[i][d]}) * kv[i][d];
      den += std::exp(double{s[i][d]});
    }
    EXPECT_NEAR(compressor_math::pool_dim(kv, s, 3, d), num / den, 1e-6) << "dim " << d;
  }
  EXPECT_EQ(compressor_math::pool_dim(kv, s, 1, 0), 1.0f);  // one row: its value exactly
}

}  // namespace
}  // namespace dsv4

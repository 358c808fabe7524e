// residual_add_rms_norm against a float64 formula: residual ← residual + delta, then
// y = (residual / sqrt(mean(residual²) + eps)) · w, over bf16/fp32 deltas, bf16/fp32 y, with and
// without weight, and its add-only and norm-only forms.
// Tolerances: the updated residual is one fp32 add of the inputs as stored: ≤ 2^-24 relative
// (checked at 1e-7 relative). y: as rms_norm's test (the same normalization of the updated fp32
// rows): 1e-5 relative per element for fp32, 2^-8 for bf16.
#include <gtest/gtest.h>

#include <cmath>
#include <tuple>
#include <vector>

#include "dense_test_support.h"
#include "dsv4/ops.h"

namespace {
using namespace dense_test;

constexpr float kEps = 1e-6f;

enum class Form { add_and_norm, add_only, norm_only };
using Params = std::tuple<int64_t /*T*/, int64_t /*D*/, DType /*delta*/, DType /*y*/, bool /*weight*/, Form>;
class ResidualAddRmsNorm : public ::testing::TestWithParam<Params> {};

TEST_P(ResidualAddRmsNorm, MatchesFloat64) {
  const auto& [T, D, delta_dt, y_dt, with_weight, form] = GetParam();
  HostTensor residual = random_tensor(DType::fp32, {T, D}, 11 + D);
  const std::vector<double> r0 = to_doubles(residual);
  HostTensor delta;
  std::vector<double> dd(static_cast<size_t>(T * D), 0.0);
  if (form != Form::norm_only) {
    delta = random_tensor(delta_dt, {T, D}, 5 + T);
    dd = to_doubles(delta);
  }
  HostTensor w;
  std::vector<double> wd(static_cast<size_t>(D), 1.0);
  if (with_weight && form != Form::add_only) {
    w = random_tensor(DType::fp32, {D}, 3, 0.5, 1.5);
    wd = to_doubles(w);
  }
  HostTensor y = form == Form::add_only ? HostTensor() : poisoned(y_dt, {T, D});
  dsv4::residual_add_rms_norm(residual, delta, w, kEps, y);

  for (int64_t t = 0; t < T; ++t) {
    std::vector<double> h(static_cast<size_t>(D));
    double ss = 0;
    for (int64_t i = 0; i < D; ++i) {
      // The add happens in fp32: the reference rounds it once too.
      h[i] = static_cast<float>(static_cast<float>(r0[t * D + i]) + static_cast<float>(dd[t * D + i]));
      ss += h[i] * h[i];
      ASSERT_NEAR(at(residual, t * D + i), h[i], 1e-7 * std::fabs(h[i]) + 1e-30)
          << "residual row " << t << " i " << i;
    }
    if (form == Form::add_only) continue;
    const double inv = 1.0 / std::sqrt(ss / D + kEps);
    for (int64_t i = 0; i < D; ++i) {
      const double ref = h[i] * inv * wd[i];
      const double tol = (y_dt == DType::bf16 ? std::ldexp(1.0, -8) : 1e-5) * std::fabs(ref) + 1e-30;
      ASSERT_NEAR(at(y, t * D + i), ref, tol) << "y row " << t << " i " << i;
    }
  }
}

INSTANTIATE_TEST_SUITE_P(
    Grid, ResidualAddRmsNorm,
    ::testing::Combine(::testing::Values<int64_t>(1, 7), ::testing::Values<int64_t>(256, 4096),
                       ::testing::Values(DType::bf16, DType::fp32),
                       ::testing::Values(DType::bf16, DType::fp32), ::testing::Bool(),
                       ::testing::Values(Form::add_and_norm, Form::add_only, Form::norm_only)));

TEST(ResidualAddRmsNormArgs, RejectsOverlapAndWeightWithoutYBeforeWriting) {
  HostTensor residual = random_tensor(DType::fp32, {4, 64}, 1);
  const std::vector<double> before = to_doubles(residual);
  HostTensor delta = random_tensor(DType::fp32, {4, 64}, 2);
  HostTensor w = random_tensor(DType::fp32, {64}, 3);
  // y aliasing the residual.
  EXPECT_THROW(dsv4::residual_add_rms_norm(residual, delta, {}, kEps, residual), dsv4::Error);
  // delta aliasing the residual.
  EXPECT_THROW(dsv4::residual_add_rms_norm(residual, residual, {}, kEps, {}), dsv4::Error);
  // A weight with no y to apply it to.
  EXPECT_THROW(dsv4::residual_add_rms_norm(residual, delta, w, kEps, {}), dsv4::Error);
  // Wrong residual dtype.
  HostTensor bf = random_tensor(DType::bf16, {4, 64}, 4);
  EXPECT_THROW(dsv4::residual_add_rms_norm(bf, delta, {}, kEps, {}), dsv4::Error);
  EXPECT_EQ(to_doubles(residual), before);
}

}  // namespace

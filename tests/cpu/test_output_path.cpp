// The whole output path of docs/spec.md §2 steps 5–6 as the layer runs it in production:
//   inverse RoPE (apply_rope) → FP8 activation quant, UE8M0 1×128 (quantize_act_fp8) →
//   grouped wo_a (fp8 weights) → wo_b (linear, fp8 weights),
// against the float64 model math (inverse RoPE and both projections in float64, no activation
// quantization — what the reference computes in bf16/fp32).
//
// Tolerance. The path's dominant error is the FP8 rounding of the activations: per element
// |δo| ≤ 2^-4 |o| (e4m3 keeps 3 mantissa bits) + 2^-10 · s (half the subnormal quantum times the
// block scale s ≤ 2 · amax / 448) + 2^-8 of the rotated pair norm (bf16 output of the inverse
// RoPE). Propagating through both GEMMs gives a per-element worst-case bound
//   |δz| ≤ Σ|wo_a| |δo| + 2^-8 |z| + 1e-5 Σ|o wo_a|,   |δy| ≤ Σ|wo_b| |δz| + 2^-8 |y| + 1e-5 Σ|z wo_b|,
// checked for every output. It is loose (errors add up with random signs), so the test also
// requires the relative RMS error of y below 2^-5 ≈ 3.1%: fp8 rounding errors are about uniform
// within ±half an ulp, a relative RMS of ≈ 2^-4/√3 / 1.5 ≈ 2.4% per element that the GEMMs
// average but do not grow (measured: 2.3–2.5%); a wrong sign, scale or group gives errors of
// order 100%.
#include <gtest/gtest.h>

#include <cmath>
#include <tuple>
#include <vector>

#include "dense_operands.h"
#include "dsv4/ops.h"
#include "rope_reference.h"

namespace {
using namespace dense_test;

struct Config {
  int64_t T, H, D, G, L, dim;
};
class OutputPath : public ::testing::TestWithParam<Config> {};

TEST_P(OutputPath, MatchesFloat64ModelMath) {
  const Config c = GetParam();
  const int64_t R = 64, HD = c.H * c.D, Dg = HD / c.G;
  const HostTensor table = dsv4::build_rope_cache(yarn_rope(), 70000);
  const std::vector<double> freqs = reference_rope_freqs(yarn_rope());
  HostTensor o = random_tensor(DType::bf16, {c.T, c.H, c.D}, 77);
  // Heads differ in magnitude (×2^-2 .. ×2^2), so activation scales differ between blocks/groups.
  for (int64_t i = 0; i < o.numel(); ++i)
    o.set(i, static_cast<float>(std::ldexp(at(o, i), static_cast<int>((i / c.D) % 5) - 2)));
  HostTensor positions(DType::int64, {c.T});
  for (int64_t t = 0; t < c.T; ++t) positions.data<int64_t>()[t] = t == 0 ? 0 : 69999 - 1237 * t;
  const Operand wo_a = make_operand(Enc::fp8_ue8m0, c.G, c.L, Dg, 128, 128, 78);
  const Operand wo_b = make_operand(Enc::fp8_ue8m0, 0, c.dim, c.G * c.L, 128, 128, 79);

  // The production path.
  HostTensor o_rot = poisoned(DType::bf16, {c.T, c.H, c.D});
  HostTensor o_q = poisoned(DType::fp8_e4m3, {c.T, HD});
  HostTensor o_scale = poisoned(DType::ue8m0, {c.T, HD / 128});
  HostTensor z = poisoned(DType::bf16, {c.T, c.G * c.L});
  HostTensor y = poisoned(DType::bf16, {c.T, c.dim});
  dsv4::apply_rope(o, positions, table, /*inverse=*/true, o_rot);
  dsv4::quantize_act_fp8(TensorView(o_rot.view().data, DType::bf16, {c.T, HD}), 128, o_q, o_scale);
  dsv4::grouped_wo_a(o_q, o_scale, wo_a.values, wo_a.scale, z);
  dsv4::linear(z, {}, wo_b.values, wo_b.scale, y);

  // float64 model math, and the per-element error bound of each stage.
  const std::vector<double> od = to_doubles(o);
  std::vector<double> o_ref(od), o_err(od.size());
  for (int64_t t = 0; t < c.T; ++t) {
    const double p = static_cast<double>(positions.data<int64_t>()[t]);
    for (int64_t h = 0; h < c.H; ++h) {
      const int64_t base = (t * c.H + h) * c.D;
      for (int64_t j = 0; j < R / 2; ++j) {
        const int64_t i = base + c.D - R + 2 * j;
        reference_rotate(od[i], od[i + 1], -p * freqs[j], o_ref[i], o_ref[i + 1]);
        o_err[i] = o_err[i + 1] = std::ldexp(std::hypot(od[i], od[i + 1]), -8);
      }
    }
  }
  for (int64_t t = 0; t < c.T; ++t)
    for (int64_t b = 0; b < HD / 128; ++b) {
      double amax = 0;
      for (int64_t i = 0; i < 128; ++i) amax = std::max(amax, std::fabs(o_ref[t * HD + b * 128 + i]));
      for (int64_t i = 0; i < 128; ++i) {
        const int64_t e = t * HD + b * 128 + i;
        o_err[e] += std::ldexp(std::fabs(o_ref[e]), -4) + std::ldexp(2 * amax / 448, -10);
      }
    }
  std::vector<double> z_ref(static_cast<size_t>(c.T * c.G * c.L)), z_err(z_ref.size());
  for (int64_t t = 0; t < c.T; ++t)
    for (int64_t g = 0; g < c.G; ++g)
      for (int64_t l = 0; l < c.L; ++l) {
        double s = 0, abs_sum = 0, prop = 0;
        for (int64_t d = 0; d < Dg; ++d) {
          const double w = wo_a.real[(g * c.L + l) * Dg + d];
          const int64_t e = t * HD + g * Dg + d;
          s += o_ref[e] * w;
          abs_sum += std::fabs(o_ref[e] * w);
          prop += std::fabs(w) * o_err[e];
        }
        const int64_t k = t * c.G * c.L + g * c.L + l;
        z_ref[k] = s;
        z_err[k] = prop + std::ldexp(std::fabs(s), -8) + 1e-5 * abs_sum;
      }
  double err_sq = 0, ref_sq = 0;
  for (int64_t t = 0; t < c.T; ++t)
    for (int64_t n = 0; n < c.dim; ++n) {
      double s = 0, abs_sum = 0, prop = 0;
      for (int64_t j = 0; j < c.G * c.L; ++j) {
        const double w = wo_b.real[n * c.G * c.L + j];
        s += z_ref[t * c.G * c.L + j] * w;
        abs_sum += std::fabs(z_ref[t * c.G * c.L + j] * w);
        prop += std::fabs(w) * z_err[t * c.G * c.L + j];
      }
      const double got = at(y, t * c.dim + n);
      ASSERT_NEAR(got, s, prop + std::ldexp(std::fabs(s), -8) + 1e-5 * abs_sum) << "t " << t << " n " << n;
      err_sq += (got - s) * (got - s);
      ref_sq += s * s;
    }
  const double rel_rms = std::sqrt(err_sq / ref_sq);
  EXPECT_LT(rel_rms, std::ldexp(1.0, -5));
  EXPECT_GT(rel_rms, 0.0);  // the fp8 activations really were used
  RecordProperty("relative_rms_error", std::to_string(rel_rms));
}

// The tiny config (H 16, G 4) and V4-flash's head/group geometry (H 64, D 512, G 8), with
// smaller ranks to keep the float64 reference fast.
INSTANTIATE_TEST_SUITE_P(Configs, OutputPath,
                         ::testing::Values(Config{3, 16, 512, 4, 128, 256}, Config{2, 64, 512, 8, 256, 384}));

}  // namespace

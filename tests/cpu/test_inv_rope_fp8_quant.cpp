// inv_rope_fp8_quant (fused inverse RoPE + FP8 quantization of the attention output):
//   (1) against float64: the inverse rotation of docs/spec.md §3 in double, each value rounded to bf16,
//       then docs/spec.md §7's UE8M0 block rule — scales exact, every code within one FP8 step of the
//       float64 value at its block's scale (the op rotates in fp32: its bf16 value may differ
//       from the double one's by a bf16 ulp, 2^-8 relative, which is at most one e4m3 step);
//   (2) bit for bit, the documented composition apply_rope(inverse) into a bf16 o, then
//       quantize_act_fp8 — for every scale dtype, block and scale layout, on strided views.
// Outputs are poisoned; untouched padding and bad arguments are checked too.
#include <gtest/gtest.h>

#include <cmath>
#include <tuple>
#include <vector>

#include "dense_operands.h"
#include "dsv4/ops.h"
#include "rope_reference.h"

namespace {
using namespace dense_test;

// The transpose of a [cols, rows] tensor: a [rows, cols] view with strides {1, rows}.
TensorView transposed(const HostTensor& t) {
  TensorView v = t.view();
  std::swap(v.shape[0], v.shape[1]);
  std::swap(v.strides[0], v.strides[1]);
  return v;
}
double scale_at(const TensorView& s, int64_t t, int64_t b) {
  const int64_t i = t * s.strides[0] + b * s.strides[1];
  return s.dtype == DType::ue8m0 ? std::ldexp(1.0, static_cast<int>(static_cast<const uint8_t*>(s.data)[i]) - 127)
                                 : static_cast<const float*>(s.data)[i];
}

struct RopeInput {
  int64_t T, H, D;
  HostTensor o, positions, cos_sin;
};
RopeInput make_input(int64_t T, int64_t H, int64_t D, uint64_t seed) {
  RopeInput s{T, H, D, random_tensor(DType::bf16, {T, H, D}, seed, 0.01, 4.0), HostTensor(DType::int64, {T}),
          dsv4::build_rope_cache(yarn_rope(64), 4096)};
  for (int64_t t = 0; t < T; ++t) s.positions.data<int64_t>()[t] = (t * 977 + 5) % 4096;
  return s;
}

using Params = std::tuple<int /*block*/, DType /*scale*/, bool /*transposed scales*/>;
class InvRopeFp8Quant : public ::testing::TestWithParam<Params> {};

TEST_P(InvRopeFp8Quant, MatchesFloat64AndTheComposition) {
  const auto [block, s_dt, transpose] = GetParam();
  const RopeInput s = make_input(5, 3, 512, 7 + block);
  const int64_t HD = s.H * s.D, R = 64, nope = s.D - R, blocks = HD / block;
  HostTensor q = poisoned(DType::fp8_e4m3, {s.T, HD});
  HostTensor sbuf = transpose ? poisoned(s_dt, {blocks, s.T}) : poisoned(s_dt, {s.T, blocks});
  const TensorView scale = transpose ? transposed(sbuf) : sbuf.view();
  dsv4::inv_rope_fp8_quant(s.o, s.positions, s.cos_sin, block, q, scale);

  // (1) float64.
  const std::vector<double> f = reference_rope_freqs(yarn_rope(64));
  for (int64_t t = 0; t < s.T; ++t) {
    const double p = static_cast<double>(s.positions.data<int64_t>()[t]);
    std::vector<double> row(static_cast<size_t>(HD));
    for (int64_t h = 0; h < s.H; ++h) {
      const int64_t base = (t * s.H + h) * s.D;
      for (int64_t d = 0; d < nope; ++d) row[h * s.D + d] = at(s.o, base + d);
      for (int64_t i = 0; i < R / 2; ++i) {
        double ya, yb;
        reference_rotate(at(s.o, base + nope + 2 * i), at(s.o, base + nope + 2 * i + 1), -p * f[i], ya, yb);
        row[h * s.D + nope + 2 * i] = bf16_value(dsv4::float_to_bf16_bits(static_cast<float>(ya)));
        row[h * s.D + nope + 2 * i + 1] = bf16_value(dsv4::float_to_bf16_bits(static_cast<float>(yb)));
      }
    }
    for (int64_t b = 0; b < blocks; ++b) {
      double amax = 0;
      for (int i = 0; i < block; ++i) amax = std::max(amax, std::fabs(row[b * block + i]));
      const int k = ue8m0_exponent(amax);
      ASSERT_EQ(scale_at(scale, t, b), std::ldexp(1.0, k)) << "t " << t << " block " << b;
      for (int i = 0; i < block; ++i) {
        const int64_t c = b * block + i;
        const double got = fp8_value(q.data<uint8_t>()[t * HD + c]) * std::ldexp(1.0, k);
        const double want = row[c];
        // At least one e4m3 step at |want| (|want| / 8 >= 2^-3 of its binade; the subnormal
        // quantum 2^-9 · 2^k below 2^-6 · 2^k), which covers half a step of FP8 rounding plus
        // the bf16 difference of the fp32 rotation (2^-8 relative).
        const double step = std::ldexp(std::max(std::fabs(want), std::ldexp(1.0, k - 6)), -3);
        ASSERT_LE(std::fabs(got - want), step) << "t " << t << " col " << c;
        if (c % s.D < nope) {
          ASSERT_EQ(q.data<uint8_t>()[t * HD + c], fp8_encode(std::ldexp(want, -k)));
        }
      }
    }
  }

  // (2) bit for bit the composition apply_rope → bf16 o → quantize_act_fp8.
  HostTensor o_rot(DType::bf16, {s.T, s.H, s.D});
  dsv4::apply_rope(s.o, s.positions, s.cos_sin, /*inverse=*/true, o_rot);
  HostTensor q2 = poisoned(DType::fp8_e4m3, {s.T, HD});
  HostTensor s2 = poisoned(s_dt, {s.T, blocks});
  dsv4::quantize_act_fp8(TensorView(o_rot.data<uint16_t>(), DType::bf16, {s.T, HD}), block, q2, s2);
  EXPECT_EQ(bytes_of(q), bytes_of(q2));
  for (int64_t t = 0; t < s.T; ++t)
    for (int64_t b = 0; b < blocks; ++b) ASSERT_EQ(scale_at(scale, t, b), scale_at(s2.view(), t, b));
}

INSTANTIATE_TEST_SUITE_P(Grid, InvRopeFp8Quant,
                         ::testing::Combine(::testing::Values(64, 128), ::testing::Values(DType::ue8m0, DType::fp32),
                                            ::testing::Bool()));

// Padded heads (o a head window of a wider buffer, as vLLM pads H to 64 / 128) and a padded
// o_fp8 row: the window's result equals the unpadded one's; padding stays untouched.
TEST(InvRopeFp8QuantLayout, PaddedHeadsAndRows) {
  const RopeInput s = make_input(4, 6, 512, 21);  // 6 heads stored, 4 used
  const int64_t H = 4, HD = H * s.D;
  TensorView o = s.o.view();
  o.shape[1] = H;
  HostTensor q_buf = poisoned(DType::fp8_e4m3, {s.T, HD + 32});
  TensorView q = q_buf.view();
  q.shape[1] = HD;
  HostTensor sc = poisoned(DType::fp32, {s.T, HD / 128});
  dsv4::inv_rope_fp8_quant(o, s.positions, s.cos_sin, 128, q, sc);

  HostTensor dense(DType::bf16, {s.T, H, s.D});
  for (int64_t t = 0; t < s.T; ++t)
    for (int64_t i = 0; i < HD; ++i) dense.data<uint16_t>()[t * HD + i] = s.o.data<uint16_t>()[t * 6 * s.D + i];
  HostTensor q2 = poisoned(DType::fp8_e4m3, {s.T, HD}), sc2 = poisoned(DType::fp32, {s.T, HD / 128});
  dsv4::inv_rope_fp8_quant(dense, s.positions, s.cos_sin, 128, q2, sc2);
  for (int64_t t = 0; t < s.T; ++t) {
    for (int64_t i = 0; i < HD; ++i) ASSERT_EQ(q_buf.data<uint8_t>()[t * (HD + 32) + i], q2.data<uint8_t>()[t * HD + i]);
    for (int64_t i = HD; i < HD + 32; ++i) ASSERT_EQ(q_buf.data<uint8_t>()[t * (HD + 32) + i], 0xFF) << "padding written";
  }
  EXPECT_EQ(bytes_of(sc), bytes_of(sc2));
}

TEST(InvRopeFp8QuantErrors, RejectBadArgumentsAndWriteNothing) {
  const RopeInput s = make_input(2, 2, 512, 3);
  HostTensor q = poisoned(DType::fp8_e4m3, {2, 1024}), sc = poisoned(DType::fp32, {2, 8});
  HostTensor o32(DType::fp32, {2, 2, 512}), o_odd(DType::bf16, {2, 2, 448});
  HostTensor q_odd = poisoned(DType::fp8_e4m3, {2, 896}), sc_odd = poisoned(DType::fp32, {2, 7});
  HostTensor far(DType::int64, {2});
  far.data<int64_t>()[0] = 0;
  far.data<int64_t>()[1] = 5000;
  HostTensor sc_overlap = poisoned(DType::fp32, {2, 8});
  TensorView overlapping = sc_overlap.view();
  overlapping.strides[0] = 1;  // rows one element apart: elements overlap
  const auto before = bytes_of(q), before_s = bytes_of(sc);
  expect_error([&] { dsv4::inv_rope_fp8_quant(s.o, s.positions, s.cos_sin, 32, q, sc); },
               {"inv_rope_fp8_quant", "block", "64 or 128"});
  expect_error([&] { dsv4::inv_rope_fp8_quant(o32, s.positions, s.cos_sin, 128, q, sc); },
               {"inv_rope_fp8_quant", "o.dtype", "bf16"});
  expect_error([&] { dsv4::inv_rope_fp8_quant(o_odd, s.positions, s.cos_sin, 128, q_odd, sc_odd); },
               {"inv_rope_fp8_quant", "o.shape[2]", "multiple of block"});
  expect_error([&] { dsv4::inv_rope_fp8_quant(s.o, far, s.cos_sin, 128, q, sc); },
               {"inv_rope_fp8_quant", "positions[1]", "5000"});
  expect_error([&] { dsv4::inv_rope_fp8_quant(s.o, s.positions, s.cos_sin, 128, q, overlapping); },
               {"inv_rope_fp8_quant", "o_scale", "overlap"});
  expect_error([&] { dsv4::inv_rope_fp8_quant(s.o, s.positions, s.cos_sin, 64, q, sc); },
               {"inv_rope_fp8_quant", "o_scale.shape", "[2, 16]"});
  expect_error([&] { dsv4::inv_rope_fp8_quant(s.o, s.positions, s.cos_sin, 128, on_cuda(q), sc); },
               {"inv_rope_fp8_quant", "device"});
  EXPECT_EQ(bytes_of(q), before);
  EXPECT_EQ(bytes_of(sc), before_s);
}

}  // namespace

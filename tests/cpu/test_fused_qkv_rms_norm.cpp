// fused_qkv_rms_norm against two float64 RMSNorms written here, including the production layout
// where q and kv are column windows of one [T, q_lora + D] projection output normalized in place.
// Tolerances as in test_rms_norm.cpp: 2^-8 relative per element for bf16 outputs, 1e-5 for fp32.
#include <gtest/gtest.h>

#include <tuple>
#include <vector>

#include "dense_operands.h"
#include "dsv4/ops.h"

namespace {
using namespace dense_test;

constexpr float kEps = 1e-6f;

// Checks rows [T, cols] of `got` (element (t, i) at t * ld + off + i) against float64 RMSNorm
// of the same window of `in`.
void expect_normalized(const HostTensor& got, const std::vector<double>& in, const std::vector<double>& w,
                       int64_t T, int64_t cols, int64_t ld, int64_t off, int64_t got_ld, int64_t got_off,
                       DType dt) {
  const double rel = dt == DType::bf16 ? std::ldexp(1.0, -8) : 1e-5;
  for (int64_t t = 0; t < T; ++t) {
    double ss = 0;
    for (int64_t i = 0; i < cols; ++i) ss += in[t * ld + off + i] * in[t * ld + off + i];
    const double inv = 1.0 / std::sqrt(ss / cols + kEps);
    for (int64_t i = 0; i < cols; ++i) {
      const double want = in[t * ld + off + i] * inv * w[i];
      ASSERT_NEAR(at(got, t * got_ld + got_off + i), want, rel * std::fabs(want) + 1e-30)
          << "t " << t << " i " << i;
    }
  }
}

using Params = std::tuple<int64_t /*T*/, int64_t /*q_lora*/, int64_t /*D*/, DType, bool /*in place*/>;
class FusedQkvRmsNorm : public ::testing::TestWithParam<Params> {};

TEST_P(FusedQkvRmsNorm, MatchesFloat64) {
  const auto [T, Q, D, dt, in_place] = GetParam();
  // One projection output [T, Q + D]: q is columns [0, Q), kv columns [Q, Q + D).
  HostTensor qkv = random_tensor(dt, {T, Q + D}, 5 + T + Q);
  const std::vector<double> in = to_doubles(qkv);
  HostTensor wq = random_tensor(DType::bf16, {Q}, 6, 0.5, 1.5);
  HostTensor wkv = random_tensor(DType::bf16, {D}, 7, 0.5, 1.5);
  TensorView q_in = qkv.view(), kv_in = qkv.view();
  q_in.shape[1] = Q;
  kv_in.shape[1] = D;
  kv_in.data = static_cast<char*>(qkv.view().data) + Q * dsv4::dtype_size(dt);
  HostTensor q_out = poisoned(dt, {T, Q}), kv_out = poisoned(dt, {T, D});
  if (in_place) {
    dsv4::fused_qkv_rms_norm(q_in, wq, kv_in, wkv, kEps, q_in, kv_in);
    expect_normalized(qkv, in, to_doubles(wq), T, Q, Q + D, 0, Q + D, 0, dt);
    expect_normalized(qkv, in, to_doubles(wkv), T, D, Q + D, Q, Q + D, Q, dt);
  } else {
    dsv4::fused_qkv_rms_norm(q_in, wq, kv_in, wkv, kEps, q_out, kv_out);
    expect_normalized(q_out, in, to_doubles(wq), T, Q, Q + D, 0, Q, 0, dt);
    expect_normalized(kv_out, in, to_doubles(wkv), T, D, Q + D, Q, D, 0, dt);
    EXPECT_EQ(to_doubles(qkv), in) << "inputs modified";
  }
}

INSTANTIATE_TEST_SUITE_P(Grid, FusedQkvRmsNorm,
                         ::testing::Combine(::testing::Values<int64_t>(1, 9), ::testing::Values<int64_t>(128, 1024),
                                            ::testing::Values<int64_t>(512, 576),
                                            ::testing::Values(DType::bf16, DType::fp32), ::testing::Bool()));

// The FP8 q for an FP8 wq_b (block 128, any scale layout): the codes and scales are exactly
// quantize_act_fp8 of q_out's values (bf16, or fp32), or of the normed row rounded to bf16 when
// q_out is omitted — checked against the float64 norm + docs/spec.md §7 block rule written here (the
// float64 norm may round to a neighbouring bf16 value: one FP8 step at most) and bit for bit
// against the two-op composition. kv is unaffected by the FP8 output.
using Fp8Params = std::tuple<DType /*q_out*/, bool /*with q_out*/, DType /*scale*/, bool /*transposed*/>;
class FusedQkvRmsNormFp8 : public ::testing::TestWithParam<Fp8Params> {};

TEST_P(FusedQkvRmsNormFp8, QuantizesTheNormedQ) {
  const auto [q_dt, with_q_out, s_dt, transposed] = GetParam();
  const int64_t T = 5, Q = 1024, D = 512, B = Q / 128;
  HostTensor q = random_tensor(DType::fp32, {T, Q}, 31, 0.01, 8.0), kv = random_tensor(DType::fp32, {T, D}, 32);
  HostTensor wq = random_tensor(DType::bf16, {Q}, 33, 0.5, 1.5), wkv = random_tensor(DType::bf16, {D}, 34, 0.5, 1.5);
  HostTensor q_out = poisoned(q_dt, {T, Q}), kv_out = poisoned(DType::bf16, {T, D});
  HostTensor q8 = poisoned(DType::fp8_e4m3, {T, Q});
  HostTensor sbuf = transposed ? poisoned(s_dt, {B, T}) : poisoned(s_dt, {T, B});
  TensorView q_scale = sbuf.view();
  if (transposed) {
    std::swap(q_scale.shape[0], q_scale.shape[1]);
    std::swap(q_scale.strides[0], q_scale.strides[1]);
  }
  dsv4::fused_qkv_rms_norm(q, wq, kv, wkv, kEps, with_q_out ? q_out.view() : TensorView{}, kv_out, q8, q_scale,
                           nullptr);

  // Float64: the normed row, rounded to q_out's dtype (bf16 without q_out), then the block rule.
  const std::vector<double> in = to_doubles(q), w = to_doubles(wq);
  const bool bf16_values = !with_q_out || q_dt == DType::bf16;
  for (int64_t t = 0; t < T; ++t) {
    double ss = 0;
    for (int64_t i = 0; i < Q; ++i) ss += in[t * Q + i] * in[t * Q + i];
    const double inv = 1.0 / std::sqrt(ss / Q + kEps);
    for (int64_t b = 0; b < B; ++b) {
      std::vector<double> v(128);
      double amax = 0;
      for (int i = 0; i < 128; ++i) {
        const double x = in[t * Q + b * 128 + i] * inv * w[b * 128 + i];
        v[i] = bf16_values ? bf16_value(dsv4::float_to_bf16_bits(static_cast<float>(x))) : x;
        amax = std::max(amax, std::fabs(v[i]));
      }
      const int k = ue8m0_exponent(amax);
      const int64_t si = t * q_scale.strides[0] + b * q_scale.strides[1];
      const double scale = s_dt == DType::ue8m0 ? std::ldexp(1.0, sbuf.data<uint8_t>()[si] - 127)
                                                : sbuf.data<float>()[si];
      ASSERT_EQ(scale, std::ldexp(1.0, k)) << "t " << t << " block " << b;
      for (int i = 0; i < 128; ++i) {
        const double got = fp8_value(q8.data<uint8_t>()[t * Q + b * 128 + i]) * scale;
        const double step = std::ldexp(std::max(std::fabs(v[i]), std::ldexp(scale, -6)), -3);
        ASSERT_LE(std::fabs(got - v[i]), step) << "t " << t << " i " << b * 128 + i;
      }
    }
  }
  // Bit for bit: fused_qkv_rms_norm without the FP8 output, then quantize_act_fp8.
  HostTensor q_ref = poisoned(with_q_out ? q_dt : DType::bf16, {T, Q}), kv_ref = poisoned(DType::bf16, {T, D});
  dsv4::fused_qkv_rms_norm(q, wq, kv, wkv, kEps, q_ref, kv_ref);
  HostTensor q8_ref = poisoned(DType::fp8_e4m3, {T, Q}), s_ref = poisoned(s_dt, {T, B});
  dsv4::quantize_act_fp8(q_ref, 128, q8_ref, s_ref);
  EXPECT_EQ(bytes_of(q8), bytes_of(q8_ref));
  for (int64_t t = 0; t < T; ++t)
    for (int64_t b = 0; b < B; ++b) {
      const int64_t si = t * q_scale.strides[0] + b * q_scale.strides[1];
      if (s_dt == DType::ue8m0) {
        ASSERT_EQ(sbuf.data<uint8_t>()[si], s_ref.data<uint8_t>()[t * B + b]);
      } else {
        ASSERT_EQ(sbuf.data<float>()[si], s_ref.data<float>()[t * B + b]);
      }
    }
  EXPECT_EQ(bytes_of(kv_out), bytes_of(kv_ref));
  if (with_q_out) {
    EXPECT_EQ(bytes_of(q_out), bytes_of(q_ref));
  }
}

INSTANTIATE_TEST_SUITE_P(Grid, FusedQkvRmsNormFp8,
                         ::testing::Combine(::testing::Values(DType::bf16, DType::fp32), ::testing::Bool(),
                                            ::testing::Values(DType::ue8m0, DType::fp32), ::testing::Bool()));

TEST(FusedQkvRmsNormFp8Errors, RejectBadArgumentsAndWriteNothing) {
  HostTensor q = random_tensor(DType::bf16, {3, 256}, 1), kv = random_tensor(DType::bf16, {3, 512}, 2);
  HostTensor wq = random_tensor(DType::bf16, {256}, 3), wkv = random_tensor(DType::bf16, {512}, 4);
  HostTensor kv_out = poisoned(DType::bf16, {3, 512}), q8 = poisoned(DType::fp8_e4m3, {3, 256});
  HostTensor sc = poisoned(DType::fp32, {3, 2}), sc_bad = poisoned(DType::fp32, {3, 4});
  HostTensor q_odd = random_tensor(DType::bf16, {3, 192}, 5), wq_odd = random_tensor(DType::bf16, {192}, 6);
  HostTensor q8_odd = poisoned(DType::fp8_e4m3, {3, 192}), sc_odd = poisoned(DType::fp32, {3, 1});
  const auto kv_before = bytes_of(kv_out), q8_before = bytes_of(q8);
  expect_error([&] { dsv4::fused_qkv_rms_norm(q, wq, kv, wkv, kEps, {}, kv_out, q8, sc_bad, nullptr); },
               {"fused_qkv_rms_norm", "q_scale.shape", "[3, 2]"});
  expect_error([&] { dsv4::fused_qkv_rms_norm(q_odd, wq_odd, kv, wkv, kEps, {}, kv_out, q8_odd, sc_odd, nullptr); },
               {"fused_qkv_rms_norm", "q_fp8.shape[1]", "multiple of block"});
  expect_error([&] { dsv4::fused_qkv_rms_norm(q, wq, kv, wkv, kEps, {}, kv_out, q8, {}, nullptr); },
               {"fused_qkv_rms_norm", "q_scale"});
  expect_error([&] { dsv4::fused_qkv_rms_norm(q, wq, kv, wkv, kEps, {}, kv_out, {}, {}, nullptr); },
               {"fused_qkv_rms_norm", "q_out", "expected a tensor"});
  EXPECT_EQ(bytes_of(kv_out), kv_before);
  EXPECT_EQ(bytes_of(q8), q8_before);
}

TEST(FusedQkvRmsNormErrors, RejectBadArgumentsAndWriteNothing) {
  HostTensor q = random_tensor(DType::bf16, {3, 128}, 1), kv = random_tensor(DType::bf16, {3, 512}, 2);
  HostTensor wq = random_tensor(DType::bf16, {128}, 3), wkv = random_tensor(DType::bf16, {512}, 4);
  HostTensor q_out = poisoned(DType::bf16, {3, 128}), kv_out = poisoned(DType::bf16, {3, 512});
  HostTensor kv_t = random_tensor(DType::bf16, {4, 512}, 5), kv_out_t = poisoned(DType::bf16, {4, 512});
  HostTensor wkv_len = random_tensor(DType::bf16, {511}, 6);
  const auto q_before = bytes_of(q_out), kv_before = bytes_of(kv_out), kv_in_before = bytes_of(kv);
  TensorView q_into_kv = kv.view();  // q_out written over kv_in
  q_into_kv.shape[1] = 128;

  expect_error([&] { dsv4::fused_qkv_rms_norm(q, {}, kv, wkv, kEps, q_out, kv_out); },
               {"fused_qkv_rms_norm", "wq", "expected a tensor"});
  expect_error([&] { dsv4::fused_qkv_rms_norm(q, wq, kv, wkv_len, kEps, q_out, kv_out); }, {"wkv.shape"});
  expect_error([&] { dsv4::fused_qkv_rms_norm(q, wq, kv_t, wkv, kEps, q_out, kv_out_t); },
               {"kv_in.shape[0]", "expected 3", "got 4"});
  expect_error([&] { dsv4::fused_qkv_rms_norm(q, wq, kv, wkv, kEps, q_into_kv, kv_out); },
               {"q_out", "disjoint from kv_in"});
  expect_error([&] { dsv4::fused_qkv_rms_norm(q, wq, kv, wkv, kEps, q_out, on_cuda(kv_out)); }, {"device"});
  EXPECT_EQ(bytes_of(q_out), q_before);
  EXPECT_EQ(bytes_of(kv_out), kv_before);
  EXPECT_EQ(bytes_of(kv), kv_in_before);
  EXPECT_EQ(bytes_of(kv_out_t), std::vector<uint8_t>(kv_out_t.nbytes(), 0xFF));
}

}  // namespace

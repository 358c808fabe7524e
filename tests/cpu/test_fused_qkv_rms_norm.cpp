// fused_qkv_rms_norm against two float64 RMSNorms written here, including the production layout
// where q and kv are column windows of one [T, q_lora + D] projection output normalized in place.
// Tolerances as in test_rms_norm.cpp: 2^-8 relative per element for bf16 outputs, 1e-5 for fp32.
#include <gtest/gtest.h>

#include <tuple>
#include <vector>

#include "dense_test_support.h"
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

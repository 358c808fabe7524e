// quantize_act_fp8 against the docs/spec.md §7 rule computed here in float64: per row and block,
// k = ceil(log2(max(amax/448, 1e-4))), xq = fp8_rne(x / 2^k). The fp8 path is exact by
// construction (x / 2^k is exact in float64, and the test's own fp8 rounding is the definition),
// so bytes and scales must match bit for bit.
#include <gtest/gtest.h>

#include <cmath>
#include <tuple>

#include "cuda_dispatch_support.h"
#include "dense_operands.h"
#include "dsv4/ops.h"

namespace {
using namespace dense_test;


using Params = std::tuple<int64_t /*T*/, int64_t /*K*/, int /*block*/, DType /*x*/, DType /*scale*/>;
class QuantizeActFp8 : public ::testing::TestWithParam<Params> {};

TEST_P(QuantizeActFp8, MatchesFloat64Rule) {
  const auto [T, K, block, x_dt, s_dt] = GetParam();
  HostTensor x = random_tensor(x_dt, {T, K}, 11 + T * K);
  shape_blocks(x, T, K, block, 5 + K);
  HostTensor xq = poisoned(DType::fp8_e4m3, {T, K});
  HostTensor scale = poisoned(s_dt, {T, K / block});
  dsv4::quantize_act_fp8(x, block, xq, scale);

  for (int64_t t = 0; t < T; ++t)
    for (int64_t b = 0; b < K / block; ++b) {
      double amax = 0;
      for (int i = 0; i < block; ++i) amax = std::max(amax, std::fabs(at(x, t * K + b * block + i)));
      const int k = ue8m0_exponent(amax);
      const int64_t s = t * (K / block) + b;
      if (s_dt == DType::ue8m0)
        ASSERT_EQ(scale.data<uint8_t>()[s], k + 127) << "t " << t << " block " << b;
      else
        ASSERT_EQ(scale.data<float>()[s], std::ldexp(1.0, k)) << "t " << t << " block " << b;
      for (int i = 0; i < block; ++i) {
        const int64_t e = t * K + b * block + i;
        const int want = fp8_encode(std::ldexp(at(x, e), -k));
        ASSERT_EQ(xq.data<uint8_t>()[e], want) << "t " << t << " i " << b * block + i
                                               << " x " << at(x, e) << " k " << k;
      }
    }
}

INSTANTIATE_TEST_SUITE_P(
    Grid, QuantizeActFp8,
    ::testing::Combine(::testing::Values<int64_t>(1, 3, 17), ::testing::Values<int64_t>(128, 512, 4096),
                       ::testing::Values(64, 128), ::testing::Values(DType::bf16, DType::fp32),
                       ::testing::Values(DType::ue8m0, DType::fp32)));

// Strided rows: x is a column window of a wider matrix and xq / scale have padded rows; padding
// must stay untouched.
TEST(QuantizeActFp8Layout, StridedRowsLeavePaddingAlone) {
  const int64_t T = 4, K = 256, block = 128;
  HostTensor wide = random_tensor(DType::bf16, {T, K + 64}, 3);
  TensorView x = wide.view();
  x.data = wide.data<uint16_t>() + 32;
  x.shape[1] = K;
  HostTensor xq_buf = poisoned(DType::fp8_e4m3, {T, K + 16});
  HostTensor s_buf = poisoned(DType::ue8m0, {T, 4});
  TensorView xq = xq_buf.view(), sc = s_buf.view();
  xq.shape[1] = K;
  sc.shape[1] = K / block;
  dsv4::quantize_act_fp8(x, static_cast<int>(block), xq, sc);
  for (int64_t t = 0; t < T; ++t) {
    for (int64_t b = 0; b < K / block; ++b) {
      double amax = 0;
      for (int i = 0; i < block; ++i) amax = std::max(amax, std::fabs(at(wide, t * (K + 64) + 32 + b * block + i)));
      const int k = ue8m0_exponent(amax);
      EXPECT_EQ(s_buf.data<uint8_t>()[t * 4 + b], k + 127);
      for (int i = 0; i < block; ++i)
        EXPECT_EQ(xq_buf.data<uint8_t>()[t * (K + 16) + b * block + i],
                  fp8_encode(std::ldexp(at(wide, t * (K + 64) + 32 + b * block + i), -k)));
    }
    for (int64_t i = K; i < K + 16; ++i) EXPECT_EQ(xq_buf.data<uint8_t>()[t * (K + 16) + i], 0xFF);
    for (int64_t b = K / block; b < 4; ++b) EXPECT_EQ(s_buf.data<uint8_t>()[t * 4 + b], 0xFF);
  }
}

// Scales at any strides: the transpose of a contiguous [K / block, T] buffer (the CUDA FP8
// GEMMs' layout) receives exactly the row-major result, transposed.
TEST(QuantizeActFp8Layout, TransposedScales) {
  const int64_t T = 6, K = 512, block = 128;
  HostTensor x = random_tensor(DType::bf16, {T, K}, 41);
  shape_blocks(x, T, K, block, 42);
  HostTensor xq = poisoned(DType::fp8_e4m3, {T, K}), sc = poisoned(DType::fp32, {T, K / block});
  dsv4::quantize_act_fp8(x, static_cast<int>(block), xq, sc);
  HostTensor xq_t = poisoned(DType::fp8_e4m3, {T, K}), sc_buf = poisoned(DType::fp32, {K / block, T});
  TensorView sc_t = sc_buf.view();
  std::swap(sc_t.shape[0], sc_t.shape[1]);
  std::swap(sc_t.strides[0], sc_t.strides[1]);
  dsv4::quantize_act_fp8(x, static_cast<int>(block), xq_t, sc_t);
  EXPECT_EQ(bytes_of(xq_t), bytes_of(xq));
  for (int64_t t = 0; t < T; ++t)
    for (int64_t b = 0; b < K / block; ++b)
      ASSERT_EQ(sc_buf.data<float>()[b * T + t], sc.data<float>()[t * (K / block) + b]) << t << " " << b;
}

// Each bad argument throws the documented error and writes nothing.
TEST(QuantizeActFp8Errors, RejectBadArgumentsAndWriteNothing) {
  HostTensor x = random_tensor(DType::bf16, {2, 256}, 1);
  HostTensor xq = poisoned(DType::fp8_e4m3, {2, 256});
  HostTensor sc = poisoned(DType::ue8m0, {2, 2});
  HostTensor bad_q = poisoned(DType::bf16, {2, 256});
  HostTensor sc64 = poisoned(DType::ue8m0, {2, 4});
  HostTensor fp8_x = poisoned(DType::fp8_e4m3, {2, 256});
  HostTensor x_odd = random_tensor(DType::fp32, {2, 200}, 2);
  HostTensor q_odd = poisoned(DType::fp8_e4m3, {2, 200});
  TensorView strided = x.view();
  strided.shape[1] = 128;
  strided.strides[1] = 2;
  HostTensor xq128 = poisoned(DType::fp8_e4m3, {2, 128});
  HostTensor sc1 = poisoned(DType::ue8m0, {2, 1});
  const auto before_q = bytes_of(xq), before_s = bytes_of(sc);

  expect_error([&] { dsv4::quantize_act_fp8(x, 32, xq, sc); }, {"quantize_act_fp8", "block", "64 or 128"});
  expect_error([&] { dsv4::quantize_act_fp8(x, 128, bad_q, sc); }, {"xq.dtype", "fp8_e4m3", "bf16"});
  expect_error([&] { dsv4::quantize_act_fp8(x, 128, xq, sc64); }, {"scale.shape", "[2, 2]", "[2, 4]"});
  expect_error([&] { dsv4::quantize_act_fp8(fp8_x, 128, xq, sc); }, {"x.dtype", "bf16 or fp32"});
  expect_error([&] { dsv4::quantize_act_fp8(x_odd, 128, q_odd, sc); }, {"x.shape[1]", "multiple of block"});
  expect_error([&] { dsv4::quantize_act_fp8(strided, 128, xq128, sc1); }, {"x.stride(-1)", "expected 1"});
  expect_error([&] { dsv4::quantize_act_fp8(x, 128, xq, TensorView{}); }, {"scale", "empty view"});
  expect_error([&] { dsv4::quantize_act_fp8(on_cuda(x), 128, xq, sc); }, {"xq.device", "cuda"});
  dsv4::test::expect_cuda_dispatch("quantize_act_fp8", dsv4::ops::kQuantizeActFp8,
                                    [&] { dsv4::quantize_act_fp8(on_cuda(x), 128, on_cuda(xq), on_cuda(sc)); });
  EXPECT_EQ(bytes_of(xq), before_q);
  EXPECT_EQ(bytes_of(sc), before_s);
  EXPECT_EQ(bytes_of(xq128), std::vector<uint8_t>(xq128.nbytes(), 0xFF));
}

}  // namespace

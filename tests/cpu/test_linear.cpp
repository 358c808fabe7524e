// linear (y = x · Wᵀ) against a float64 GEMM written in the test, over shapes (including the
// 4096 → 1024 projection), every operand encoding (bf16 / fp32 / fp8 with ue8m0 or fp32 block
// scales, fp8 activations with 1×64 / 1×128 scales) and both output types. Tolerances:
// dense_operands.h gemm_tolerance.
#include <gtest/gtest.h>
#include <omp.h>

#include <sstream>
#include <tuple>
#include <vector>

#include "cuda_dispatch_support.h"
#include "dense_operands.h"
#include "dsv4/ops.h"
#include "dsv4/weights.h"

namespace {
using namespace dense_test;

struct Shape {
  int64_t T, K, N;
};
// Activation encoding with its scale block (fp8 only).
struct XEnc {
  Enc enc;
  int64_t block;
};

using Params = std::tuple<Shape, XEnc, Enc /*w*/, DType /*y*/>;
class Linear : public ::testing::TestWithParam<Params> {};

TEST_P(Linear, MatchesFloat64) {
  const auto [shape, xenc, wenc, y_dt] = GetParam();
  const auto [T, K, N] = shape;
  const Operand x = make_operand(xenc.enc, 0, T, K, 1, xenc.block, 100 + T + K);
  const Operand w = make_operand(wenc, 0, N, K, 128, 128, 200 + N + K);
  HostTensor y = poisoned(y_dt, {T, N});
  dsv4::linear(x.values, x.scale, w.values, w.scale, y);

  const GemmReference ref = reference_gemm(x.real, 0, K, w.real, 0, T, N, K);
  for (int64_t i = 0; i < T * N; ++i) {
    const double want = ref.y[static_cast<size_t>(i)];
    ASSERT_NEAR(at(y, i), want, gemm_tolerance(y_dt, want, ref.abs_sum[static_cast<size_t>(i)]))
        << "t " << i / N << " n " << i % N;
  }
}

// Every encoding combination on small shapes (T over several 64-row tiles, N and K not
// multiples of the 64/128 tiles and scale blocks), and the production encodings on the real
// 4096 → 1024 projection. Activation blocks that do not divide K are left out.
std::vector<Params> linear_grid() {
  std::vector<Params> grid;
  const XEnc xs[] = {{Enc::bf16, 0}, {Enc::fp32, 0}, {Enc::fp8_ue8m0, 128}, {Enc::fp8_ue8m0, 64},
                     {Enc::fp8_fp32, 128}};
  const Enc ws[] = {Enc::bf16, Enc::fp32, Enc::fp8_ue8m0, Enc::fp8_fp32};
  for (const Shape s : {Shape{1, 256, 128}, Shape{5, 320, 200}, Shape{70, 128, 64}, Shape{131, 384, 96}})
    for (const XEnc x : xs)
      for (const Enc w : ws)
        for (const DType y : {DType::bf16, DType::fp32})
          if (!is_fp8(x.enc) || s.K % x.block == 0) grid.emplace_back(s, x, w, y);
  for (const XEnc x : {XEnc{Enc::bf16, 0}, XEnc{Enc::fp8_ue8m0, 128}})
    for (const Enc w : {Enc::bf16, Enc::fp8_ue8m0})
      grid.emplace_back(Shape{3, 4096, 1024}, x, w, DType::bf16);
  return grid;
}

INSTANTIATE_TEST_SUITE_P(
    Grid, Linear, ::testing::ValuesIn(linear_grid()),
    [](const auto& info) {
      const Shape s = std::get<0>(info.param);
      const XEnc x = std::get<1>(info.param);
      std::ostringstream name;
      name << "T" << s.T << "_K" << s.K << "_N" << s.N << "_x" << enc_name(x.enc);
      if (x.block) name << x.block;
      name << "_w" << enc_name(std::get<2>(info.param)) << "_y"
           << dsv4::dtype_name(std::get<3>(info.param));
      return name.str();
    });

// The CUDA FP8 GEMMs' scale layouts, taken by the CPU too: x_scale as the transpose of a
// contiguous [K/128, T] buffer and w_scale with rows padded to a multiple of 4 (cuda_weight_scale
// with a 3-block-wide grid): the same float64 result.
TEST(LinearLayout, CudaScaleLayouts) {
  const int64_t T = 9, K = 384, N = 200;
  const Operand x = make_operand(Enc::fp8_fp32, 0, T, K, 1, 128, 51);
  const Operand w = make_operand(Enc::fp8_ue8m0, 0, N, K, 128, 128, 52);
  HostTensor xs_buf(DType::fp32, {K / 128, T});
  for (int64_t t = 0; t < T; ++t)
    for (int64_t b = 0; b < K / 128; ++b) xs_buf.data<float>()[b * T + t] = x.scale.data<float>()[t * (K / 128) + b];
  TensorView xs = xs_buf.view();
  std::swap(xs.shape[0], xs.shape[1]);
  std::swap(xs.strides[0], xs.strides[1]);
  const HostTensor ws_buf = dsv4::cuda_weight_scale(dsv4::Weight{w.values, w.scale});
  ASSERT_EQ(ws_buf.shape(), (std::vector<int64_t>{2, dsv4::fp8_weight_scale_row_stride(K)}));
  TensorView ws = ws_buf.view();
  ws.shape[1] = 3;
  HostTensor y = poisoned(DType::fp32, {T, N});
  dsv4::linear(x.values, xs, w.values, ws, y);
  const GemmReference ref = reference_gemm(x.real, 0, K, w.real, 0, T, N, K);
  for (int64_t i = 0; i < T * N; ++i)
    ASSERT_NEAR(at(y, i), ref.y[i], gemm_tolerance(DType::fp32, ref.y[i], ref.abs_sum[i])) << i;
  for (int64_t r = 0; r < 2; ++r) EXPECT_EQ(ws_buf.data<float>()[r * 4 + 3], 1.0f) << "padding";
}

// Strided operands: x is a column window of a wider matrix (like qr/kv split from one
// projection), y has padded rows whose padding must stay untouched.
TEST(LinearLayout, StridedViewsAndUntouchedPadding) {
  const int64_t T = 6, K = 256, N = 72, pad = 40;
  HostTensor wide = random_tensor(DType::bf16, {T, K + pad}, 9);
  TensorView x = wide.view();
  x.data = wide.data<uint16_t>() + pad;
  x.shape[1] = K;
  const Operand w = make_operand(Enc::fp8_ue8m0, 0, N, K, 128, 128, 10);
  HostTensor y_buf = poisoned(DType::fp32, {T, N + 8});
  TensorView y = y_buf.view();
  y.shape[1] = N;
  dsv4::linear(x, {}, w.values, w.scale, y);
  const std::vector<double> xd = to_doubles(wide);
  const GemmReference ref = reference_gemm(xd, pad, K + pad, w.real, 0, T, N, K);
  for (int64_t t = 0; t < T; ++t) {
    for (int64_t n = 0; n < N; ++n) {
      const double want = ref.y[static_cast<size_t>(t * N + n)];
      EXPECT_NEAR(at(y_buf, t * (N + 8) + n), want,
                  gemm_tolerance(DType::fp32, want, ref.abs_sum[static_cast<size_t>(t * N + n)]));
    }
    for (int64_t n = N; n < N + 8; ++n) EXPECT_TRUE(std::isnan(at(y_buf, t * (N + 8) + n)));
  }
}

// Results are bit-identical whatever the thread count (fixed accumulation order).
TEST(LinearLayout, DeterministicAcrossThreadCounts) {
  const Operand x = make_operand(Enc::fp8_ue8m0, 0, 67, 512, 1, 128, 1);
  const Operand w = make_operand(Enc::fp8_fp32, 0, 130, 512, 128, 128, 2);
  HostTensor y1 = poisoned(DType::fp32, {67, 130}), y2 = poisoned(DType::fp32, {67, 130});
  const int saved = omp_get_max_threads();
  omp_set_num_threads(1);
  dsv4::linear(x.values, x.scale, w.values, w.scale, y1);
  omp_set_num_threads(3);
  dsv4::linear(x.values, x.scale, w.values, w.scale, y2);
  omp_set_num_threads(saved);
  EXPECT_EQ(bytes_of(y1), bytes_of(y2));
}

TEST(LinearErrors, RejectBadArgumentsAndWriteNothing) {
  const Operand x = make_operand(Enc::bf16, 0, 4, 256, 1, 1, 1);
  const Operand xq = make_operand(Enc::fp8_ue8m0, 0, 4, 256, 1, 128, 2);
  const Operand w = make_operand(Enc::fp8_ue8m0, 0, 64, 256, 128, 128, 3);
  const Operand wb = make_operand(Enc::bf16, 0, 64, 256, 128, 128, 4);
  HostTensor y = poisoned(DType::bf16, {4, 64});
  const auto before = bytes_of(y);
  HostTensor y_bad = poisoned(DType::bf16, {4, 63});
  HostTensor y_fp8 = poisoned(DType::fp8_e4m3, {4, 64});
  HostTensor w_k = random_tensor(DType::bf16, {64, 255}, 5);
  HostTensor ws_bad(DType::ue8m0, {1, 1});
  HostTensor xs_32(DType::ue8m0, {4, 8});
  TensorView x_strided = x.values.view();
  x_strided.shape[1] = 128;
  x_strided.strides[1] = 2;
  TensorView y_alias = x.values.view();
  y_alias.shape[1] = 64;

  expect_error([&] { dsv4::linear(x.values, {}, w_k, {}, y); }, {"linear", "w.shape[1]", "256", "255"});
  expect_error([&] { dsv4::linear(x.values, {}, w.values, w.scale, y_bad); }, {"y.shape", "[4, 64]"});
  expect_error([&] { dsv4::linear(x.values, {}, wb.values, {}, y_fp8); }, {"y.dtype", "bf16 or fp32"});
  expect_error([&] { dsv4::linear(x.values, xq.scale, wb.values, {}, y); }, {"x_scale", "empty view"});
  expect_error([&] { dsv4::linear(xq.values, {}, wb.values, {}, y); }, {"x_scale", "expected a tensor"});
  expect_error([&] { dsv4::linear(xq.values, xs_32, wb.values, {}, y); }, {"x_scale.shape[1]", "got 8"});
  expect_error([&] { dsv4::linear(x.values, {}, w.values, {}, y); }, {"w_scale", "expected a tensor"});
  expect_error([&] { dsv4::linear(x.values, {}, w.values, ws_bad, y); }, {"w_scale.shape", "[1, 2]"});
  expect_error([&] { dsv4::linear(x.values, {}, wb.values, w.scale, y); }, {"w_scale", "empty view"});
  expect_error([&] { dsv4::linear(x_strided, {}, make_operand(Enc::bf16, 0, 64, 128, 1, 1, 6).values, {}, y); },
               {"x.stride(-1)"});
  expect_error([&] { dsv4::linear(x.values, {}, wb.values, {}, y_alias); }, {"y", "disjoint from x"});
  TensorView y_broadcast = y.view();  // every row at the same address
  y_broadcast.strides[0] = 0;
  expect_error([&] { dsv4::linear(x.values, {}, wb.values, {}, y_broadcast); }, {"y", "do not overlap", "stride of 0"});
  expect_error([&] { dsv4::linear(on_cuda(x.values), {}, wb.values, {}, y); }, {"device", "cuda", "cpu"});
  dsv4::test::expect_cuda_dispatch("linear", dsv4::ops::kLinear,
                                    [&] { dsv4::linear(on_cuda(x.values), {}, on_cuda(wb.values), {}, on_cuda(y)); });
  EXPECT_EQ(bytes_of(y), before);
  EXPECT_EQ(bytes_of(y_bad), std::vector<uint8_t>(y_bad.nbytes(), 0xFF));
}

}  // namespace

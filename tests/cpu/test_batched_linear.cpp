// batched_linear against a float64 batched GEMM written in the test (y[b] = x[b] · w[b]ᵀ), in the
// layout the V3.2 layer uses it: the heads of a [T, H, d] activation as the batch (x's batch
// stride d, row stride H·d) written into the heads of a wider [T, Hp, d'] output, whose other
// elements must stay untouched. Also: bit-identity with one linear call per batch (what the CPU
// kernel promises), and bad arguments refused by name with nothing written.
// Tolerances: dense_operands.h gemm_tolerance (fp32 accumulation; one bf16 rounding of y).
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <sstream>
#include <tuple>
#include <vector>

#include "cuda_dispatch_support.h"
#include "dense_operands.h"
#include "dsv4/ops.h"

namespace {
using namespace dense_test;

struct Shape {
  int64_t B, T, N, K;
};
// B heads of a [T, B, K + x_pad] activation; y the first N of each head's N + y_pad columns of a
// [T, B + 3, N + y_pad] buffer (three spare heads, as the layer's padded heads).
constexpr int64_t kXPad = 64, kYPad = 64, kSpareHeads = 3;

TensorView head_batch(const HostTensor& buf, int64_t B, int64_t T, int64_t cols, int64_t head_width,
                      int64_t heads) {
  TensorView v = buf.view();
  v.ndim = 3;
  v.shape = {B, T, cols};
  v.strides = {head_width, heads * head_width, 1};
  return v;
}

using Params = std::tuple<Shape, DType /*x*/, DType /*w*/, DType /*y*/>;
class BatchedLinear : public ::testing::TestWithParam<Params> {};

TEST_P(BatchedLinear, MatchesFloat64PerHead) {
  const auto [s, x_dt, w_dt, y_dt] = GetParam();
  const HostTensor x_buf = random_tensor(x_dt, {s.T, s.B, s.K + kXPad}, 10 + s.K);
  const HostTensor w = random_tensor(w_dt, {s.B, s.N, s.K}, 20 + s.N);
  const int64_t Hp = s.B + kSpareHeads, y_width = s.N + kYPad;
  HostTensor y_buf = poisoned(y_dt, {s.T, Hp, y_width});
  dsv4::batched_linear(head_batch(x_buf, s.B, s.T, s.K, s.K + kXPad, s.B), w,
                       head_batch(y_buf, s.B, s.T, s.N, y_width, Hp));
  const std::vector<double> xr = to_doubles(x_buf), wr = to_doubles(w);
  for (int64_t b = 0; b < s.B; ++b) {
    const GemmReference ref =
        reference_gemm(xr, b * (s.K + kXPad), s.B * (s.K + kXPad), wr, b * s.N * s.K, s.T, s.N, s.K);
    for (int64_t t = 0; t < s.T; ++t)
      for (int64_t n = 0; n < s.N; ++n) {
        const double want = ref.y[static_cast<size_t>(t * s.N + n)];
        ASSERT_NEAR(at(y_buf, (t * Hp + b) * y_width + n), want,
                    gemm_tolerance(y_dt, want, ref.abs_sum[static_cast<size_t>(t * s.N + n)]))
            << "b " << b << " t " << t << " n " << n;
      }
  }
  // Everything outside the batches' outputs keeps its poison.
  for (int64_t t = 0; t < s.T; ++t)
    for (int64_t h = 0; h < Hp; ++h)
      for (int64_t n = h < s.B ? s.N : 0; n < y_width; ++n)
        ASSERT_TRUE(std::isnan(at(y_buf, (t * Hp + h) * y_width + n))) << "t " << t << " h " << h << " n " << n;
}

// The V3.2 absorptions (W_UK: K 128 → N 512; W_UV: K 512 → N 128) at tiny-v3.2's 16 heads, odd
// sizes, one row and one batch.
std::vector<Params> grid() {
  std::vector<Params> g;
  const Shape shapes[] = {{16, 5, 512, 128}, {16, 3, 128, 512}, {3, 7, 33, 70}, {1, 1, 8, 16}};
  for (const Shape s : shapes) {
    g.emplace_back(s, DType::bf16, DType::bf16, DType::bf16);
    g.emplace_back(s, DType::bf16, DType::bf16, DType::fp32);
    g.emplace_back(s, DType::fp32, DType::fp32, DType::fp32);
  }
  g.emplace_back(Shape{3, 7, 33, 70}, DType::fp32, DType::bf16, DType::bf16);  // mixed: CPU only
  return g;
}
INSTANTIATE_TEST_SUITE_P(Grid, BatchedLinear, ::testing::ValuesIn(grid()), [](const auto& info) {
  const Shape s = std::get<0>(info.param);
  std::ostringstream n;
  n << "B" << s.B << "_T" << s.T << "_N" << s.N << "_K" << s.K << "_x" << dsv4::dtype_name(std::get<1>(info.param))
    << "_w" << dsv4::dtype_name(std::get<2>(info.param)) << "_y" << dsv4::dtype_name(std::get<3>(info.param));
  return n.str();
});

// The CPU kernel is linear's GEMM per batch: the same bytes as B linear calls.
TEST(BatchedLinearCpu, BitIdenticalToOneLinearPerBatch) {
  const int64_t B = 16, T = 9, N = 512, K = 128;
  const HostTensor x_buf = random_tensor(DType::bf16, {T, B, K + kXPad}, 31);
  const HostTensor w = random_tensor(DType::bf16, {B, N, K}, 32);
  HostTensor batched = poisoned(DType::bf16, {T, B, N}), looped = poisoned(DType::bf16, {T, B, N});
  dsv4::batched_linear(head_batch(x_buf, B, T, K, K + kXPad, B), w, head_batch(batched, B, T, N, N, B));
  for (int64_t b = 0; b < B; ++b) {
    TensorView xb = x_buf.view(), wb = w.view(), yb = looped.view();
    xb.ndim = wb.ndim = yb.ndim = 2;
    xb.shape = {T, K};
    xb.strides = {B * (K + kXPad), 1};
    xb.data = x_buf.data<uint16_t>() + b * (K + kXPad);
    wb.shape = {N, K};
    wb.strides = {K, 1};
    wb.data = const_cast<uint16_t*>(w.data<uint16_t>()) + b * N * K;
    yb.shape = {T, N};
    yb.strides = {B * N, 1};
    yb.data = looped.data<uint16_t>() + b * N;
    dsv4::linear(xb, {}, wb, {}, yb);
  }
  EXPECT_EQ(bytes_of(batched), bytes_of(looped));
}

TEST(BatchedLinearErrors, RejectBadArgumentsAndWriteNothing) {
  const HostTensor x = random_tensor(DType::bf16, {4, 3, 64}, 1);
  const HostTensor w = random_tensor(DType::bf16, {4, 32, 64}, 2);
  HostTensor y = poisoned(DType::bf16, {4, 3, 32});
  const auto before = bytes_of(y);
  const HostTensor w_bad = random_tensor(DType::bf16, {4, 32, 65}, 3);
  const HostTensor w_2d = random_tensor(DType::bf16, {32, 64}, 4);
  const HostTensor x_fp8(DType::fp8_e4m3, {4, 3, 64});
  HostTensor y_bad = poisoned(DType::bf16, {4, 3, 33});
  TensorView y_broadcast = y.view();  // every batch onto one matrix
  y_broadcast.strides[0] = 0;
  TensorView y_over_x = x.view();  // the output written over the input
  y_over_x.shape = {4, 3, 32};

  expect_error([&] { dsv4::batched_linear(x, w_bad, y); }, {"batched_linear", "w.shape", "[4, 32, 64]"});
  expect_error([&] { dsv4::batched_linear(x, w_2d, y); }, {"batched_linear", "w.ndim", "3"});
  expect_error([&] { dsv4::batched_linear(x, w, y_bad); }, {"batched_linear", "y.shape", "[4, 3, 32]"});
  expect_error([&] { dsv4::batched_linear(x_fp8, w, y); }, {"batched_linear", "x.dtype", "fp8"});
  expect_error([&] { dsv4::batched_linear(x, w, y_broadcast); }, {"batched_linear", "y", "overlap"});
  expect_error([&] { dsv4::batched_linear(x, w, y_over_x); }, {"batched_linear", "y", "disjoint from x"});
  expect_error([&] { dsv4::batched_linear(x, w, on_cuda(y)); }, {"batched_linear", "device"});
  dsv4::test::expect_cuda_dispatch("batched_linear", dsv4::ops::kBatchedLinear, [&] {
    dsv4::batched_linear(on_cuda(x), on_cuda(w), on_cuda(y));
  });
  EXPECT_EQ(bytes_of(y), before);
}

}  // namespace

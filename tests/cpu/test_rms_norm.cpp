// rms_norm against y = x / sqrt(mean(x²) + eps) · w computed here in float64, over leading-dim
// shapes (per-head [T, H, D] with H 16/64/128, D 512/576, hidden rows 1024/4096), dtypes, with
// and without weight, in place and out of place.
// Tolerances: an fp32 output errs by the fp32 sum of D squares (≈ sqrt(D)·2^-24 relative for
// random rounding, 4e-6 at D = 4096) plus two products: 1e-5 relative per element. A bf16 output
// adds one rounding (≤ 2^-9 relative): 2^-8 relative per element.
#include <gtest/gtest.h>

#include <sstream>
#include <tuple>
#include <vector>

#include "cuda_dispatch_support.h"
#include "dense_test_support.h"
#include "dsv4/ops.h"

namespace {
using namespace dense_test;

constexpr float kEps = 1e-6f;

double norm_tolerance(DType y, double ref) {
  return (y == DType::bf16 ? std::ldexp(1.0, -8) : 1e-5) * std::fabs(ref) + 1e-30;
}

// Float64 RMSNorm of row r (length D, element offset off in xd) into out.
void reference_row(const std::vector<double>& xd, int64_t off, int64_t D, const std::vector<double>* w,
                   double eps, double* out) {
  double ss = 0;
  for (int64_t i = 0; i < D; ++i) ss += xd[off + i] * xd[off + i];
  const double inv = 1.0 / std::sqrt(ss / D + eps);
  for (int64_t i = 0; i < D; ++i) out[i] = xd[off + i] * inv * (w ? (*w)[i] : 1.0);
}

// Every other row is scaled by 1e-3 so mean(x²) ≈ 3e-7 is comparable to eps and eps matters.
void alternate_row_scale(HostTensor& x, int64_t D) {
  for (int64_t i = 0; i < x.numel(); ++i)
    if ((i / D) % 2 == 1) x.set(i, static_cast<float>(at(x, i) * 1e-3));
}

enum class Weight { none, bf16, fp32 };
using Params = std::tuple<std::vector<int64_t>, DType /*x*/, DType /*y*/, Weight, bool /*in place*/>;
class RmsNorm : public ::testing::TestWithParam<Params> {};

TEST_P(RmsNorm, MatchesFloat64) {
  const auto& [dims, x_dt, y_dt, weight, in_place] = GetParam();
  const int64_t D = dims.back();
  HostTensor x = random_tensor(x_dt, dims, 7 + D);
  alternate_row_scale(x, D);
  const std::vector<double> xd = to_doubles(x);
  HostTensor w;
  std::vector<double> wd;
  if (weight != Weight::none) {
    w = random_tensor(weight == Weight::bf16 ? DType::bf16 : DType::fp32, {D}, 3, 0.5, 1.5);
    wd = to_doubles(w);
  }
  HostTensor y = in_place ? x : poisoned(y_dt, dims);
  dsv4::rms_norm(x, w, kEps, y);

  std::vector<double> ref(static_cast<size_t>(D));
  for (int64_t r = 0; r < x.numel() / D; ++r) {
    reference_row(xd, r * D, D, weight != Weight::none ? &wd : nullptr, kEps, ref.data());
    for (int64_t i = 0; i < D; ++i)
      ASSERT_NEAR(at(y, r * D + i), ref[i], norm_tolerance(y_dt, ref[i])) << "row " << r << " i " << i;
  }
}

std::vector<Params> rms_grid() {
  std::vector<Params> grid;
  const std::vector<std::vector<int64_t>> shapes = {{7, 512},      {3, 16, 512}, {2, 64, 576},
                                                    {1, 128, 512}, {4, 4096},    {5, 1024},
                                                    {2, 3, 4, 64}};
  for (const auto& s : shapes)
    for (const auto& [x, y] : {std::pair{DType::bf16, DType::bf16}, std::pair{DType::fp32, DType::fp32},
                              std::pair{DType::bf16, DType::fp32}})
      for (const Weight w : {Weight::none, Weight::bf16, Weight::fp32}) {
        grid.emplace_back(s, x, y, w, false);
        if (x == y) grid.emplace_back(s, x, y, w, true);
      }
  return grid;
}

INSTANTIATE_TEST_SUITE_P(Grid, RmsNorm, ::testing::ValuesIn(rms_grid()), [](const auto& info) {
  std::ostringstream name;
  for (int64_t d : std::get<0>(info.param)) name << d << "x";
  name << "_" << dsv4::dtype_name(std::get<1>(info.param)) << "_to_"
       << dsv4::dtype_name(std::get<2>(info.param)) << "_w" << static_cast<int>(std::get<3>(info.param))
       << (std::get<4>(info.param) ? "_inplace" : "");
  return name.str();
});

// [T, H, D] views with padded head and token strides, in place: rows are found through the
// strides and padding is never written.
TEST(RmsNormLayout, StridedHeadsInPlace) {
  const int64_t T = 3, H = 16, D = 512, head_stride = D + 32, row_stride = H * head_stride + 64;
  HostTensor buf = random_tensor(DType::bf16, {T * row_stride}, 21);
  const std::vector<double> before = to_doubles(buf);
  TensorView x(buf.data<uint16_t>(), DType::bf16, {T, H, D});
  x.strides = {row_stride, head_stride, 1};
  dsv4::rms_norm(x, {}, kEps, x);
  std::vector<double> ref(D);
  for (int64_t t = 0; t < T; ++t)
    for (int64_t h = 0; h < H; ++h) {
      const int64_t off = t * row_stride + h * head_stride;
      reference_row(before, off, D, nullptr, kEps, ref.data());
      for (int64_t i = 0; i < D; ++i)
        ASSERT_NEAR(at(buf, off + i), ref[i], norm_tolerance(DType::bf16, ref[i]));
      for (int64_t i = D; i < head_stride && off + i < T * row_stride; ++i)
        ASSERT_EQ(at(buf, off + i), before[off + i]) << "padding written";
    }
}

TEST(RmsNormErrors, RejectBadArgumentsAndWriteNothing) {
  HostTensor x = random_tensor(DType::bf16, {4, 256}, 1);
  HostTensor y = poisoned(DType::bf16, {4, 256});
  const auto x_before = bytes_of(x), y_before = bytes_of(y);
  HostTensor y_shape = poisoned(DType::bf16, {4, 255});
  HostTensor y_fp8 = poisoned(DType::fp8_e4m3, {4, 256});
  HostTensor w_len = random_tensor(DType::bf16, {255}, 2);
  HostTensor w_fp8(DType::fp8_e4m3, {256});
  TensorView y_shifted = x.view();  // overlaps x half a row further on
  y_shifted.data = x.data<uint16_t>() + 128;
  y_shifted.shape[0] = 3;
  TensorView x_strided = x.view();
  x_strided.shape[1] = 128;
  x_strided.strides[1] = 2;
  HostTensor y128 = poisoned(DType::bf16, {4, 128});

  expect_error([&] { dsv4::rms_norm(x, {}, kEps, y_shape); }, {"rms_norm", "y.shape[1]", "256", "255"});
  expect_error([&] { dsv4::rms_norm(x, {}, kEps, y_fp8); }, {"y.dtype", "bf16 or fp32"});
  expect_error([&] { dsv4::rms_norm(x, w_len, kEps, y); }, {"weight.shape", "[256]", "[255]"});
  expect_error([&] { dsv4::rms_norm(x, w_fp8, kEps, y); }, {"weight.dtype"});
  expect_error([&] { dsv4::rms_norm(x.view().slice0(0, 3), {}, kEps, y_shifted); }, {"y", "overlapping"});
  expect_error([&] { dsv4::rms_norm(x_strided, {}, kEps, y128); }, {"x.stride(-1)"});
  expect_error([&] { dsv4::rms_norm(x, {}, -1.0f, y); }, {"eps", ">= 0"});
  expect_error([&] { dsv4::rms_norm(x, {}, NAN, y); }, {"eps"});
  expect_error([&] { dsv4::rms_norm(x, {}, kEps, on_cuda(y)); }, {"y.device"});
  dsv4::test::expect_cuda_dispatch("rms_norm", dsv4::ops::kRmsNorm,
                                    [&] { dsv4::rms_norm(on_cuda(x), {}, kEps, on_cuda(y)); });
  EXPECT_EQ(bytes_of(x), x_before);
  EXPECT_EQ(bytes_of(y), y_before);
  EXPECT_EQ(bytes_of(y_shape), std::vector<uint8_t>(y_shape.nbytes(), 0xFF));
  EXPECT_EQ(bytes_of(y128), std::vector<uint8_t>(y128.nbytes(), 0xFF));
}

}  // namespace

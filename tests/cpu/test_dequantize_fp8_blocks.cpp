// dequantize_fp8_blocks against float64: y = fp8(x) · scale of its block, formed in float64
// from the format definitions (dense_test_support.h), then rounded as the op documents — once to
// fp32 (the fp32 product), and for a bf16 y once more to bf16 (round-to-nearest-even, written here
// with frexp/nearbyint). Every shape rank (2-d, 3-d), several block shapes (128×128 weights,
// 1×128 / 1×64 activations, odd 3×5 blocks with partial edge blocks), both scale dtypes and both
// output dtypes; the comparison is exact (bit for bit), and with UE8M0 scales the result must
// also equal the float64 product itself (the exactness the header promises).
#include <gtest/gtest.h>

#include <cfenv>
#include <cmath>
#include <sstream>
#include <tuple>
#include <vector>

#include "cuda_dispatch_support.h"
#include "dense_test_support.h"
#include "dsv4/ops.h"

namespace {
using namespace dense_test;

// v rounded to the nearest bf16 (8 significant bits), ties to even; v a normal float.
double bf16_round(double v) {
  if (v == 0.0 || std::isnan(v)) return v;
  int e = 0;
  std::frexp(v, &e);  // |v| = m · 2^e, m in [0.5, 1)
  return std::ldexp(std::nearbyint(std::ldexp(v, 8 - e)), e - 8);  // default mode: ties to even
}

struct Case {
  std::vector<int64_t> shape;  // [R, C] or [G, R, C]
  int block_rows, block_cols;
};

using Params = std::tuple<Case, DType /*scale*/, DType /*y*/>;
class DequantizeFp8Blocks : public ::testing::TestWithParam<Params> {};

TEST_P(DequantizeFp8Blocks, MatchesFloat64) {
  ASSERT_EQ(std::fegetround(), FE_TONEAREST);
  const auto [c, s_dt, y_dt] = GetParam();
  const bool batched = c.shape.size() == 3;
  const int64_t G = batched ? c.shape[0] : 1, R = c.shape[c.shape.size() - 2], C = c.shape.back();
  const int64_t SR = (R + c.block_rows - 1) / c.block_rows, SC = (C + c.block_cols - 1) / c.block_cols;
  std::mt19937_64 rng(R * 1000 + C + c.block_rows);

  HostTensor x(DType::fp8_e4m3, c.shape);
  std::uniform_int_distribution<int> code(0, 255);
  for (int64_t i = 0; i < x.numel(); ++i) x.data<uint8_t>()[i] = static_cast<uint8_t>(code(rng));
  HostTensor scale(s_dt, batched ? std::vector<int64_t>{G, SR, SC} : std::vector<int64_t>{SR, SC});
  std::uniform_int_distribution<int> exp(-12, -2);
  std::uniform_real_distribution<double> arbitrary(1e-3, 1e-2);
  std::vector<double> s_real(static_cast<size_t>(scale.numel()));
  for (int64_t i = 0; i < scale.numel(); ++i) {
    if (s_dt == DType::ue8m0) {
      const int k = exp(rng);
      scale.data<uint8_t>()[i] = static_cast<uint8_t>(k + 127);
      s_real[static_cast<size_t>(i)] = std::ldexp(1.0, k);
    } else {
      scale.data<float>()[i] = static_cast<float>(arbitrary(rng));
      s_real[static_cast<size_t>(i)] = scale.data<float>()[i];
    }
  }
  HostTensor y = poisoned(y_dt, c.shape);
  dsv4::dequantize_fp8_blocks(x, scale, c.block_rows, c.block_cols, y);

  for (int64_t g = 0; g < G; ++g)
    for (int64_t r = 0; r < R; ++r)
      for (int64_t col = 0; col < C; ++col) {
        const int64_t i = (g * R + r) * C + col;
        const double exact = fp8_value(x.data<uint8_t>()[i]) *
                             s_real[static_cast<size_t>((g * SR + r / c.block_rows) * SC + col / c.block_cols)];
        const double got = at(y, i);
        if (std::isnan(exact)) {
          ASSERT_TRUE(std::isnan(got)) << "i " << i;
          continue;
        }
        const double fp32 = static_cast<float>(exact);  // the fp32 product, correctly rounded
        const double want = y_dt == DType::bf16 ? bf16_round(fp32) : fp32;
        ASSERT_EQ(got, want) << "g " << g << " r " << r << " c " << col << " code "
                             << int(x.data<uint8_t>()[i]);
        if (s_dt == DType::ue8m0) {
          ASSERT_EQ(got, exact) << "not exact at i " << i;
        }
      }
}

INSTANTIATE_TEST_SUITE_P(
    Grid, DequantizeFp8Blocks,
    ::testing::Combine(::testing::Values(Case{{256, 384}, 128, 128}, Case{{200, 300}, 128, 128},
                                         Case{{5, 512}, 1, 128}, Case{{3, 256}, 1, 64},
                                         Case{{17, 23}, 3, 5}, Case{{4, 130, 260}, 128, 128},
                                         Case{{3, 7, 11}, 2, 4}, Case{{0, 128}, 1, 128}),
                       ::testing::Values(DType::ue8m0, DType::fp32),
                       ::testing::Values(DType::bf16, DType::fp32)),
    [](const auto& info) {
      const Case& c = std::get<0>(info.param);
      std::ostringstream name;
      for (int64_t d : c.shape) name << d << "x";
      name << "_b" << c.block_rows << "x" << c.block_cols << "_s"
           << dsv4::dtype_name(std::get<1>(info.param)) << "_y" << dsv4::dtype_name(std::get<2>(info.param));
      return name.str();
    });

// Strided views: x a column window of a wider buffer, scale with padded rows, y with padded rows
// whose padding must stay untouched; also the 3-d case with a padded batch stride.
TEST(DequantizeFp8BlocksLayout, StridedViewsLeavePaddingAlone) {
  const int64_t R = 6, C = 256, pad = 32;
  HostTensor wide(DType::fp8_e4m3, {R, C + pad});
  std::mt19937_64 rng(3);
  for (int64_t i = 0; i < wide.numel(); ++i) wide.data<uint8_t>()[i] = static_cast<uint8_t>(rng() % 0x7E);
  TensorView x = wide.view();
  x.data = wide.data<uint8_t>() + pad;
  x.shape[1] = C;
  HostTensor s_buf(DType::ue8m0, {R, 4});
  for (int64_t i = 0; i < s_buf.numel(); ++i) s_buf.data<uint8_t>()[i] = static_cast<uint8_t>(120 + i % 5);
  TensorView s = s_buf.view();
  s.shape[1] = 2;  // 1 × 128 blocks, rows padded to 4 scales
  HostTensor y_buf = poisoned(DType::bf16, {R, C + 8});
  TensorView y = y_buf.view();
  y.shape[1] = C;
  dsv4::dequantize_fp8_blocks(x, s, 1, 128, y);
  for (int64_t r = 0; r < R; ++r) {
    for (int64_t c = 0; c < C; ++c)
      ASSERT_EQ(at(y_buf, r * (C + 8) + c),
                fp8_value(wide.data<uint8_t>()[r * (C + pad) + pad + c]) *
                    std::ldexp(1.0, s_buf.data<uint8_t>()[r * 4 + c / 128] - 127));
    for (int64_t c = C; c < C + 8; ++c) EXPECT_TRUE(std::isnan(at(y_buf, r * (C + 8) + c)));
  }

  const int64_t G = 3, R3 = 130, C3 = 128;
  HostTensor x3(DType::fp8_e4m3, {G, R3, C3});
  for (int64_t i = 0; i < x3.numel(); ++i) x3.data<uint8_t>()[i] = static_cast<uint8_t>(rng() % 0x7E);
  HostTensor s3(DType::fp32, {G, 2, 1});
  for (int64_t i = 0; i < s3.numel(); ++i) s3.data<float>()[i] = 0.001f * static_cast<float>(i + 1);
  HostTensor y3_buf = poisoned(DType::fp32, {G, R3 + 2, C3});
  TensorView y3 = y3_buf.view();
  y3.shape[1] = R3;  // batch stride (R3 + 2) · C3: two padding rows per batch
  dsv4::dequantize_fp8_blocks(x3, s3, 128, 128, y3);
  for (int64_t g = 0; g < G; ++g) {
    for (int64_t r = 0; r < R3; ++r)
      for (int64_t c = 0; c < C3; ++c)
        ASSERT_EQ(at(y3_buf, (g * (R3 + 2) + r) * C3 + c),
                  static_cast<float>(fp8_value(x3.data<uint8_t>()[(g * R3 + r) * C3 + c]) *
                                     static_cast<double>(s3.data<float>()[g * 2 + r / 128])));
    for (int64_t i = R3 * C3; i < (R3 + 2) * C3; ++i)
      EXPECT_TRUE(std::isnan(at(y3_buf, g * (R3 + 2) * C3 + i)));
  }
}

// Each bad argument throws the documented error and writes nothing.
TEST(DequantizeFp8BlocksErrors, RejectBadArgumentsAndWriteNothing) {
  HostTensor x(DType::fp8_e4m3, {256, 384});
  x.fill_bytes(0x38);  // 1.0
  HostTensor s(DType::ue8m0, {2, 3});
  s.fill_bytes(127);
  HostTensor y = poisoned(DType::bf16, {256, 384});
  const auto before = bytes_of(y);
  HostTensor x_bf16 = random_tensor(DType::bf16, {256, 384}, 1);
  HostTensor s_bad(DType::ue8m0, {2, 2});
  HostTensor s_int(DType::int32, {2, 3});
  HostTensor s3(DType::ue8m0, {1, 2, 3});
  HostTensor y_bad = poisoned(DType::bf16, {256, 383});
  HostTensor y_fp8 = poisoned(DType::fp8_e4m3, {256, 384});
  HostTensor x1(DType::fp8_e4m3, {384});
  TensorView y_alias = x.view();
  y_alias.dtype = DType::bf16;
  y_alias.shape = {256, 384};
  y_alias.strides = {192, 1};  // overlaps x's bytes (and its rows overlap: rejected either way)
  TensorView y_broadcast = y.view();
  y_broadcast.strides[0] = 0;

  expect_error([&] { dsv4::dequantize_fp8_blocks(x_bf16, s, 128, 128, y); }, {"dequantize_fp8_blocks", "x.dtype", "fp8_e4m3", "bf16"});
  expect_error([&] { dsv4::dequantize_fp8_blocks(x, s_bad, 128, 128, y); }, {"scale.shape", "[2, 3]", "[2, 2]"});
  expect_error([&] { dsv4::dequantize_fp8_blocks(x, s, 128, 96, y); }, {"scale.shape", "[2, 4]"});
  expect_error([&] { dsv4::dequantize_fp8_blocks(x, s_int, 128, 128, y); }, {"scale.dtype", "ue8m0 or fp32"});
  expect_error([&] { dsv4::dequantize_fp8_blocks(x, s3, 128, 128, y); }, {"scale.shape", "expected [2, 3]", "[1, 2, 3]"});
  expect_error([&] { dsv4::dequantize_fp8_blocks(x, s, 128, 128, y_bad); }, {"y.shape", "[256, 384]"});
  expect_error([&] { dsv4::dequantize_fp8_blocks(x, s, 128, 128, y_fp8); }, {"y.dtype", "bf16 or fp32"});
  expect_error([&] { dsv4::dequantize_fp8_blocks(x, s, 0, 128, y); }, {"block_rows", ">= 1", "0"});
  expect_error([&] { dsv4::dequantize_fp8_blocks(x, s, 128, -1, y); }, {"block_cols", ">= 1", "-1"});
  expect_error([&] { dsv4::dequantize_fp8_blocks(x1, s, 128, 128, y); }, {"x.ndim", "2", "3", "1"});
  expect_error([&] { dsv4::dequantize_fp8_blocks(x, s, 128, 128, TensorView{}); }, {"y"});
  expect_error([&] { dsv4::dequantize_fp8_blocks(x, s, 128, 128, y_broadcast); }, {"y", "do not overlap"});
  expect_error([&] { dsv4::dequantize_fp8_blocks(x, s, 128, 128, y_alias); }, {"y"});
  expect_error([&] { dsv4::dequantize_fp8_blocks(on_cuda(x), s, 128, 128, y); }, {"device", "cuda", "cpu"});
  dsv4::test::expect_cuda_dispatch("dequantize_fp8_blocks", dsv4::ops::kDequantizeFp8Blocks, [&] {
    dsv4::dequantize_fp8_blocks(on_cuda(x), on_cuda(s), 128, 128, on_cuda(y));
  });
  EXPECT_EQ(bytes_of(y), before);
  EXPECT_EQ(bytes_of(y_bad), std::vector<uint8_t>(y_bad.nbytes(), 0xFF));
}

}  // namespace

// apply_rope against float64 rotations (docs/spec.md §3, GPT-J pairs on the last R dims) over [T, D] and
// [T, H, D] with H 16/64/128 and D 512/576, YaRN on/off, forward and inverse, in and out of place.
// Tolerances, relative to the norm of each rotated pair (rotation preserves it): fp32 output
// 1e-6 (the fp32 table's cos/sin carry ≤ 2^-25 each, plus two products and a sum in fp32 —
// ≈ 2e-7 worst case); bf16 output 2^-8 (one rounding of ≤ 2^-9). The first D − R dims are copied
// exactly.
#include <gtest/gtest.h>

#include <map>
#include <sstream>
#include <tuple>
#include <vector>

#include "cuda_dispatch_support.h"
#include "dense_test_support.h"
#include "dsv4/ops.h"
#include "rope_reference.h"

namespace {
using namespace dense_test;

constexpr int64_t kMaxPos = 70000;

// One table per (YaRN, R), built once: 70000 positions cover YaRN's original 65536 context.
const HostTensor& table_for(bool yarn, int R) {
  static std::map<std::pair<bool, int>, HostTensor> tables;
  auto it = tables.find({yarn, R});
  if (it == tables.end())
    it = tables.emplace(std::pair{yarn, R}, dsv4::build_rope_cache(yarn ? yarn_rope(R) : swa_rope(R), kMaxPos)).first;
  return it->second;
}

// Positions: 0, 1, the last table row, and random ones in between.
HostTensor make_positions(int64_t T, DType dt, uint64_t seed) {
  HostTensor p(dt, {T});
  std::mt19937_64 rng(seed);
  std::uniform_int_distribution<int64_t> pos(0, kMaxPos - 1);
  for (int64_t t = 0; t < T; ++t) {
    const int64_t v = t == 0 ? 0 : t == 1 ? kMaxPos - 1 : t == 2 ? 1 : pos(rng);
    if (dt == DType::int64) p.data<int64_t>()[t] = v; else p.data<int32_t>()[t] = static_cast<int32_t>(v);
  }
  return p;
}
int64_t position(const HostTensor& p, int64_t t) {
  return p.dtype() == DType::int64 ? p.data<int64_t>()[t] : p.data<int32_t>()[t];
}

// Checks y = RoPE_{±p}(x) row by row. rows = T·H, D, R; xd are the inputs in float64.
void expect_rotated(const HostTensor& y, const std::vector<double>& xd, const HostTensor& positions,
                    int64_t T, int64_t D, int64_t R, const std::vector<double>& freqs, bool inverse,
                    double rel) {
  const int64_t rows = static_cast<int64_t>(xd.size()) / D, heads = rows / T;
  for (int64_t r = 0; r < rows; ++r) {
    const int64_t p = position(positions, r / heads);
    const int64_t base = r * D;
    for (int64_t i = 0; i < D - R; ++i)
      ASSERT_EQ(at(y, base + i), static_cast<double>(static_cast<float>(xd[base + i]))) << "nope dim " << i;
    for (int64_t i = 0; i < R / 2; ++i) {
      const double a = xd[base + D - R + 2 * i], b = xd[base + D - R + 2 * i + 1];
      double ya, yb;
      reference_rotate(a, b, (inverse ? -1.0 : 1.0) * static_cast<double>(p) * freqs[i], ya, yb);
      const double tol = rel * std::hypot(a, b) + 1e-30;
      ASSERT_NEAR(at(y, base + D - R + 2 * i), ya, tol) << "row " << r << " p " << p << " pair " << i;
      ASSERT_NEAR(at(y, base + D - R + 2 * i + 1), yb, tol) << "row " << r << " p " << p << " pair " << i;
    }
  }
}

struct Shape {
  int64_t T, H, D, R;  // H == 0: a [T, D] tensor
};
// In place / out of place and int32 / int64 positions alternate over the grid rather than
// multiplying it (each test process builds its 70000-row table).
struct Case {
  Shape shape;
  DType dtype;
  bool yarn, inverse, in_place;
  DType positions;
};
class ApplyRope : public ::testing::TestWithParam<Case> {};

TEST_P(ApplyRope, MatchesFloat64) {
  const Case c = GetParam();
  const Shape s = c.shape;
  const std::vector<int64_t> dims = s.H ? std::vector<int64_t>{s.T, s.H, s.D} : std::vector<int64_t>{s.T, s.D};
  HostTensor x = random_tensor(c.dtype, dims, 31 + s.D + s.H);
  const std::vector<double> xd = to_doubles(x);
  const HostTensor positions = make_positions(s.T, c.positions, 8);
  HostTensor y = c.in_place ? x : poisoned(c.dtype, dims);
  dsv4::apply_rope(x, positions, table_for(c.yarn, static_cast<int>(s.R)), c.inverse, y);
  expect_rotated(y, xd, positions, s.T, s.D, s.R,
                 reference_rope_freqs(c.yarn ? yarn_rope(static_cast<int>(s.R)) : swa_rope(static_cast<int>(s.R))),
                 c.inverse, c.dtype == DType::bf16 ? std::ldexp(1.0, -8) : 1e-6);
}

std::vector<Case> rope_grid() {
  std::vector<Case> grid;
  int n = 0;
  for (const Shape s : {Shape{5, 0, 512, 64}, Shape{3, 16, 512, 64}, Shape{4, 64, 576, 64}, Shape{3, 128, 512, 64},
                        Shape{4, 4, 128, 32}, Shape{3, 1, 64, 64}})
    for (const DType dt : {DType::bf16, DType::fp32})
      for (const bool yarn : {false, true})
        for (const bool inverse : {false, true}) {
          ++n;
          grid.push_back({s, dt, yarn, inverse, n % 2 == 0, n % 3 == 0 ? DType::int32 : DType::int64});
        }
  return grid;
}

INSTANTIATE_TEST_SUITE_P(Grid, ApplyRope, ::testing::ValuesIn(rope_grid()), [](const auto& info) {
  const Case& c = info.param;
  std::ostringstream n;
  n << "T" << c.shape.T << "_H" << c.shape.H << "_D" << c.shape.D << "_R" << c.shape.R << "_"
    << dsv4::dtype_name(c.dtype) << (c.yarn ? "_yarn" : "") << (c.inverse ? "_inverse" : "")
    << (c.in_place ? "_inplace" : "") << "_" << dsv4::dtype_name(c.positions);
  return n.str();
});

// Position 0 is the identity: output bits equal input bits.
TEST(ApplyRopeEdges, PositionZeroIsExactIdentity) {
  HostTensor x = random_tensor(DType::bf16, {4, 16, 512}, 2);
  HostTensor p = HostTensor::zeros(DType::int64, {4});
  HostTensor y = poisoned(DType::bf16, {4, 16, 512});
  for (const bool inverse : {false, true}) {
    dsv4::apply_rope(x, p, table_for(true, 64), inverse, y);
    EXPECT_EQ(bytes_of(y), bytes_of(x));
  }
}

// inverse ∘ forward = identity: within two bf16 roundings (2^-7 of the pair norm) for bf16, and
// within fp32 table/arithmetic error (1e-6) for fp32.
TEST(ApplyRopeEdges, InverseUndoesForward) {
  for (const DType dt : {DType::bf16, DType::fp32}) {
    HostTensor x = random_tensor(dt, {6, 64, 512}, 4);
    const std::vector<double> xd = to_doubles(x);
    const HostTensor p = make_positions(6, DType::int64, 5);
    HostTensor y = poisoned(dt, {6, 64, 512}), z = poisoned(dt, {6, 64, 512});
    dsv4::apply_rope(x, p, table_for(true, 64), false, y);
    dsv4::apply_rope(y, p, table_for(true, 64), true, z);
    const double rel = dt == DType::bf16 ? std::ldexp(1.0, -7) : 1e-6;
    for (int64_t r = 0; r < 6 * 64; ++r)
      for (int64_t i = 448; i < 512; i += 2) {
        const double norm = std::hypot(xd[r * 512 + i], xd[r * 512 + i + 1]);
        ASSERT_NEAR(at(z, r * 512 + i), xd[r * 512 + i], rel * norm);
        ASSERT_NEAR(at(z, r * 512 + i + 1), xd[r * 512 + i + 1], rel * norm);
      }
  }
}

// Strided [T, H, D] view (padded heads) rotated into a contiguous output.
TEST(ApplyRopeEdges, StridedInput) {
  const int64_t T = 3, H = 16, D = 512, hs = D + 16;
  HostTensor buf = random_tensor(DType::fp32, {T * H * hs}, 6);
  TensorView x(buf.data<float>(), DType::fp32, {T, H, D});
  x.strides = {H * hs, hs, 1};
  HostTensor packed(DType::fp32, {T, H, D});
  for (int64_t r = 0; r < T * H; ++r)
    for (int64_t i = 0; i < D; ++i) packed.data<float>()[r * D + i] = buf.data<float>()[r * hs + i];
  const HostTensor p = make_positions(T, DType::int64, 7);
  HostTensor y = poisoned(DType::fp32, {T, H, D});
  dsv4::apply_rope(x, p, table_for(false, 64), false, y);
  expect_rotated(y, to_doubles(packed), p, T, D, 64, reference_rope_freqs(swa_rope()), false, 1e-6);
}

TEST(ApplyRopeErrors, RejectBadArgumentsAndWriteNothing) {
  const HostTensor& table = table_for(false, 64);
  HostTensor x = random_tensor(DType::bf16, {3, 4, 512}, 1);
  HostTensor y = poisoned(DType::bf16, {3, 4, 512});
  const auto x_before = bytes_of(x), y_before = bytes_of(y);
  HostTensor p = make_positions(3, DType::int64, 1);
  HostTensor p_far = make_positions(3, DType::int64, 1), p_neg = make_positions(3, DType::int32, 1);
  p_far.data<int64_t>()[2] = kMaxPos;
  p_neg.data<int32_t>()[1] = -1;
  HostTensor p_len = make_positions(4, DType::int64, 1);
  HostTensor p_f32(DType::fp32, {3});
  HostTensor odd_table(DType::fp32, {16, 63}), wide_table(DType::fp32, {16, 514});
  HostTensor bf16_table(DType::bf16, {16, 64});
  HostTensor x4 = random_tensor(DType::bf16, {3, 4, 1, 512}, 2);
  HostTensor y_shape = poisoned(DType::bf16, {3, 5, 512});
  TensorView y_shifted = x.view();
  y_shifted.data = x.data<uint16_t>() + 100;
  y_shifted.shape[0] = 2;

  for (TensorView out : {y.view(), x.view()}) {  // out of place and in place
    expect_error([&] { dsv4::apply_rope(x, p_far, table, false, out); },
                 {"apply_rope", "positions[2]", "[0, 70000)", "got 70000"});
    expect_error([&] { dsv4::apply_rope(x, p_neg, table, true, out); }, {"positions[1]", "got -1"});
  }
  expect_error([&] { dsv4::apply_rope(x, p_len, table, false, y); }, {"positions.shape[0]", "expected 3", "got 4"});
  expect_error([&] { dsv4::apply_rope(x, p_f32, table, false, y); }, {"positions.dtype", "int64 or int32"});
  expect_error([&] { dsv4::apply_rope(x, p, odd_table, false, y); }, {"cos_sin.shape[1]", "even", "63"});
  expect_error([&] { dsv4::apply_rope(x, p, wide_table, false, y); }, {"cos_sin.shape[1]", "514"});
  expect_error([&] { dsv4::apply_rope(x, p, bf16_table, false, y); }, {"cos_sin.dtype", "fp32"});
  expect_error([&] { dsv4::apply_rope(x4, p, table, false, x4); }, {"x.ndim"});
  TensorView y_heads_alias = y.view();  // all heads of a token written to one row
  y_heads_alias.strides[1] = 0;
  expect_error([&] { dsv4::apply_rope(x, p, table, false, y_heads_alias); }, {"y", "do not overlap"});
  TensorView x_strided = x.view();  // every other element of a row
  x_strided.shape[2] = 256;
  x_strided.strides[2] = 2;
  HostTensor y256 = poisoned(DType::bf16, {3, 4, 256});
  expect_error([&] { dsv4::apply_rope(x_strided, p, table, false, y256); }, {"x.stride(-1)", "expected 1", "got 2"});
  expect_error([&] { dsv4::apply_rope(x, p, table, false, y_shape); }, {"y.shape[1]", "expected 4", "got 5"});
  expect_error([&] { dsv4::apply_rope(x.view().slice0(0, 2), p.view().slice0(0, 2), table, false, y_shifted); },
               {"y", "overlapping"});
  expect_error([&] { dsv4::apply_rope(on_cuda(x), p, table, false, on_cuda(y)); }, {"device"});
  dsv4::test::expect_cuda_dispatch("apply_rope", dsv4::ops::kApplyRope, [&] {
    dsv4::apply_rope(on_cuda(x), on_cuda(p), on_cuda(table.view()), false, on_cuda(y));
  });
  EXPECT_EQ(bytes_of(x), x_before);
  EXPECT_EQ(bytes_of(y), y_before);
  EXPECT_EQ(bytes_of(y_shape), std::vector<uint8_t>(y_shape.nbytes(), 0xFF));
  EXPECT_EQ(bytes_of(y256), std::vector<uint8_t>(y256.nbytes(), 0xFF));
}

}  // namespace

// rms_norm, fused_qkv_rms_norm and apply_rope: the CUDA kernels against the CPU reference through
// the public API, on identical inputs (host tensors and their device copies).
//
// Tolerance: none — outputs must be byte-identical. Both backends run the same DSV4_HD per-element
// math (src/math/rms_norm.h, src/math/rope.h): the same IEEE-rounded fp32 operations
// (dtype.h ieee_*: explicit non-FTZ PTX on the device, unaffected by --use_fast_math) in the same
// order — the sum of squares in math/rms_norm.h's lane order (32 partials over chunks of 8, then a
// butterfly) on both sides — and the same bf16 rounding. A one-ulp difference therefore is a bug,
// not noise. Rows that are not 16-byte aligned take the kernels' element-wise path: covered too.
//
// Also: in place (y aliases x), strided leading dims, T = 0, a position outside the table on CUDA
// (the row is left unwritten: the host cannot check device data), mixed devices (dsv4::Error,
// nothing written). Skipped without a GPU.
#include <gtest/gtest.h>

#include <cstring>
#include <sstream>
#include <tuple>
#include <vector>

#include "cpu/dense_test_support.h"
#include "cpu/rope_reference.h"
#include "cpu_vs_cuda_util.h"
#include "dsv4/ops.h"
#include "gpu_test_util.h"

namespace {

using dense_test::random_tensor;
using dsv4::DType;
using dsv4::HostTensor;
using dsv4::TensorView;
using dsv4::test::expect_bytes_equal;
using dsv4::test::same_view_on_device;
using dsv4::test::Twin;

constexpr float kEps = 1e-6f;

HostTensor clone(const HostTensor& h) {
  HostTensor c(h.dtype(), h.shape());
  std::memcpy(c.data<uint8_t>(), h.data<uint8_t>(), h.nbytes());
  return c;
}

// Every other row scaled by 1e-3 so that eps matters in some rows (as in tests/cpu).
void alternate_row_scale(HostTensor& x, int64_t D) {
  for (int64_t i = 0; i < x.numel(); ++i)
    if ((i / D) % 2 == 1) x.set(i, x.get(i) * 1e-3f);
}

std::string dims_name(const std::vector<int64_t>& dims) {
  std::ostringstream s;
  for (size_t i = 0; i < dims.size(); ++i) s << (i ? "x" : "") << dims[i];
  return s.str();
}

// ---- rms_norm ---------------------------------------------------------------------------------
enum class Weight { none, bf16, fp32 };
// strided: x is a column range of a wider buffer (rows 16-byte aligned); unaligned: the same with
// rows 3 elements wider (the kernels' element-wise path).
enum class Placement { separate, in_place, strided, unaligned };
using NormParams = std::tuple<std::vector<int64_t>, DType, DType, Weight, Placement>;
class RmsNormCpuVsCuda : public ::testing::TestWithParam<NormParams> {};

TEST_P(RmsNormCpuVsCuda, BitIdentical) {
  DSV4_SKIP_WITHOUT_GPU();
  const auto& [dims, x_dt, y_dt, weight, placement] = GetParam();
  const int64_t D = dims.back();
  // The buffer x lives in: 24 extra columns when strided (its rows are then D + 24 apart).
  std::vector<int64_t> buf_dims = dims;
  if (placement == Placement::strided) buf_dims.back() += 24;
  if (placement == Placement::unaligned) buf_dims.back() += 3;
  HostTensor x_buf = random_tensor(x_dt, buf_dims, 11 + D);
  alternate_row_scale(x_buf, buf_dims.back());
  Twin x = Twin::of(x_buf);
  TensorView x_host = x.host.view();
  x_host.shape[x_host.ndim - 1] = D;  // the first D columns (contiguous when not strided)
  const TensorView x_dev = same_view_on_device(x, x_host);

  Twin w;
  if (weight != Weight::none)
    w = Twin::of(random_tensor(weight == Weight::bf16 ? DType::bf16 : DType::fp32, {D}, 5, 0.5, 1.5));
  Twin y = placement == Placement::in_place ? x : Twin::poisoned(y_dt, dims);
  const TensorView y_host = placement == Placement::in_place ? x_host : y.host.view();
  const TensorView y_dev = placement == Placement::in_place ? x_dev : y.dev.view();

  dsv4::rms_norm(x_host, w.host, kEps, y_host);
  dsv4::rms_norm(x_dev, w.dev, kEps, y_dev);
  expect_bytes_equal("y", y.host, y.dev_bytes());
  if (placement != Placement::in_place) expect_bytes_equal("x (unchanged)", x.host, x.dev_bytes());
}

std::vector<NormParams> norm_grid() {
  std::vector<NormParams> grid;
  // The layer's rows: q_lora 1024, kv 512 (with weight); per-head q [T, H, 512] (no weight);
  // hidden 4096; an odd D that is not a multiple of the warp; T = 1 and T = 0.
  for (const DType x_dt : {DType::bf16, DType::fp32})
    for (const DType y_dt : {DType::bf16, DType::fp32})
      for (const Weight w : {Weight::none, Weight::bf16, Weight::fp32})
        grid.emplace_back(std::vector<int64_t>{37, 1024}, x_dt, y_dt, w, Placement::separate);
  grid.emplace_back(std::vector<int64_t>{9, 64, 512}, DType::bf16, DType::bf16, Weight::none, Placement::separate);
  grid.emplace_back(std::vector<int64_t>{5, 16, 512}, DType::bf16, DType::bf16, Weight::none, Placement::in_place);
  grid.emplace_back(std::vector<int64_t>{6, 512}, DType::bf16, DType::bf16, Weight::bf16, Placement::in_place);
  grid.emplace_back(std::vector<int64_t>{6, 512}, DType::fp32, DType::fp32, Weight::fp32, Placement::in_place);
  grid.emplace_back(std::vector<int64_t>{7, 4096}, DType::bf16, DType::bf16, Weight::bf16, Placement::separate);
  grid.emplace_back(std::vector<int64_t>{13, 100}, DType::fp32, DType::bf16, Weight::bf16, Placement::separate);
  grid.emplace_back(std::vector<int64_t>{11, 1024}, DType::bf16, DType::bf16, Weight::bf16, Placement::strided);
  grid.emplace_back(std::vector<int64_t>{3, 4, 512}, DType::fp32, DType::bf16, Weight::none, Placement::strided);
  grid.emplace_back(std::vector<int64_t>{11, 1024}, DType::bf16, DType::bf16, Weight::bf16, Placement::unaligned);
  grid.emplace_back(std::vector<int64_t>{5, 100}, DType::fp32, DType::fp32, Weight::none, Placement::unaligned);
  grid.emplace_back(std::vector<int64_t>{1, 512}, DType::bf16, DType::bf16, Weight::bf16, Placement::separate);
  grid.emplace_back(std::vector<int64_t>{0, 512}, DType::bf16, DType::bf16, Weight::bf16, Placement::separate);
  grid.emplace_back(std::vector<int64_t>{512}, DType::bf16, DType::fp32, Weight::none, Placement::separate);
  return grid;
}
std::string norm_case_name(const ::testing::TestParamInfo<NormParams>& info) {
  const auto& [dims, x_dt, y_dt, w, placement] = info.param;
  std::ostringstream n;
  n << dims_name(dims) << "_" << dsv4::dtype_name(x_dt) << "_to_" << dsv4::dtype_name(y_dt) << "_w"
    << (w == Weight::none ? "none" : w == Weight::bf16 ? "bf16" : "fp32")
    << (placement == Placement::in_place   ? "_inplace"
        : placement == Placement::strided  ? "_strided"
        : placement == Placement::unaligned ? "_unaligned"
                                            : "");
  return n.str();
}
INSTANTIATE_TEST_SUITE_P(Grid, RmsNormCpuVsCuda, ::testing::ValuesIn(norm_grid()), norm_case_name);

TEST(FusedQkvRmsNormCpuVsCuda, BitIdentical) {
  DSV4_SKIP_WITHOUT_GPU();
  for (const int64_t T : {int64_t{0}, int64_t{1}, int64_t{33}}) {
    SCOPED_TRACE(T);
    Twin q = Twin::of(random_tensor(DType::bf16, {T, 1024}, 21));
    Twin kv = Twin::of(random_tensor(DType::bf16, {T, 512}, 22));
    Twin wq = Twin::of(random_tensor(DType::bf16, {1024}, 23, 0.5, 1.5));
    Twin wkv = Twin::of(random_tensor(DType::bf16, {512}, 24, 0.5, 1.5));
    Twin q_out = Twin::poisoned(DType::bf16, {T, 1024}), kv_out = Twin::poisoned(DType::bf16, {T, 512});
    dsv4::fused_qkv_rms_norm(q.host, wq.host, kv.host, wkv.host, kEps, q_out.host, kv_out.host);
    dsv4::fused_qkv_rms_norm(q.dev, wq.dev, kv.dev, wkv.dev, kEps, q_out.dev, kv_out.dev);
    expect_bytes_equal("q_out", q_out.host, q_out.dev_bytes());
    expect_bytes_equal("kv_out", kv_out.host, kv_out.dev_bytes());
  }
}

TEST(NormCpuVsCuda, MixedDevicesThrowAndWriteNothing) {
  DSV4_SKIP_WITHOUT_GPU();
  Twin x = Twin::of(random_tensor(DType::bf16, {4, 512}, 31));
  Twin w = Twin::of(random_tensor(DType::bf16, {512}, 32));
  Twin y = Twin::poisoned(DType::bf16, {4, 512});
  EXPECT_THROW(dsv4::rms_norm(x.dev, w.host, kEps, y.dev), dsv4::Error);
  EXPECT_THROW(dsv4::rms_norm(x.dev, w.dev, kEps, y.host), dsv4::Error);
  EXPECT_THROW(dsv4::fused_qkv_rms_norm(x.dev, w.dev, x.host, w.host, kEps, y.dev, y.host), dsv4::Error);
  const HostTensor poison = Twin::poisoned(DType::bf16, {4, 512}).host;
  expect_bytes_equal("y (device)", poison, y.dev_bytes());
  expect_bytes_equal("y (host)", poison, y.host);
}

// ---- apply_rope -------------------------------------------------------------------------------
struct RopeCase {
  std::vector<int64_t> dims;  // [T, D] or [T, H, D]
  DType x_dt, y_dt, pos_dt;
  bool inverse, yarn;
  Placement placement;
};
class ApplyRopeCpuVsCuda : public ::testing::TestWithParam<RopeCase> {};

constexpr int64_t kMaxPos = 70000;
const HostTensor& rope_table(bool yarn) {
  static const HostTensor swa = dsv4::build_rope_cache(dense_test::swa_rope(), kMaxPos);
  static const HostTensor compressed = dsv4::build_rope_cache(dense_test::yarn_rope(), kMaxPos);
  return yarn ? compressed : swa;
}

// Positions [T] covering 0 and the last table row.
HostTensor rope_positions(int64_t T, DType dt, uint32_t seed) {
  HostTensor p(dt, {T});
  std::mt19937 rng(seed);
  for (int64_t t = 0; t < T; ++t) {
    const int64_t v = t == 0 ? 0 : t == 1 ? kMaxPos - 1 : static_cast<int64_t>(rng() % kMaxPos);
    if (dt == DType::int64) p.data<int64_t>()[t] = v;
    else p.data<int32_t>()[t] = static_cast<int32_t>(v);
  }
  return p;
}

TEST_P(ApplyRopeCpuVsCuda, BitIdentical) {
  DSV4_SKIP_WITHOUT_GPU();
  const RopeCase c = GetParam();
  const int64_t T = c.dims.front(), D = c.dims.back();
  std::vector<int64_t> buf_dims = c.dims;
  if (c.placement == Placement::strided) buf_dims.back() += 40;
  if (c.placement == Placement::unaligned) buf_dims.back() += 3;
  Twin x = Twin::of(random_tensor(c.x_dt, buf_dims, 41 + D));
  TensorView x_host = x.host.view();
  x_host.shape[x_host.ndim - 1] = D;
  const TensorView x_dev = same_view_on_device(x, x_host);
  Twin pos = Twin::of(rope_positions(T, c.pos_dt, 43));
  Twin table = Twin::of(rope_table(c.yarn));
  Twin y = c.placement == Placement::in_place ? x : Twin::poisoned(c.y_dt, c.dims);
  const TensorView y_host = c.placement == Placement::in_place ? x_host : y.host.view();
  const TensorView y_dev = c.placement == Placement::in_place ? x_dev : y.dev.view();

  dsv4::apply_rope(x_host, pos.host, table.host, c.inverse, y_host);
  dsv4::apply_rope(x_dev, pos.dev, table.dev, c.inverse, y_dev);
  expect_bytes_equal("y", y.host, y.dev_bytes());
}

std::vector<RopeCase> rope_grid() {
  std::vector<RopeCase> grid;
  for (const DType x_dt : {DType::bf16, DType::fp32})
    for (const DType y_dt : {DType::bf16, DType::fp32})
      for (const bool inverse : {false, true})
        grid.push_back({{19, 64, 512}, x_dt, y_dt, DType::int64, inverse, true, Placement::separate});
  grid.push_back({{23, 512}, DType::bf16, DType::bf16, DType::int32, false, false, Placement::separate});
  grid.push_back({{23, 512}, DType::bf16, DType::bf16, DType::int64, true, true, Placement::in_place});
  grid.push_back({{7, 16, 512}, DType::bf16, DType::bf16, DType::int32, true, false, Placement::in_place});
  grid.push_back({{7, 16, 512}, DType::fp32, DType::fp32, DType::int64, false, true, Placement::in_place});
  grid.push_back({{5, 16, 512}, DType::bf16, DType::bf16, DType::int64, false, true, Placement::strided});
  grid.push_back({{5, 16, 512}, DType::bf16, DType::fp32, DType::int64, true, true, Placement::unaligned});
  grid.push_back({{1, 512}, DType::bf16, DType::bf16, DType::int64, false, true, Placement::separate});
  grid.push_back({{0, 64, 512}, DType::bf16, DType::bf16, DType::int64, false, true, Placement::separate});
  grid.push_back({{6, 64}, DType::bf16, DType::bf16, DType::int32, false, false, Placement::separate});  // R = D
  return grid;
}
INSTANTIATE_TEST_SUITE_P(Grid, ApplyRopeCpuVsCuda, ::testing::ValuesIn(rope_grid()), [](const auto& info) {
  const RopeCase& c = info.param;
  std::ostringstream n;
  n << dims_name(c.dims) << "_" << dsv4::dtype_name(c.x_dt) << "_to_" << dsv4::dtype_name(c.y_dt) << "_"
    << dsv4::dtype_name(c.pos_dt) << (c.inverse ? "_inverse" : "") << (c.yarn ? "_yarn" : "")
    << (c.placement == Placement::in_place   ? "_inplace"
        : c.placement == Placement::strided  ? "_strided"
        : c.placement == Placement::unaligned ? "_unaligned"
                                              : "");
  return n.str();
});

// CUDA cannot reject a position it cannot read on the host: the row is left unwritten, the other
// rows match the CPU.
TEST(ApplyRopeCuda, PositionOutsideTheTableLeavesItsRowsUnwritten) {
  DSV4_SKIP_WITHOUT_GPU();
  const int64_t T = 5, H = 4, D = 512;
  Twin x = Twin::of(random_tensor(DType::bf16, {T, H, D}, 51));
  HostTensor pos_host = rope_positions(T, DType::int64, 52);
  Twin table = Twin::of(rope_table(false));
  HostTensor y_cpu = dense_test::poisoned(DType::bf16, {T, H, D});
  dsv4::apply_rope(x.host, pos_host, table.host, false, y_cpu);
  for (const int64_t bad : {int64_t{-1}, kMaxPos, int64_t{1} << 40}) {
    SCOPED_TRACE(bad);
    HostTensor pos_bad = clone(pos_host);
    pos_bad.data<int64_t>()[2] = bad;
    Twin pos = Twin::of(pos_bad);
    Twin y = Twin::poisoned(DType::bf16, {T, H, D});
    dsv4::apply_rope(x.dev, pos.dev, table.dev, false, y.dev);
    HostTensor want = clone(y_cpu);
    std::memset(want.data<uint16_t>() + 2 * H * D, 0xFF, H * D * sizeof(uint16_t));  // row 2 stays poisoned
    expect_bytes_equal("y", want, y.dev_bytes());
  }
}

TEST(ApplyRopeCuda, MixedDevicesThrowAndWriteNothing) {
  DSV4_SKIP_WITHOUT_GPU();
  Twin x = Twin::of(random_tensor(DType::bf16, {3, 512}, 61));
  Twin pos = Twin::of(rope_positions(3, DType::int64, 62));
  Twin table = Twin::of(rope_table(false));
  Twin y = Twin::poisoned(DType::bf16, {3, 512});
  EXPECT_THROW(dsv4::apply_rope(x.dev, pos.host, table.dev, false, y.dev), dsv4::Error);
  EXPECT_THROW(dsv4::apply_rope(x.dev, pos.dev, table.host, false, y.dev), dsv4::Error);
  EXPECT_THROW(dsv4::apply_rope(x.host, pos.host, table.host, false, y.dev), dsv4::Error);
  expect_bytes_equal("y (device)", Twin::poisoned(DType::bf16, {3, 512}).host, y.dev_bytes());
}

}  // namespace

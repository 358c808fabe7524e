// The CPU reference against the CUDA twins of the dense ops — linear, batched_linear and
// grouped_wo_a (cuBLASLt and the skinny kernel), dequantize_fp8_blocks and quantize_act_fp8 (kernels) — both through the
// public API on the same inputs (host copies for the CPU, DeviceTensor copies for CUDA), outputs
// poisoned with 0xFF on both sides and every element compared. Skipped without a GPU.
#include <cuda_runtime.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <sstream>
#include <string>
#include <tuple>
#include <utility>
#include <vector>

#include "cpu/dense_operands.h"
#include "cuda/gpu_test_util.h"
#include "dsv4/device_tensor.h"
#include "dsv4/ops.h"
#include "runtime/gemm_path.h"

namespace {
using namespace dense_test;
using dsv4::DeviceTensor;
using dsv4::test::poisoned_device;
using dsv4::test::synced_to_host;

// A device copy of an optional (maybe undefined) host tensor.
DeviceTensor upload_optional(const HostTensor& h) {
  return h.view().defined() ? DeviceTensor::from_host(h) : DeviceTensor();
}
// A view of `base` moved by `offset` elements with shape[d] = extent (a window of a wider buffer).
TensorView window(TensorView base, int64_t offset, int dim, int64_t extent) {
  base.data = static_cast<char*>(base.data) + offset * static_cast<int64_t>(dsv4::dtype_size(base.dtype));
  base.shape[dim] = extent;
  return base;
}

// One bf16 ulp at the magnitude of v (the spacing of bf16 values in v's binade).
double bf16_ulp(double v) {
  return v == 0.0 ? std::ldexp(1.0, -133) : std::ldexp(1.0, std::ilogb(v) - 7);
}

// GEMM tolerance, CUDA vs CPU: |y_cuda − y_cpu| ≤ 1e-5 · Σ_k |x_k w_k| (+ one bf16 ulp of y for a
// bf16 y). Why: both sides form the same products (bf16 × bf16 is exact in fp32; fp32 × fp32
// rounds or fuses the same way, no TF32) and add K of them in fp32, but in different orders (the
// CPU in ascending k per 128-chunk, cuBLASLt in its tile / tensor-core order, whose internal
// additions may truncate). Each order's error is a few units of 2^-24 times the partial sums,
// i.e. about sqrt(K) · 2^-24 · Σ|x w| for random signs (~4e-6 at K = 4096) — and at worst
// K · 2^-24 · Σ|x w| only with adversarial data; 1e-5 · Σ|x w| bounds the difference of the two
// with margin on these random inputs. A bf16 y is rounded once from each side's fp32 value, and
// two fp32 values that differ slightly can round to neighbouring bf16 values: one ulp more.
void expect_gemm_match(const std::string& what, const HostTensor& cpu, const HostTensor& gpu,
                       const std::vector<double>& abs_sum, DType y_dt) {
  ASSERT_EQ(cpu.numel(), static_cast<int64_t>(abs_sum.size()));
  ASSERT_EQ(gpu.numel(), cpu.numel());
  int bad = 0;
  for (int64_t i = 0; i < cpu.numel() && bad < 10; ++i) {
    const double a = at(cpu, i), b = at(gpu, i);
    const double tol = 1e-5 * abs_sum[static_cast<size_t>(i)] +
                       (y_dt == DType::bf16 ? bf16_ulp(std::max(std::fabs(a), std::fabs(b))) : 0.0);
    if (!(std::fabs(a - b) <= tol)) {  // NaN (an unwritten element) fails too
      ADD_FAILURE() << what << " element " << i << ": cpu " << a << ", cuda " << b << ", tolerance " << tol;
      ++bad;
    }
  }
}

// Element-wise bit equality, except that any NaN equals any NaN (x86 keeps a NaN's payload,
// the GPU returns its canonical NaN).
void expect_same_values(const std::string& what, const HostTensor& cpu, const HostTensor& gpu) {
  ASSERT_EQ(cpu.numel(), gpu.numel());
  ASSERT_EQ(cpu.dtype(), gpu.dtype());
  const size_t elem = dsv4::dtype_size(cpu.dtype());
  int bad = 0;
  for (int64_t i = 0; i < cpu.numel() && bad < 10; ++i) {
    const double a = at(cpu, i), b = at(gpu, i);
    if (std::isnan(a) && std::isnan(b)) continue;
    if (std::memcmp(cpu.data<uint8_t>() + i * elem, gpu.data<uint8_t>() + i * elem, elem) != 0) {
      ADD_FAILURE() << what << " element " << i << ": cpu " << a << ", cuda " << b;
      ++bad;
    }
  }
}

// ---- linear ------------------------------------------------------------------------------------
struct LinearCase {
  int64_t T, K, N;
  DType ab, y;
};

class LinearCpuVsCuda : public ::testing::TestWithParam<LinearCase> {};

TEST_P(LinearCpuVsCuda, SameResults) {
  DSV4_SKIP_WITHOUT_GPU();
  const LinearCase c = GetParam();
  const Enc enc = c.ab == DType::bf16 ? Enc::bf16 : Enc::fp32;
  const Operand x = make_operand(enc, 0, c.T, c.K, 1, 1, 10 + c.T + c.K);
  const Operand w = make_operand(enc, 0, c.N, c.K, 1, 1, 20 + c.N + c.K);
  HostTensor y_cpu = poisoned(c.y, {c.T, c.N});
  dsv4::linear(x.values, {}, w.values, {}, y_cpu);

  const DeviceTensor xd = DeviceTensor::from_host(x.values), wd = DeviceTensor::from_host(w.values);
  DeviceTensor yd = poisoned_device(c.y, {c.T, c.N});
  dsv4::linear(xd, {}, wd, {}, yd);
  const HostTensor y_gpu = synced_to_host(yd);
  const GemmReference ref = reference_gemm(x.real, 0, c.K, w.real, 0, c.T, c.N, c.K);
  expect_gemm_match("linear", y_cpu, y_gpu, ref.abs_sum, c.y);

  // Deterministic: the same call again gives the same bytes.
  DeviceTensor yd2 = poisoned_device(c.y, {c.T, c.N});
  dsv4::linear(xd, {}, wd, {}, yd2);
  EXPECT_EQ(bytes_of(synced_to_host(yd2)), bytes_of(y_gpu));
}

// T 0 / 1 / small / over a 64-row tile; K and N multiples of 16, multiples of 8 only, and odd
// (cuBLASLt gets the real alignments and must find an algorithm for each); the layer's
// projections at reduced width (dim 4096 → q_lora 1024, q_lora 1024 → H·D, o_lora·G → dim).
// bf16 problems of at most 32 rows with N a multiple of 64 and K of 64 run the skinny kernel
// (skinny_gemm.h): T 1 … 4 of those shapes, and its token tiles of 16 and 32 full and padded
// ({17, 192, 320}: 3 K blocks, 5 column tiles; {32, 64, 64}: one of each).
std::vector<LinearCase> linear_grid() {
  std::vector<LinearCase> grid;
  const std::vector<std::tuple<int64_t, int64_t, int64_t>> shapes = {
      {0, 256, 128}, {1, 256, 128}, {5, 320, 200}, {70, 128, 64}, {133, 384, 96},
      {7, 200, 72},  {9, 77, 33},   {1, 24, 8},    {3, 4096, 1024}, {2, 1024, 4096}, {4, 8192, 512},
      {17, 192, 320}, {32, 64, 64}, {16, 4096, 2048}};
  for (const auto& [T, K, N] : shapes) {
    grid.push_back({T, K, N, DType::bf16, DType::bf16});
    grid.push_back({T, K, N, DType::bf16, DType::fp32});
    if (K * N <= (int64_t{1} << 20)) grid.push_back({T, K, N, DType::fp32, DType::fp32});
  }
  return grid;
}

INSTANTIATE_TEST_SUITE_P(Grid, LinearCpuVsCuda, ::testing::ValuesIn(linear_grid()),
                         [](const auto& info) {
                           const LinearCase& c = info.param;
                           std::ostringstream name;
                           name << "T" << c.T << "_K" << c.K << "_N" << c.N << "_"
                                << dsv4::dtype_name(c.ab) << "_y" << dsv4::dtype_name(c.y);
                           return name.str();
                         });

// Both kernels of a bf16 linear at the same sizes (src/runtime/gemm_path.h forces one), with a
// workspace (the skinny kernel splits K): its 64- and 128-token tiles, which the automatic choice
// does not reach yet (T 33 and 100 padded, 64 and 128 full, 256 two tiles), and cuBLASLt; at the
// tolerance above, the skinny kernel repeatable bit for bit. Shapes: 5 K blocks over 3 column
// tiles, and a compressor projection (dim 4096 → 1024).
struct LinearPathCase {
  int64_t T, K, N;
  dsv4::rt::GemmPath path;
  DType y;
};
class LinearOnPathCpuVsCuda : public ::testing::TestWithParam<LinearPathCase> {};

TEST_P(LinearOnPathCpuVsCuda, SameResults) {
  DSV4_SKIP_WITHOUT_GPU();
  const LinearPathCase c = GetParam();
  const Operand x = make_operand(Enc::bf16, 0, c.T, c.K, 1, 1, 30 + c.T + c.K);
  const Operand w = make_operand(Enc::bf16, 0, c.N, c.K, 1, 1, 40 + c.N + c.K);
  HostTensor y_cpu = poisoned(c.y, {c.T, c.N});
  dsv4::linear(x.values, {}, w.values, {}, y_cpu);

  const DeviceTensor xd = DeviceTensor::from_host(x.values), wd = DeviceTensor::from_host(w.values);
  const DeviceTensor work(DType::uint8, {dsv4::kGemmWorkspaceBytes});
  DeviceTensor yd = poisoned_device(c.y, {c.T, c.N}), yd2 = poisoned_device(c.y, {c.T, c.N});
  dsv4::rt::linear_on_path({c.path}, xd, {}, wd, {}, yd, work, nullptr);
  dsv4::rt::linear_on_path({c.path}, xd, {}, wd, {}, yd2, work, nullptr);
  const HostTensor y_gpu = synced_to_host(yd);
  const GemmReference ref = reference_gemm(x.real, 0, c.K, w.real, 0, c.T, c.N, c.K);
  expect_gemm_match(std::string("linear on ") + dsv4::rt::gemm_path_name(c.path), y_cpu, y_gpu, ref.abs_sum, c.y);
  if (c.path == dsv4::rt::GemmPath::skinny) EXPECT_EQ(bytes_of(synced_to_host(yd2)), bytes_of(y_gpu)) << "not deterministic";
}

std::vector<LinearPathCase> linear_path_grid() {
  std::vector<LinearPathCase> grid;
  for (int64_t T : {33, 64, 100, 128, 256})
    for (const auto& [K, N] : {std::pair<int64_t, int64_t>{320, 192}, {4096, 1024}})
      for (auto path : {dsv4::rt::GemmPath::skinny, dsv4::rt::GemmPath::cublaslt})
        grid.push_back({T, K, N, path, T % 2 ? DType::bf16 : DType::fp32});
  return grid;
}

INSTANTIATE_TEST_SUITE_P(Grid, LinearOnPathCpuVsCuda, ::testing::ValuesIn(linear_path_grid()),
                         [](const auto& info) {
                           const LinearPathCase& c = info.param;
                           std::ostringstream name;
                           name << "T" << c.T << "_K" << c.K << "_N" << c.N << "_y" << dsv4::dtype_name(c.y) << "_"
                                << dsv4::rt::gemm_path_name(c.path);
                           return name.str();
                         });

// Strided views: x a column window of a wider matrix (like q / kv split from one projection's
// output), starting `offset` elements in, and y with padded rows whose padding stays untouched.
void run_strided_linear(int64_t offset, int64_t N = 72) {
  const int64_t T = 6, K = 256, pad = 40;
  const HostTensor wide = random_tensor(DType::bf16, {T, K + pad}, 9);
  const Operand w = make_operand(Enc::bf16, 0, N, K, 1, 1, 10);
  HostTensor y_cpu_buf = poisoned(DType::fp32, {T, N + 8});
  dsv4::linear(window(wide, offset, 1, K), {}, w.values, {}, window(y_cpu_buf, 0, 1, N));

  const DeviceTensor wide_d = DeviceTensor::from_host(wide), wd = DeviceTensor::from_host(w.values);
  DeviceTensor y_gpu_buf = poisoned_device(DType::fp32, {T, N + 8});
  dsv4::linear(window(wide_d, offset, 1, K), {}, wd, {}, window(y_gpu_buf, 0, 1, N));
  const HostTensor y_gpu = synced_to_host(y_gpu_buf);

  const GemmReference ref = reference_gemm(to_doubles(wide), offset, K + pad, w.real, 0, T, N, K);
  HostTensor cpu_rows(DType::fp32, {T, N}), gpu_rows(DType::fp32, {T, N});
  for (int64_t t = 0; t < T; ++t) {
    for (int64_t n = 0; n < N; ++n) {
      cpu_rows.set(t * N + n, y_cpu_buf.get(t * (N + 8) + n));
      gpu_rows.set(t * N + n, y_gpu.get(t * (N + 8) + n));
    }
    for (int64_t n = N; n < N + 8; ++n) EXPECT_TRUE(std::isnan(at(y_gpu, t * (N + 8) + n))) << "padding written";
  }
  expect_gemm_match("strided linear", cpu_rows, gpu_rows, ref.abs_sum, DType::fp32);
}

TEST(LinearCpuVsCudaLayout, StridedViews16ByteAligned) {
  DSV4_SKIP_WITHOUT_GPU();
  run_strided_linear(8);  // 16-byte aligned window, row stride 592 bytes
}
TEST(LinearCpuVsCudaLayout, StridedViewsSkinnyKernel) {
  DSV4_SKIP_WITHOUT_GPU();
  run_strided_linear(8, 128);  // N 128: the skinny kernel, its TMA maps over the window's rows
}
TEST(LinearCpuVsCudaLayout, StridedViewsOddOffset) {
  DSV4_SKIP_WITHOUT_GPU();
  run_strided_linear(3);  // 2-byte aligned window: cuBLASLt must pick an algorithm for it
}

// CUDA-only rejections and a mixed-device call: dsv4::Error, nothing written.
TEST(LinearCpuVsCudaErrors, RejectedOnCudaAndNothingWritten) {
  DSV4_SKIP_WITHOUT_GPU();
  const Operand x = make_operand(Enc::bf16, 0, 4, 256, 1, 1, 1);
  const Operand x32 = make_operand(Enc::fp32, 0, 4, 256, 1, 1, 2);
  const Operand w = make_operand(Enc::bf16, 0, 64, 256, 1, 1, 3);
  const Operand w32 = make_operand(Enc::fp32, 0, 64, 256, 1, 1, 4);
  const Operand w8 = make_operand(Enc::fp8_ue8m0, 0, 64, 256, 128, 128, 5);
  const Operand x8 = make_operand(Enc::fp8_ue8m0, 0, 4, 256, 1, 128, 6);
  const DeviceTensor xd = DeviceTensor::from_host(x.values), x32d = DeviceTensor::from_host(x32.values);
  const DeviceTensor wd = DeviceTensor::from_host(w.values), w32d = DeviceTensor::from_host(w32.values);
  const DeviceTensor w8d = DeviceTensor::from_host(w8.values), w8s = DeviceTensor::from_host(w8.scale);
  const DeviceTensor x8d = DeviceTensor::from_host(x8.values), x8s = DeviceTensor::from_host(x8.scale);
  DeviceTensor y = poisoned_device(DType::bf16, {4, 64});
  TensorView x_overlap = xd.view();  // rows 8 elements apart: overlapping, fine on CPU only
  x_overlap.strides[0] = 8;

  // FP8 runs on FP8 tensor cores only with both operands FP8 (tests/cuda/test_fp8_gemm_cpu_vs_cuda.cpp).
  expect_error([&] { dsv4::linear(xd, {}, w8d, w8s, y); }, {"linear", "w.dtype", "fp8_e4m3", "quantize_act_fp8"});
  expect_error([&] { dsv4::linear(x8d, x8s, wd, {}, y); }, {"linear", "x.dtype", "same dtype"});
  expect_error([&] { dsv4::linear(xd, {}, w32d, {}, y); }, {"linear", "same dtype", "bf16", "fp32"});
  expect_error([&] { dsv4::linear(x32d, {}, w32d, {}, y); }, {"linear", "y.dtype", "fp32", "bf16"});
  expect_error([&] { dsv4::linear(x_overlap, {}, wd, {}, y); }, {"linear", "x", "row stride", ">= 256", "8"});
  expect_error([&] { dsv4::linear(x.values, {}, wd, {}, y); }, {"linear", "device"});
  EXPECT_EQ(bytes_of(synced_to_host(y)), std::vector<uint8_t>(4 * 64 * 2, 0xFF));
}

// ---- batched_linear ----------------------------------------------------------------------------
// The V3.2 layer's absorptions: the B heads of x [T, B, K + 64] (batch stride K + 64, row stride
// B·(K + 64)) times per-head weights, into the first N columns of each head of y [T, B + 3, N + 64]
// — batches interleaved in memory on both sides. Every written element within expect_gemm_match's
// tolerance of the CPU's (the same argument as linear's: same products, another fp32 order); every
// other element of y still poisoned; the same bytes on a second call.
struct BatchedCase {
  int64_t B, T, N, K;
  DType ab, y;
};
class BatchedLinearCpuVsCuda : public ::testing::TestWithParam<BatchedCase> {};

TensorView heads_view(TensorView v, int64_t B, int64_t T, int64_t cols, int64_t head_width, int64_t heads) {
  v.ndim = 3;
  v.shape = {B, T, cols};
  v.strides = {head_width, heads * head_width, 1};
  return v;
}

TEST_P(BatchedLinearCpuVsCuda, SameResults) {
  DSV4_SKIP_WITHOUT_GPU();
  const BatchedCase c = GetParam();
  constexpr int64_t kPad = 64, kSpare = 3;
  const int64_t Hp = c.B + kSpare, x_width = c.K + kPad, y_width = c.N + kPad;
  const HostTensor x = random_tensor(c.ab, {c.T, c.B, x_width}, 40 + c.K);
  const HostTensor w = random_tensor(c.ab, {c.B, c.N, c.K}, 50 + c.N);
  HostTensor y_cpu = poisoned(c.y, {c.T, Hp, y_width});
  dsv4::batched_linear(heads_view(x, c.B, c.T, c.K, x_width, c.B), w,
                       heads_view(y_cpu, c.B, c.T, c.N, y_width, Hp));

  const DeviceTensor xd = DeviceTensor::from_host(x), wd = DeviceTensor::from_host(w);
  DeviceTensor yd = poisoned_device(c.y, {c.T, Hp, y_width});
  dsv4::batched_linear(heads_view(xd, c.B, c.T, c.K, x_width, c.B), wd, heads_view(yd, c.B, c.T, c.N, y_width, Hp));
  const HostTensor y_gpu = synced_to_host(yd);

  const std::vector<double> xr = to_doubles(x), wr = to_doubles(w);
  HostTensor cpu_head(c.y, {c.T, c.N}), gpu_head(c.y, {c.T, c.N});
  for (int64_t b = 0; b < c.B; ++b) {
    const GemmReference ref = reference_gemm(xr, b * x_width, c.B * x_width, wr, b * c.N * c.K, c.T, c.N, c.K);
    for (int64_t t = 0; t < c.T; ++t)
      for (int64_t n = 0; n < c.N; ++n) {
        cpu_head.set(t * c.N + n, y_cpu.get((t * Hp + b) * y_width + n));
        gpu_head.set(t * c.N + n, y_gpu.get((t * Hp + b) * y_width + n));
      }
    expect_gemm_match("batched_linear head " + std::to_string(b), cpu_head, gpu_head, ref.abs_sum, c.y);
  }
  for (int64_t t = 0; t < c.T; ++t)
    for (int64_t h = 0; h < Hp; ++h)
      for (int64_t n = h < c.B ? c.N : 0; n < y_width; ++n)
        ASSERT_TRUE(std::isnan(at(y_gpu, (t * Hp + h) * y_width + n))) << "written outside: t " << t << " h " << h << " n " << n;

  DeviceTensor yd2 = poisoned_device(c.y, {c.T, Hp, y_width});
  dsv4::batched_linear(heads_view(xd, c.B, c.T, c.K, x_width, c.B), wd, heads_view(yd2, c.B, c.T, c.N, y_width, Hp));
  EXPECT_EQ(bytes_of(synced_to_host(yd2)), bytes_of(y_gpu));
}

// W_UK (K 128 → N 512) and W_UV (512 → 128) at tiny-v3.2's 16 and V3.2's 128 heads, decode and
// prefill row counts; odd sizes (cuBLASLt gets the real alignments); one batch, one row.
std::vector<BatchedCase> batched_grid() {
  std::vector<BatchedCase> grid;
  const std::vector<std::tuple<int64_t, int64_t, int64_t, int64_t>> shapes = {
      {16, 5, 512, 128}, {16, 5, 128, 512}, {128, 4, 512, 128}, {128, 64, 128, 512},
      {3, 7, 33, 70},    {1, 1, 8, 16},     {128, 0, 512, 128}};
  for (const auto& [B, T, N, K] : shapes) {
    grid.push_back({B, T, N, K, DType::bf16, DType::bf16});
    grid.push_back({B, T, N, K, DType::bf16, DType::fp32});
    if (B * N * K <= (int64_t{1} << 20)) grid.push_back({B, T, N, K, DType::fp32, DType::fp32});
  }
  return grid;
}
INSTANTIATE_TEST_SUITE_P(Grid, BatchedLinearCpuVsCuda, ::testing::ValuesIn(batched_grid()),
                         [](const auto& info) {
                           const BatchedCase& c = info.param;
                           std::ostringstream name;
                           name << "B" << c.B << "_T" << c.T << "_N" << c.N << "_K" << c.K << "_"
                                << dsv4::dtype_name(c.ab) << "_y" << dsv4::dtype_name(c.y);
                           return name.str();
                         });

// Mixed operand dtypes (fine on the CPU) and a host argument are refused on CUDA; nothing written.
TEST(BatchedLinearCpuVsCudaErrors, RejectedOnCudaAndNothingWritten) {
  DSV4_SKIP_WITHOUT_GPU();
  const DeviceTensor x = DeviceTensor::from_host(random_tensor(DType::bf16, {4, 3, 64}, 1));
  const HostTensor w_host = random_tensor(DType::bf16, {4, 32, 64}, 2);
  const DeviceTensor w = DeviceTensor::from_host(w_host);
  const DeviceTensor w32 = DeviceTensor::from_host(random_tensor(DType::fp32, {4, 32, 64}, 3));
  DeviceTensor y = poisoned_device(DType::bf16, {4, 3, 32});
  expect_error([&] { dsv4::batched_linear(x, w32, y); }, {"batched_linear", "same dtype", "bf16", "fp32"});
  expect_error([&] { dsv4::batched_linear(x, w_host, y); }, {"batched_linear", "device"});
  EXPECT_EQ(bytes_of(synced_to_host(y)), std::vector<uint8_t>(4 * 3 * 32 * 2, 0xFF));
}

// ---- grouped_wo_a ------------------------------------------------------------------------------
struct GroupedCase {
  int64_t T, G, L, Dg;
  DType ab, z;
};
class GroupedWoACpuVsCuda : public ::testing::TestWithParam<GroupedCase> {};

TEST_P(GroupedWoACpuVsCuda, SameResults) {
  DSV4_SKIP_WITHOUT_GPU();
  const GroupedCase c = GetParam();
  const Enc enc = c.ab == DType::bf16 ? Enc::bf16 : Enc::fp32;
  const Operand o = make_operand(enc, 0, c.T, c.G * c.Dg, 1, 1, 30 + c.T + c.Dg);
  const Operand w = make_operand(enc, c.G, c.L, c.Dg, 1, 1, 40 + c.L);
  HostTensor z_cpu = poisoned(c.z, {c.T, c.G * c.L});
  dsv4::grouped_wo_a(o.values, {}, w.values, {}, z_cpu);

  const DeviceTensor od = DeviceTensor::from_host(o.values), wd = DeviceTensor::from_host(w.values);
  DeviceTensor zd = poisoned_device(c.z, {c.T, c.G * c.L});
  dsv4::grouped_wo_a(od, {}, wd, {}, zd);
  const HostTensor z_gpu = synced_to_host(zd);

  std::vector<double> abs_sum(static_cast<size_t>(c.T * c.G * c.L));
  for (int64_t g = 0; g < c.G; ++g) {
    const GemmReference ref = reference_gemm(o.real, g * c.Dg, c.G * c.Dg, w.real, g * c.L * c.Dg, c.T, c.L, c.Dg);
    for (int64_t t = 0; t < c.T; ++t)
      for (int64_t l = 0; l < c.L; ++l)
        abs_sum[static_cast<size_t>(t * c.G * c.L + g * c.L + l)] = ref.abs_sum[static_cast<size_t>(t * c.L + l)];
  }
  expect_gemm_match("grouped_wo_a", z_cpu, z_gpu, abs_sum, c.z);
}

// G 8 (the model's o_groups) with L 64 … 1024 (o_lora 1024) and group widths up to the real
// H·D/G = 64 · 512 / 8 = 4096; T 0, 1, a few, over a tile; G 4 with odd-ish widths.
std::vector<GroupedCase> grouped_grid() {
  std::vector<GroupedCase> grid;
  const std::vector<std::tuple<int64_t, int64_t, int64_t, int64_t>> shapes = {
      {0, 8, 64, 256}, {1, 8, 64, 512}, {5, 8, 128, 512}, {67, 4, 96, 192}, {3, 8, 256, 1024},
      {2, 8, 1024, 4096}, {3, 4, 40, 72}};
  for (const auto& [T, G, L, Dg] : shapes) {
    grid.push_back({T, G, L, Dg, DType::bf16, DType::bf16});
    grid.push_back({T, G, L, Dg, DType::bf16, DType::fp32});
    if (L * Dg <= (int64_t{1} << 18)) grid.push_back({T, G, L, Dg, DType::fp32, DType::fp32});
  }
  return grid;
}

INSTANTIATE_TEST_SUITE_P(Grid, GroupedWoACpuVsCuda, ::testing::ValuesIn(grouped_grid()),
                         [](const auto& info) {
                           const GroupedCase& c = info.param;
                           std::ostringstream name;
                           name << "T" << c.T << "_G" << c.G << "_L" << c.L << "_Dg" << c.Dg << "_"
                                << dsv4::dtype_name(c.ab) << "_z" << dsv4::dtype_name(c.z);
                           return name.str();
                         });

// The layer's path for a bf16 wo_a with FP8 activations on CUDA: quantize o (1×128 blocks),
// dequantize it back to bf16 (exact), then the bf16 grouped GEMM — against the CPU's grouped_wo_a
// on the FP8 operands directly (same real values, so the GEMM tolerance applies); and mixed FP8 /
// bf16 operands are rejected on CUDA, nothing written (the FP8 GEMM itself:
// tests/cuda/test_fp8_gemm_cpu_vs_cuda.cpp).
TEST(GroupedWoACpuVsCudaFp8, DequantizedOperandsMatchCpuFp8Path) {
  DSV4_SKIP_WITHOUT_GPU();
  const int64_t T = 3, G = 8, L = 128, Dg = 512;
  const HostTensor o = random_tensor(DType::bf16, {T, G * Dg}, 50);
  HostTensor oq(DType::fp8_e4m3, {T, G * Dg}), os(DType::ue8m0, {T, G * Dg / 128});
  dsv4::quantize_act_fp8(o, 128, oq, os);
  const Operand w = make_operand(Enc::fp8_ue8m0, G, L, Dg, 128, 128, 51);
  HostTensor z_cpu = poisoned(DType::bf16, {T, G * L});
  dsv4::grouped_wo_a(oq, os, w.values, w.scale, z_cpu);

  const DeviceTensor od = DeviceTensor::from_host(o);
  DeviceTensor oqd(DType::fp8_e4m3, {T, G * Dg}), osd(DType::ue8m0, {T, G * Dg / 128});
  dsv4::quantize_act_fp8(od, 128, oqd, osd);
  DeviceTensor o_bf16 = poisoned_device(DType::bf16, {T, G * Dg});
  dsv4::dequantize_fp8_blocks(oqd, osd, 1, 128, o_bf16);
  const DeviceTensor wq = DeviceTensor::from_host(w.values), ws = DeviceTensor::from_host(w.scale);
  DeviceTensor w_bf16 = poisoned_device(DType::bf16, {G, L, Dg});
  dsv4::dequantize_fp8_blocks(wq, ws, 128, 128, w_bf16);
  DeviceTensor zd = poisoned_device(DType::bf16, {T, G * L});
  dsv4::grouped_wo_a(o_bf16, {}, w_bf16, {}, zd);
  const HostTensor z_gpu = synced_to_host(zd);

  // Σ|o w| from the quantized activations and the weight's real values.
  HostTensor o_real(DType::fp32, {T, G * Dg});
  dsv4::dequantize_fp8_blocks(oq, os, 1, 128, o_real);
  const std::vector<double> o_d = to_doubles(o_real);
  std::vector<double> abs_sum(static_cast<size_t>(T * G * L));
  for (int64_t g = 0; g < G; ++g) {
    const GemmReference ref = reference_gemm(o_d, g * Dg, G * Dg, w.real, g * L * Dg, T, L, Dg);
    for (int64_t t = 0; t < T; ++t)
      for (int64_t l = 0; l < L; ++l)
        abs_sum[static_cast<size_t>(t * G * L + g * L + l)] = ref.abs_sum[static_cast<size_t>(t * L + l)];
  }
  expect_gemm_match("grouped_wo_a fp8 path", z_cpu, z_gpu, abs_sum, DType::bf16);

  DeviceTensor z_untouched = poisoned_device(DType::bf16, {T, G * L});
  expect_error([&] { dsv4::grouped_wo_a(oqd, osd, w_bf16, {}, z_untouched); },
               {"grouped_wo_a", "o.dtype", "same dtype"});
  expect_error([&] { dsv4::grouped_wo_a(o_bf16, {}, wq, ws, z_untouched); },
               {"grouped_wo_a", "wo_a.dtype", "quantize_act_fp8"});
  expect_error([&] { dsv4::grouped_wo_a(o_bf16, {}, w.values, w.scale, z_untouched); }, {"grouped_wo_a", "device"});
  EXPECT_EQ(bytes_of(synced_to_host(z_untouched)), std::vector<uint8_t>(static_cast<size_t>(T * G * L * 2), 0xFF));
}

// ---- dequantize_fp8_blocks ---------------------------------------------------------------------
struct DequantCase {
  std::vector<int64_t> shape;
  int block_rows, block_cols;
  DType scale, y;
};
class DequantizeFp8BlocksCpuVsCuda : public ::testing::TestWithParam<DequantCase> {};

// Bit-exact (NaN = NaN): both sides decode with dtype.h, multiply once in fp32 and round once
// to y's dtype. The data keep every product a normal float (scales ≥ 2^-12, fp8 ≥ 2^-9), where the
// CUDA kernel's flush-to-zero never applies.
TEST_P(DequantizeFp8BlocksCpuVsCuda, SameBits) {
  DSV4_SKIP_WITHOUT_GPU();
  const DequantCase c = GetParam();
  const bool batched = c.shape.size() == 3;
  const int64_t G = batched ? c.shape[0] : 1, R = c.shape[c.shape.size() - 2], C = c.shape.back();
  const int64_t SR = (R + c.block_rows - 1) / c.block_rows, SC = (C + c.block_cols - 1) / c.block_cols;
  std::mt19937_64 rng(R + C);
  HostTensor x(DType::fp8_e4m3, c.shape);
  for (int64_t i = 0; i < x.numel(); ++i) x.data<uint8_t>()[i] = static_cast<uint8_t>(rng() & 0xFF);  // NaNs too
  HostTensor s(c.scale, batched ? std::vector<int64_t>{G, SR, SC} : std::vector<int64_t>{SR, SC});
  for (int64_t i = 0; i < s.numel(); ++i) {
    if (c.scale == DType::ue8m0)
      s.data<uint8_t>()[i] = static_cast<uint8_t>(127 - 12 + static_cast<int>(rng() % 11));
    else
      s.data<float>()[i] = 1e-3f + 1e-5f * static_cast<float>(rng() % 1000);
  }
  HostTensor y_cpu = poisoned(c.y, c.shape);
  dsv4::dequantize_fp8_blocks(x, s, c.block_rows, c.block_cols, y_cpu);

  const DeviceTensor xd = DeviceTensor::from_host(x), sd = DeviceTensor::from_host(s);
  DeviceTensor yd = poisoned_device(c.y, c.shape);
  dsv4::dequantize_fp8_blocks(xd, sd, c.block_rows, c.block_cols, yd);
  expect_same_values("dequantize_fp8_blocks", y_cpu, synced_to_host(yd));
}

INSTANTIATE_TEST_SUITE_P(
    Grid, DequantizeFp8BlocksCpuVsCuda,
    ::testing::Values(DequantCase{{256, 384}, 128, 128, DType::ue8m0, DType::bf16},
                      DequantCase{{200, 300}, 128, 128, DType::fp32, DType::bf16},
                      DequantCase{{200, 300}, 128, 128, DType::fp32, DType::fp32},
                      DequantCase{{5, 4096}, 1, 128, DType::ue8m0, DType::bf16},
                      DequantCase{{3, 256}, 1, 64, DType::fp32, DType::fp32},
                      DequantCase{{17, 23}, 3, 5, DType::ue8m0, DType::fp32},
                      DequantCase{{8, 130, 260}, 128, 128, DType::ue8m0, DType::bf16},
                      DequantCase{{8, 64, 512}, 128, 128, DType::fp32, DType::bf16},
                      DequantCase{{70000, 8}, 1, 8, DType::ue8m0, DType::bf16},  // rows > grid.y limit
                      DequantCase{{0, 128}, 1, 128, DType::ue8m0, DType::bf16}),
    [](const auto& info) {
      const DequantCase& c = info.param;
      std::ostringstream name;
      for (int64_t d : c.shape) name << d << "x";
      name << "_b" << c.block_rows << "x" << c.block_cols << "_s" << dsv4::dtype_name(c.scale) << "_y"
           << dsv4::dtype_name(c.y);
      return name.str();
    });

// Strided 3-d views on CUDA: x a column window, y with padded rows and batches; padding untouched.
TEST(DequantizeFp8BlocksCpuVsCudaLayout, StridedViews) {
  DSV4_SKIP_WITHOUT_GPU();
  const int64_t G = 3, R = 130, C = 200, pad = 16;
  HostTensor wide(DType::fp8_e4m3, {G, R, C + pad});
  std::mt19937_64 rng(7);
  for (int64_t i = 0; i < wide.numel(); ++i) wide.data<uint8_t>()[i] = static_cast<uint8_t>(rng() % 0x7E);
  HostTensor s(DType::ue8m0, {G, 2, 2});
  for (int64_t i = 0; i < s.numel(); ++i) s.data<uint8_t>()[i] = static_cast<uint8_t>(118 + i);
  HostTensor y_cpu = poisoned(DType::bf16, {G, R + 1, C + 8});
  dsv4::dequantize_fp8_blocks(window(wide, pad, 2, C), s, 128, 128, window(window(y_cpu, 0, 1, R), 0, 2, C));

  const DeviceTensor wide_d = DeviceTensor::from_host(wide), sd = DeviceTensor::from_host(s);
  DeviceTensor yd = poisoned_device(DType::bf16, {G, R + 1, C + 8});
  dsv4::dequantize_fp8_blocks(window(wide_d, pad, 2, C), sd, 128, 128, window(window(yd, 0, 1, R), 0, 2, C));
  const HostTensor y_gpu = synced_to_host(yd);
  EXPECT_EQ(bytes_of(y_gpu), bytes_of(y_cpu));  // values and untouched (0xFF) padding alike
}

// ---- quantize_act_fp8 --------------------------------------------------------------------------

using QuantParams = std::tuple<int64_t /*T*/, int64_t /*K*/, int /*block*/, DType /*x*/, DType /*scale*/>;
class QuantizeActFp8CpuVsCuda : public ::testing::TestWithParam<QuantParams> {};

// Bit-exact: both sides run the same dtype.h helpers on the same inputs (the block max is exact
// in any order, the scale division is IEEE on both, the rest is encoding).
TEST_P(QuantizeActFp8CpuVsCuda, SameCodesAndScales) {
  DSV4_SKIP_WITHOUT_GPU();
  const auto [T, K, block, x_dt, s_dt] = GetParam();
  HostTensor x = random_tensor(x_dt, {T, K}, 60 + T + K);
  shape_blocks(x, T, K, block, 61 + K);
  HostTensor xq_cpu = poisoned(DType::fp8_e4m3, {T, K}), s_cpu = poisoned(s_dt, {T, K / block});
  dsv4::quantize_act_fp8(x, block, xq_cpu, s_cpu);

  const DeviceTensor xd = DeviceTensor::from_host(x);
  DeviceTensor xqd = poisoned_device(DType::fp8_e4m3, {T, K}), sd = poisoned_device(s_dt, {T, K / block});
  dsv4::quantize_act_fp8(xd, block, xqd, sd);
  const HostTensor xq_gpu = synced_to_host(xqd), s_gpu = synced_to_host(sd);
  EXPECT_EQ(bytes_of(s_gpu), bytes_of(s_cpu)) << "scales";
  const std::vector<uint8_t> a = bytes_of(xq_cpu), b = bytes_of(xq_gpu);
  int bad = 0;
  for (size_t i = 0; i < a.size() && bad < 10; ++i)
    if (a[i] != b[i]) {
      ADD_FAILURE() << "xq[" << i / K << "][" << i % K << "]: cpu 0x" << std::hex << int(a[i]) << ", cuda 0x"
                    << int(b[i]) << std::dec << " (x " << at(x, static_cast<int64_t>(i)) << ")";
      ++bad;
    }
}

INSTANTIATE_TEST_SUITE_P(
    Grid, QuantizeActFp8CpuVsCuda,
    ::testing::Combine(::testing::Values<int64_t>(0, 1, 3, 17, 300), ::testing::Values<int64_t>(128, 512, 4096),
                       ::testing::Values(64, 128), ::testing::Values(DType::bf16, DType::fp32),
                       ::testing::Values(DType::ue8m0, DType::fp32)));

// Strided rows on CUDA: x a column window of a wider matrix, xq / scale with padded rows that
// stay untouched — same bytes as the CPU on the same views.
TEST(QuantizeActFp8CpuVsCudaLayout, StridedRows) {
  DSV4_SKIP_WITHOUT_GPU();
  const int64_t T = 5, K = 512, block = 128;
  HostTensor wide = random_tensor(DType::bf16, {T, K + 64}, 70);
  shape_blocks(wide, T, K + 64, 64, 71);
  HostTensor xq_cpu = poisoned(DType::fp8_e4m3, {T, K + 16}), s_cpu = poisoned(DType::fp32, {T, 6});
  dsv4::quantize_act_fp8(window(wide, 32, 1, K), block, window(xq_cpu, 0, 1, K), window(s_cpu, 0, 1, K / block));

  const DeviceTensor wide_d = DeviceTensor::from_host(wide);
  DeviceTensor xqd = poisoned_device(DType::fp8_e4m3, {T, K + 16}), sd = poisoned_device(DType::fp32, {T, 6});
  dsv4::quantize_act_fp8(window(wide_d, 32, 1, K), block, window(xqd, 0, 1, K), window(sd, 0, 1, K / block));
  EXPECT_EQ(bytes_of(synced_to_host(xqd)), bytes_of(xq_cpu));
  EXPECT_EQ(bytes_of(synced_to_host(sd)), bytes_of(s_cpu));
}

TEST(QuantizeActFp8CpuVsCudaErrors, MixedDevicesRejectedNothingWritten) {
  DSV4_SKIP_WITHOUT_GPU();
  const HostTensor x = random_tensor(DType::bf16, {2, 256}, 1);
  DeviceTensor xq = poisoned_device(DType::fp8_e4m3, {2, 256}), s = poisoned_device(DType::ue8m0, {2, 2});
  expect_error([&] { dsv4::quantize_act_fp8(x, 128, xq, s); }, {"quantize_act_fp8", "device"});
  EXPECT_EQ(bytes_of(synced_to_host(xq)), std::vector<uint8_t>(512, 0xFF));
  EXPECT_EQ(bytes_of(synced_to_host(s)), std::vector<uint8_t>(4, 0xFF));
}

}  // namespace

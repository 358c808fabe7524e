// The FP8 projections on CUDA (block-scaled GEMMs: x 1 × 128, w 128 × 128 fp32 scales in
// cuBLASLt's layouts) against the CPU reference GEMM on the same FP8 operands, through the public
// linear / grouped_wo_a: decode sizes (T 1 … 256), prefill sizes, N / K multiples of 128 and the
// real V4-Flash projections; outputs poisoned on both sides, every element compared. Decode sizes
// with few output tiles run the skinny kernel (skinny_gemm.h: T ≤ 32, N a multiple of 64,
// K split over CTAs when a workspace is given), the others cuBLASLt; both accumulate each
// 128-deep slice in one FP8 wgmma chain, so one tolerance covers both.
//
// Tolerance, CUDA vs CPU: |y_cuda − y_cpu| ≤ 2e-3 · Σ_k |x_k w_k| (+ one bf16 ulp for a bf16 y).
// Both sides form the same exact products (e4m3 × e4m3 fits fp32) and apply the same scales per
// 128-deep slice of K. The CPU adds each slice in fp32, in order. Hopper's FP8 MMA keeps only
// about 14 mantissa bits in its accumulator (DeepSeek-V3 report, §3.3.2, the reason for the 1 × 128
// promotion), and a 128-deep slice takes 4 MMA steps of 32: up to ~4 · 2^-14 ≈ 2.4e-4 of the
// slice's Σ|x w| lost; cuBLASLt then adds the promoted slices in fp32 (~1e-6). Measured on the
// H100 (2026-11-25): up to 5.2e-4 of Σ|x w| at K = 128 (so the accumulator truncates somewhat
// more than that estimate), hence 2e-3, about 4× the worst seen; a wrong scale, layout or block
// moves results by O(1) of Σ|x w|.
// Row counts: CUDA FP8 GEMMs take multiples of kFp8GemmRowMultiple (4) rows (cuBLASLt's
// activation-scale rule); other counts must be refused with an error naming the rows.
#include <cuda_runtime.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <sstream>
#include <string>
#include <vector>

#include "cpu/dense_operands.h"
#include "cuda/gpu_test_util.h"
#include "dsv4/device_tensor.h"
#include "dsv4/ops.h"
#include "dsv4/weights.h"

namespace {
using namespace dense_test;
using dsv4::DeviceTensor;

DeviceTensor poisoned_device(DType dt, std::vector<int64_t> dims) {
  DeviceTensor d(dt, std::move(dims));
  d.fill_bytes(0xFF);
  return d;
}
HostTensor finish(const DeviceTensor& d) {
  EXPECT_EQ(cudaDeviceSynchronize(), cudaSuccess);
  return d.to_host();
}
TensorView transposed(TensorView v) {
  std::swap(v.shape[0], v.shape[1]);
  std::swap(v.strides[0], v.strides[1]);
  return v;
}
double bf16_ulp(double v) { return v == 0.0 ? std::ldexp(1.0, -133) : std::ldexp(1.0, std::ilogb(v) - 7); }

// An FP8 activation [T, K]: random bf16 quantized by quantize_act_fp8 (fp32 scales) on the host,
// its scales both as the CUDA layout's contiguous [K/128, T] buffer and row-major; `real` the
// dequantized values (fp32, for Σ|x w|).
struct Fp8Activation {
  HostTensor codes, scale_t /* [K/128, T] */, real;
  TensorView host_scale() const { return transposed(scale_t.view()); }
};
Fp8Activation make_activation(int64_t T, int64_t K, uint64_t seed) {
  Fp8Activation a{HostTensor(DType::fp8_e4m3, {T, K}), HostTensor(DType::fp32, {K / 128, T}),
                  HostTensor(DType::fp32, {T, K})};
  const HostTensor x = random_tensor(DType::bf16, {T, K}, seed, 0.01, 4.0);
  dsv4::quantize_act_fp8(x, 128, a.codes, a.host_scale());
  HostTensor row_major(DType::fp32, {T, K / 128});
  for (int64_t t = 0; t < T; ++t)
    for (int64_t b = 0; b < K / 128; ++b) row_major.data<float>()[t * (K / 128) + b] = a.scale_t.data<float>()[b * T + t];
  dsv4::dequantize_fp8_blocks(a.codes, row_major, 1, 128, a.real);
  return a;
}
// An FP8 weight [G ×] N × K with random fp32 block scales, its padded CUDA scales and fp32 values.
struct Fp8Weight {
  Operand op;
  HostTensor cuda_scale, real;
};
Fp8Weight make_weight(int64_t G, int64_t N, int64_t K, uint64_t seed) {
  Fp8Weight w{make_operand(Enc::fp8_fp32, G, N, K, 128, 128, seed), {}, {}};
  w.cuda_scale = dsv4::cuda_weight_scale(dsv4::Weight{w.op.values, w.op.scale});
  w.real = dsv4::dequantize_weight(dsv4::Weight{w.op.values, w.op.scale});
  return w;
}
// The device copy of a padded CUDA scale buffer, viewed with the grid's columns.
TensorView scale_window(const DeviceTensor& d, int64_t cols) {
  TensorView v = d.view();
  v.shape[v.ndim - 1] = cols;
  return v;
}
// Σ_k |x_k w_k| per output (the GEMM's error scale), through the CPU GEMM on |x| and |w|.
HostTensor abs_sums(const HostTensor& x_real, const TensorView& w_real, int64_t T, int64_t N) {
  HostTensor xa(DType::fp32, x_real.shape()), wa(DType::fp32, {w_real.shape[0], w_real.shape[1]});
  for (int64_t i = 0; i < xa.numel(); ++i) xa.data<float>()[i] = std::fabs(x_real.data<float>()[i]);
  for (int64_t i = 0; i < wa.numel(); ++i) wa.data<float>()[i] = std::fabs(static_cast<const float*>(w_real.data)[i]);
  HostTensor s(DType::fp32, {T, N});
  dsv4::linear(xa, {}, wa, {}, s);
  return s;
}
void expect_fp8_gemm_match(const std::string& what, const HostTensor& cpu, const HostTensor& gpu,
                           const HostTensor& abs_sum, DType y_dt) {
  ASSERT_EQ(cpu.numel(), gpu.numel());
  int bad = 0;
  for (int64_t i = 0; i < cpu.numel() && bad < 10; ++i) {
    const double a = at(cpu, i), b = at(gpu, i);
    const double tol = 2e-3 * at(abs_sum, i) + (y_dt == DType::bf16 ? bf16_ulp(std::max(std::fabs(a), std::fabs(b))) : 0.0);
    if (!(std::fabs(a - b) <= tol)) {  // NaN (unwritten) fails too
      ADD_FAILURE() << what << " element " << i << ": cpu " << a << ", cuda " << b << ", tolerance " << tol;
      ++bad;
    }
  }
}

// ---- linear ------------------------------------------------------------------------------------
struct Fp8LinearCase {
  const char* name;
  int64_t T, N, K;
  DType y;
};
std::ostream& operator<<(std::ostream& os, const Fp8LinearCase& c) { return os << c.name << "_T" << c.T; }
class Fp8LinearCpuVsCuda : public ::testing::TestWithParam<Fp8LinearCase> {};

TEST_P(Fp8LinearCpuVsCuda, SameResults) {
  DSV4_SKIP_WITHOUT_GPU();
  const Fp8LinearCase c = GetParam();
  const Fp8Activation x = make_activation(c.T, c.K, 10 + c.T + c.K);
  const Fp8Weight w = make_weight(0, c.N, c.K, 20 + c.N + c.K);
  HostTensor y_cpu = poisoned(c.y, {c.T, c.N});
  dsv4::linear(x.codes, x.host_scale(), w.op.values, w.op.scale, y_cpu);

  const DeviceTensor xd = DeviceTensor::from_host(x.codes), xsd = DeviceTensor::from_host(x.scale_t);
  const DeviceTensor wd = DeviceTensor::from_host(w.op.values), wsd = DeviceTensor::from_host(w.cuda_scale);
  const DeviceTensor work(DType::uint8, {dsv4::kGemmWorkspaceBytes});
  DeviceTensor yd = poisoned_device(c.y, {c.T, c.N});
  dsv4::linear(xd, transposed(xsd.view()), wd, scale_window(wsd, w.op.scale.shape()[1]), yd);
  const HostTensor y_gpu = finish(yd);
  const HostTensor sums = abs_sums(x.real, w.real, c.T, c.N);
  expect_fp8_gemm_match("linear fp8", y_cpu, y_gpu, sums, c.y);

  // With a workspace (split-K allowed): the same tolerance; and repeatable, bit for bit.
  DeviceTensor yw = poisoned_device(c.y, {c.T, c.N}), yw2 = poisoned_device(c.y, {c.T, c.N});
  dsv4::linear(xd, transposed(xsd.view()), wd, scale_window(wsd, w.op.scale.shape()[1]), yw, work, nullptr);
  dsv4::linear(xd, transposed(xsd.view()), wd, scale_window(wsd, w.op.scale.shape()[1]), yw2, work, nullptr);
  const HostTensor y_ws = finish(yw);
  expect_fp8_gemm_match("linear fp8 with workspace", y_cpu, y_ws, sums, c.y);
  EXPECT_EQ(bytes_of(finish(yw2)), bytes_of(y_ws)) << "not deterministic";
}

std::vector<Fp8LinearCase> fp8_linear_grid() {
  std::vector<Fp8LinearCase> grid;
  // Decode sizes 1 … 256 and a prefill size on multiples of 128 (K 128 … 1024, N 128 … 1024).
  for (int64_t T : {4, 8, 12, 64, 128, 132, 256, 1000})
    for (const auto& [N, K] : {std::pair<int64_t, int64_t>{128, 128}, {256, 512}, {384, 1024}})
      grid.push_back({"grid", T, N, K, T % 2 ? DType::bf16 : DType::fp32});
  // The V4-Flash projections (dim 4096, q_lora 1024, H·D 32768, indexer 64 × 128, o_lora 8 × 1024)
  // at decode (1, 128, 256) and prefill (2048; 16384 for the cheapest) sizes.
  const struct { const char* name; int64_t N, K; } flash[] = {
      {"wq_a", 1024, 4096}, {"wkv", 512, 4096}, {"wq_b", 32768, 1024}, {"indexer_wq_b", 8192, 1024},
      {"wo_b", 4096, 8192}};
  for (const auto& s : flash)
    for (int64_t T : {4, 32, 128, 256, 2048}) grid.push_back({s.name, T, s.N, s.K, DType::bf16});
  grid.push_back({"wkv", 16384, 512, 4096, DType::fp32});
  // DeepSeek-V3.2's wkv_a (latent 512 + rope 64: N = 576, the last 64 rows own a weight scale row
  // alone) on cuBLASLt past the skinny kernel's 32 tokens, at V3.2's dim and at tiny-v3.2's.
  for (int64_t T : {4, 128, 2048}) grid.push_back({"v32_wkv_a", T, 576, 7168, DType::bf16});
  grid.push_back({"tiny_v32_wkv_a", 80, 576, 256, DType::bf16});
  // The skinny kernel's edges: token tiles of 16 and 32, full and with padded tokens; N not a
  // multiple of 128 (the last 64 columns own a weight scale row alone); K blocks that the split
  // leaves uneven (7, 14); the smallest problem (one K block).
  grid.push_back({"skinny", 20, 192, 896, DType::bf16});
  grid.push_back({"skinny", 32, 64, 128, DType::fp32});
  grid.push_back({"skinny", 16, 320, 1792, DType::fp32});
  return grid;
}

INSTANTIATE_TEST_SUITE_P(Grid, Fp8LinearCpuVsCuda, ::testing::ValuesIn(fp8_linear_grid()),
                         [](const auto& info) {
                           const Fp8LinearCase& c = info.param;
                           std::ostringstream name;
                           name << c.name << "_T" << c.T << "_N" << c.N << "_K" << c.K << "_y"
                                << dsv4::dtype_name(c.y);
                           return name.str();
                         });

// A cached plan with new data: the same shape called on other operands and scales (the plan's
// scale pointers are reset per call) gives each call's own result.
TEST(Fp8LinearCuda, CachedPlanTakesEachCallsScales) {
  DSV4_SKIP_WITHOUT_GPU();
  const int64_t T = 16, N = 256, K = 512;
  for (uint64_t seed : {1, 2, 3}) {
    const Fp8Activation x = make_activation(T, K, 100 + seed);
    const Fp8Weight w = make_weight(0, N, K, 200 + seed);
    HostTensor y_cpu = poisoned(DType::fp32, {T, N});
    dsv4::linear(x.codes, x.host_scale(), w.op.values, w.op.scale, y_cpu);
    const DeviceTensor xd = DeviceTensor::from_host(x.codes), xsd = DeviceTensor::from_host(x.scale_t);
    const DeviceTensor wd = DeviceTensor::from_host(w.op.values), wsd = DeviceTensor::from_host(w.cuda_scale);
    DeviceTensor yd = poisoned_device(DType::fp32, {T, N});
    dsv4::linear(xd, transposed(xsd.view()), wd, scale_window(wsd, K / 128), yd);
    expect_fp8_gemm_match("seed " + std::to_string(seed), y_cpu, finish(yd), abs_sums(x.real, w.real, T, N),
                          DType::fp32);
  }
}

// Capturable in a CUDA graph (no synchronization, allocation or host copy inside a call once the
// shape's plan exists): capture one FP8 linear with a workspace on a stream, then replay the graph
// on new activations written into the captured buffers — each replay gives the new data's result.
class Fp8LinearGraph : public ::testing::TestWithParam<int64_t> {};

TEST_P(Fp8LinearGraph, CapturedInACudaGraphAndReplayedOnNewData) {
  DSV4_SKIP_WITHOUT_GPU();
  const int64_t T = GetParam(), N = 1024, K = 4096;  // a decode-sized wq_a
  const Fp8Weight w = make_weight(0, N, K, 7);
  const DeviceTensor wd = DeviceTensor::from_host(w.op.values), wsd = DeviceTensor::from_host(w.cuda_scale);
  const TensorView ws = scale_window(wsd, K / 128);
  const Fp8Activation first = make_activation(T, K, 8);
  DeviceTensor xd = DeviceTensor::from_host(first.codes), xsd = DeviceTensor::from_host(first.scale_t);
  const DeviceTensor work(DType::uint8, {dsv4::kGemmWorkspaceBytes});
  DeviceTensor yd = poisoned_device(DType::bf16, {T, N});
  cudaStream_t stream = nullptr;
  DSV4_ASSERT_CUDA(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking));
  dsv4::linear(xd, transposed(xsd.view()), wd, ws, yd, work, stream);  // warm-up: builds the plan
  DSV4_ASSERT_CUDA(cudaStreamSynchronize(stream));
  cudaGraph_t graph = nullptr;
  DSV4_ASSERT_CUDA(cudaStreamBeginCapture(stream, cudaStreamCaptureModeGlobal));
  dsv4::linear(xd, transposed(xsd.view()), wd, ws, yd, work, stream);
  DSV4_ASSERT_CUDA(cudaStreamEndCapture(stream, &graph));
  cudaGraphExec_t exec = nullptr;
  DSV4_ASSERT_CUDA(cudaGraphInstantiate(&exec, graph, 0));
  for (uint64_t seed : {9, 10}) {
    const Fp8Activation x = make_activation(T, K, seed);
    dsv4::copy_to_device(x.codes, xd);
    dsv4::copy_to_device(x.scale_t, xsd);
    yd.fill_bytes(0xFF);
    DSV4_ASSERT_CUDA(cudaDeviceSynchronize());  // the copies and the poison land before the replay
    DSV4_ASSERT_CUDA(cudaGraphLaunch(exec, stream));
    DSV4_ASSERT_CUDA(cudaStreamSynchronize(stream));
    HostTensor y_cpu = poisoned(DType::bf16, {T, N});
    dsv4::linear(x.codes, x.host_scale(), w.op.values, w.op.scale, y_cpu);
    expect_fp8_gemm_match("replay, seed " + std::to_string(seed), y_cpu, yd.to_host(),
                          abs_sums(x.real, w.real, T, N), DType::bf16);
  }
  cudaGraphExecDestroy(exec);
  cudaGraphDestroy(graph);
  cudaStreamDestroy(stream);
}

// 32 tokens run the skinny kernel (split K, then the reduction: two kernels in the graph), 128
// cuBLASLt's.
INSTANTIATE_TEST_SUITE_P(Tokens, Fp8LinearGraph, ::testing::Values(int64_t{32}, int64_t{128}),
                         [](const auto& info) { return "T" + std::to_string(info.param); });

// CUDA-only FP8 rules: dsv4::Error naming the argument, nothing written.
TEST(Fp8LinearCuda, RejectedAndNothingWritten) {
  DSV4_SKIP_WITHOUT_GPU();
  const int64_t T = 4, N = 256, K = 256;
  const Fp8Activation x = make_activation(T, K, 1);
  const Fp8Weight w = make_weight(0, N, K, 2);
  const Operand wb = make_operand(Enc::bf16, 0, N, K, 1, 1, 3);
  HostTensor x_bf16 = random_tensor(DType::bf16, {T, K}, 4);
  HostTensor ue8m0_scale = poisoned(DType::ue8m0, {N / 128, K / 128});
  const DeviceTensor xd = DeviceTensor::from_host(x.codes), xsd = DeviceTensor::from_host(x.scale_t);
  const DeviceTensor wd = DeviceTensor::from_host(w.op.values), wsd = DeviceTensor::from_host(w.cuda_scale);
  const DeviceTensor unpadded = DeviceTensor::from_host(w.op.scale);  // rows 2 apart, not 4
  const DeviceTensor wbd = DeviceTensor::from_host(wb.values), xbd = DeviceTensor::from_host(x_bf16);
  const DeviceTensor wue = DeviceTensor::from_host(ue8m0_scale);
  HostTensor row_major_scale(DType::fp32, {T, K / 128});
  const DeviceTensor xs_rows = DeviceTensor::from_host(row_major_scale);
  const TensorView ws = scale_window(wsd, K / 128), xs = transposed(xsd.view());
  DeviceTensor y = poisoned_device(DType::bf16, {T, N});
  expect_error([&] { dsv4::linear(xbd, {}, wd, ws, y); }, {"linear", "w.dtype", "fp8_e4m3", "quantize_act_fp8"});
  expect_error([&] { dsv4::linear(xd, xs, wbd, {}, y); }, {"linear", "x.dtype", "same dtype"});
  expect_error([&] { dsv4::linear(xd, xs, wd, wue, y); }, {"linear", "w_scale.dtype", "fp32", "cuda_weight_scale"});
  expect_error([&] { dsv4::linear(xd, xs_rows, wd, ws, y); }, {"linear", "x_scale", "strides {1, 4}"});
  expect_error([&] { dsv4::linear(xd, xs, wd, unpadded, y); }, {"linear", "w_scale", "4 apart"});
  EXPECT_EQ(bytes_of(finish(y)), std::vector<uint8_t>(static_cast<size_t>(T * N * 2), 0xFF));
  // Three rows: cuBLASLt's activation scales need rows 16-byte aligned (multiples of 4 rows).
  const Fp8Activation x3 = make_activation(3, K, 5);
  const DeviceTensor x3d = DeviceTensor::from_host(x3.codes), x3sd = DeviceTensor::from_host(x3.scale_t);
  DeviceTensor y3 = poisoned_device(DType::bf16, {3, N});
  expect_error([&] { dsv4::linear(x3d, transposed(x3sd.view()), wd, ws, y3); },
               {"linear", "x.shape[0]", "multiple of 4"});
  EXPECT_EQ(bytes_of(finish(y3)), std::vector<uint8_t>(static_cast<size_t>(3 * N * 2), 0xFF));
}

// ---- grouped_wo_a ------------------------------------------------------------------------------
struct Fp8GroupedCase {
  int64_t T, G, L, Dg;
  DType z;
};
class Fp8GroupedWoACpuVsCuda : public ::testing::TestWithParam<Fp8GroupedCase> {};

TEST_P(Fp8GroupedWoACpuVsCuda, SameResults) {
  DSV4_SKIP_WITHOUT_GPU();
  const auto [T, G, L, Dg, z_dt] = GetParam();
  const Fp8Activation o = make_activation(T, G * Dg, 30 + T + Dg);
  const Fp8Weight w = make_weight(G, L, Dg, 40 + L);
  HostTensor z_cpu = poisoned(z_dt, {T, G * L});
  dsv4::grouped_wo_a(o.codes, o.host_scale(), w.op.values, w.op.scale, z_cpu);

  const DeviceTensor od = DeviceTensor::from_host(o.codes), osd = DeviceTensor::from_host(o.scale_t);
  const DeviceTensor wd = DeviceTensor::from_host(w.op.values), wsd = DeviceTensor::from_host(w.cuda_scale);
  const DeviceTensor work(DType::uint8, {dsv4::kGemmWorkspaceBytes});
  DeviceTensor zd = poisoned_device(z_dt, {T, G * L});
  dsv4::grouped_wo_a(od, transposed(osd.view()), wd, scale_window(wsd, Dg / 128), zd, work, nullptr);
  const HostTensor z_gpu = finish(zd);

  // Σ|o w| per output, group by group.
  HostTensor sums(DType::fp32, {T, G * L});
  for (int64_t g = 0; g < G; ++g) {
    HostTensor og(DType::fp32, {T, Dg});
    for (int64_t t = 0; t < T; ++t)
      for (int64_t k = 0; k < Dg; ++k) og.data<float>()[t * Dg + k] = o.real.data<float>()[t * G * Dg + g * Dg + k];
    const TensorView wg(w.real.data<float>() + g * L * Dg, DType::fp32, {L, Dg});
    const HostTensor s = abs_sums(og, wg, T, L);
    for (int64_t t = 0; t < T; ++t)
      for (int64_t l = 0; l < L; ++l) sums.data<float>()[t * G * L + g * L + l] = s.data<float>()[t * L + l];
  }
  expect_fp8_gemm_match("grouped_wo_a fp8", z_cpu, z_gpu, sums, z_dt);
}

// The V4-Flash shape (8 groups of 1024 × 4096) at decode and prefill sizes, a tiny-config shape
// (L 64 < 128: one partial scale block per group), an odd T, uneven K splits of the skinny kernel
// (7 K blocks, L 192), and T = 0.
INSTANTIATE_TEST_SUITE_P(Grid, Fp8GroupedWoACpuVsCuda,
                         ::testing::Values(Fp8GroupedCase{4, 8, 1024, 4096, DType::bf16},
                                           Fp8GroupedCase{128, 8, 1024, 4096, DType::bf16},
                                           Fp8GroupedCase{256, 8, 1024, 4096, DType::fp32},
                                           Fp8GroupedCase{2048, 8, 1024, 4096, DType::bf16},
                                           Fp8GroupedCase{8, 4, 64, 2048, DType::bf16},
                                           Fp8GroupedCase{68, 4, 256, 512, DType::fp32},
                                           Fp8GroupedCase{12, 3, 192, 896, DType::bf16},
                                           Fp8GroupedCase{0, 8, 128, 512, DType::bf16}),
                         [](const auto& info) {
                           const Fp8GroupedCase& c = info.param;
                           std::ostringstream name;
                           name << "T" << c.T << "_G" << c.G << "_L" << c.L << "_Dg" << c.Dg << "_z"
                                << dsv4::dtype_name(c.z);
                           return name.str();
                         });

}  // namespace

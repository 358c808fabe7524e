// The FP8 projections on CUDA (block-scaled GEMMs: x 1 × 128, w 128 × 128 fp32 scales in
// cuBLASLt's layouts) against the CPU reference GEMM on the same FP8 operands, through the public
// linear / grouped_wo_a: decode sizes (T 1 … 256), prefill sizes, N / K multiples of 128 and the
// real V4-Flash projections; outputs poisoned on both sides, every element compared. Decode sizes
// with few output tiles run the skinny kernel (skinny_gemm.h: T ≤ 32, N a multiple of 64,
// K split over CTAs when a workspace is given), the others cuBLASLt; both accumulate each
// 128-deep slice in one FP8 wgmma chain, so one tolerance covers both. Fp8GemmOnPathCpuVsCuda runs
// both kernels at the same decode sizes (rt::GemmPath forces one): the skinny kernel's 64- and
// 128-token tiles, which the automatic choice does not reach yet, and cuBLASLt below 32 tokens.
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

#include "cuda/fp8_gemm_test_util.h"
#include "cuda/gpu_test_util.h"
#include "dsv4/device_tensor.h"
#include "dsv4/ops.h"
#include "dsv4/weights.h"
#include "runtime/gemm_path.h"

namespace {
using namespace fp8_gemm_test;

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
  const HostTensor y_gpu = synced_to_host(yd);
  const HostTensor sums = abs_sums(x.real, w.real, c.T, c.N);
  expect_fp8_gemm_match("linear fp8", y_cpu, y_gpu, sums, c.y);

  // With a workspace (split-K allowed): the same tolerance; and repeatable, bit for bit.
  DeviceTensor yw = poisoned_device(c.y, {c.T, c.N}), yw2 = poisoned_device(c.y, {c.T, c.N});
  dsv4::linear(xd, transposed(xsd.view()), wd, scale_window(wsd, w.op.scale.shape()[1]), yw, work, nullptr);
  dsv4::linear(xd, transposed(xsd.view()), wd, scale_window(wsd, w.op.scale.shape()[1]), yw2, work, nullptr);
  const HostTensor y_ws = synced_to_host(yw);
  expect_fp8_gemm_match("linear fp8 with workspace", y_cpu, y_ws, sums, c.y);
  EXPECT_EQ(bytes_of(synced_to_host(yw2)), bytes_of(y_ws)) << "not deterministic";
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
    expect_fp8_gemm_match("seed " + std::to_string(seed), y_cpu, synced_to_host(yd), abs_sums(x.real, w.real, T, N),
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
  EXPECT_EQ(bytes_of(synced_to_host(y)), std::vector<uint8_t>(static_cast<size_t>(T * N * 2), 0xFF));
  // Three rows: cuBLASLt's activation scales need rows 16-byte aligned (multiples of 4 rows).
  const Fp8Activation x3 = make_activation(3, K, 5);
  const DeviceTensor x3d = DeviceTensor::from_host(x3.codes), x3sd = DeviceTensor::from_host(x3.scale_t);
  DeviceTensor y3 = poisoned_device(DType::bf16, {3, N});
  expect_error([&] { dsv4::linear(x3d, transposed(x3sd.view()), wd, ws, y3); },
               {"linear", "x.shape[0]", "multiple of 4"});
  EXPECT_EQ(bytes_of(synced_to_host(y3)), std::vector<uint8_t>(static_cast<size_t>(3 * N * 2), 0xFF));
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
  const HostTensor z_gpu = synced_to_host(zd);

  expect_fp8_gemm_match("grouped_wo_a fp8", z_cpu, z_gpu, grouped_abs_sums(o, w, T, G, L, Dg), z_dt);
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

// ---- both kernels at the same sizes (src/runtime/gemm_path.h) -----------------------------------
struct Fp8PathCase {
  const char* name;
  int64_t G;  // 0: linear; else grouped_wo_a with G groups of N × K
  int64_t N, K, T;
  dsv4::rt::GemmPath path;
  DType y;
};
class Fp8GemmOnPathCpuVsCuda : public ::testing::TestWithParam<Fp8PathCase> {};

// Every element against the CPU op, and the skinny kernel's result repeatable bit for bit (its
// split-K reduction adds in split order).
TEST_P(Fp8GemmOnPathCpuVsCuda, SameResults) {
  DSV4_SKIP_WITHOUT_GPU();
  const Fp8PathCase c = GetParam();
  const int64_t G = std::max<int64_t>(c.G, 1);
  const Fp8Activation x = make_activation(c.T, G * c.K, 50 + c.T + c.K);
  const Fp8Weight w = make_weight(c.G, c.N, c.K, 60 + c.N + c.K);
  HostTensor y_cpu = poisoned(c.y, {c.T, G * c.N});
  if (c.G > 0)
    dsv4::grouped_wo_a(x.codes, x.host_scale(), w.op.values, w.op.scale, y_cpu);
  else
    dsv4::linear(x.codes, x.host_scale(), w.op.values, w.op.scale, y_cpu);

  const DeviceTensor xd = DeviceTensor::from_host(x.codes), xsd = DeviceTensor::from_host(x.scale_t);
  const DeviceTensor wd = DeviceTensor::from_host(w.op.values), wsd = DeviceTensor::from_host(w.cuda_scale);
  const DeviceTensor work(DType::uint8, {dsv4::kGemmWorkspaceBytes});
  const dsv4::rt::GemmChoice choice{c.path};
  auto run = [&](const DeviceTensor& y) {
    const TensorView ws = scale_window(wsd, c.K / 128);
    if (c.G > 0)
      dsv4::rt::grouped_wo_a_on_path(choice, xd, transposed(xsd.view()), wd, ws, y, work, nullptr);
    else
      dsv4::rt::linear_on_path(choice, xd, transposed(xsd.view()), wd, ws, y, work, nullptr);
  };
  DeviceTensor yd = poisoned_device(c.y, {c.T, G * c.N}), yd2 = poisoned_device(c.y, {c.T, G * c.N});
  run(yd);
  run(yd2);
  const HostTensor y_gpu = synced_to_host(yd);
  const HostTensor sums = c.G > 0 ? grouped_abs_sums(x, w, c.T, G, c.N, c.K) : abs_sums(x.real, w.real, c.T, c.N);
  expect_fp8_gemm_match(std::string(dsv4::rt::gemm_path_name(c.path)), y_cpu, y_gpu, sums, c.y);
  if (c.path == dsv4::rt::GemmPath::skinny) EXPECT_EQ(bytes_of(synced_to_host(yd2)), bytes_of(y_gpu)) << "not deterministic";
}

// T 36 and 100: a 64- and a 128-token tile with padded tokens; 64 and 128 full; 256 two 128-token
// tiles. V4-Flash's wq_a and grouped wo_a (8 × 1024 × 4096), and small shapes with an odd number of
// 64-column tiles (N 320, L 192) and K blocks (14, 7) that the split rule leaves uneven.
std::vector<Fp8PathCase> fp8_path_grid() {
  std::vector<Fp8PathCase> grid;
  const struct { const char* name; int64_t G, N, K; std::vector<int64_t> tokens; DType y; } shapes[] = {
      {"wq_a", 0, 1024, 4096, {64, 128, 256}, DType::bf16},
      {"wo_a", 8, 1024, 4096, {64, 128, 256}, DType::bf16},
      {"linear", 0, 320, 1792, {36, 64, 100, 128, 256}, DType::fp32},
      {"grouped", 3, 192, 896, {36, 64, 100, 128, 256}, DType::bf16},
  };
  for (const auto& s : shapes)
    for (int64_t T : s.tokens)
      for (auto path : {dsv4::rt::GemmPath::skinny, dsv4::rt::GemmPath::cublaslt})
        grid.push_back({s.name, s.G, s.N, s.K, T, path, s.y});
  // cuBLASLt below the automatic limit, where the skinny kernel runs by default.
  grid.push_back({"wq_a", 0, 1024, 4096, 16, dsv4::rt::GemmPath::cublaslt, DType::bf16});
  grid.push_back({"wo_a", 8, 1024, 4096, 4, dsv4::rt::GemmPath::cublaslt, DType::bf16});
  return grid;
}

INSTANTIATE_TEST_SUITE_P(Grid, Fp8GemmOnPathCpuVsCuda, ::testing::ValuesIn(fp8_path_grid()),
                         [](const auto& info) {
                           const Fp8PathCase& c = info.param;
                           std::ostringstream name;
                           name << c.name << "_G" << c.G << "_N" << c.N << "_K" << c.K << "_T" << c.T << "_"
                                << dsv4::rt::gemm_path_name(c.path);
                           return name.str();
                         });

}  // namespace

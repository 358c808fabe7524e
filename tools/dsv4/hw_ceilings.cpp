#include "hw_ceilings.h"

#include <chrono>
#include <cstring>
#include <functional>
#include <random>
#include <vector>

#include "dsv4/device_tensor.h"
#include "dsv4/ops.h"
#include "dsv4/status.h"
#include "dsv4/weights.h"
#include "layer_op_timer.h"

#if defined(DSV4_WITH_CUDA)
#include <cublasLt.h>
#include <cuda_runtime.h>

#include "cuda/common/check.h"
#include "cuda/common/random_fill.h"
#include "cuda/gemm/cublaslt_handle.h"
#endif

namespace dsv4::bench {

namespace {

[[maybe_unused]] std::string gemm_how(const char* dtypes, int n, int reps) {  // CUDA builds only
  return detail::concat("cuBLASLt ", n, "x", n, "x", n, " ", dtypes, " (TN, fp32 accumulate), median of ", reps);
}

}  // namespace

#if defined(DSV4_WITH_CUDA)
namespace {

constexpr const char* kWhere = "bench layer: ceilings";

void check(cudaError_t e, const char* what) { cuda::check_cuda(e, kWhere, what); }

// Median µs of `reps` CUDA-event-timed calls of `launch` after 3 warm-ups.
double time_us(cudaStream_t stream, int reps, const std::function<void()>& launch) {
  for (int i = 0; i < 3; ++i) launch();
  std::vector<cudaEvent_t> ev(2 * static_cast<size_t>(reps));
  for (auto& e : ev) check(cudaEventCreate(&e), "cudaEventCreate");
  for (int i = 0; i < reps; ++i) {
    check(cudaEventRecord(ev[2 * i], stream), "cudaEventRecord");
    launch();
    check(cudaEventRecord(ev[2 * i + 1], stream), "cudaEventRecord");
  }
  check(cudaStreamSynchronize(stream), "timed runs");
  std::vector<double> us(reps);
  for (int i = 0; i < reps; ++i) {
    float ms = 0;
    check(cudaEventElapsedTime(&ms, ev[2 * i], ev[2 * i + 1]), "cudaEventElapsedTime");
    us[i] = 1000.0 * ms;
  }
  for (auto& e : ev) cudaEventDestroy(e);
  return median(us);
}

// D [n, n] bf16 = B [n, n] · Aᵀ with A, B of `ab` (bf16 or fp8 e4m3), as the layer's GEMMs are
// laid out (row-major x · wᵀ: cuBLASLt's "TN"). Returns TFLOP/s.
double gemm_tflops(cudaStream_t stream, const TensorView& a, const TensorView& b, const TensorView& d,
                   int n, int reps) {
  const cudaDataType_t ab = a.dtype == DType::fp8_e4m3 ? CUDA_R_8F_E4M3 : CUDA_R_16BF;
  cublasLtMatmulDesc_t desc = nullptr;
  cublasLtMatrixLayout_t la = nullptr, lb = nullptr, ld = nullptr;
  cublasLtMatmulPreference_t pref = nullptr;
  cuda::check_cublas(cublasLtMatmulDescCreate(&desc, CUBLAS_COMPUTE_32F, CUDA_R_32F), kWhere, "MatmulDescCreate");
  const cublasOperation_t ta = CUBLAS_OP_T, tb = CUBLAS_OP_N;
  cuda::check_cublas(cublasLtMatmulDescSetAttribute(desc, CUBLASLT_MATMUL_DESC_TRANSA, &ta, sizeof ta), kWhere, "TRANSA");
  cuda::check_cublas(cublasLtMatmulDescSetAttribute(desc, CUBLASLT_MATMUL_DESC_TRANSB, &tb, sizeof tb), kWhere, "TRANSB");
  cuda::check_cublas(cublasLtMatrixLayoutCreate(&la, ab, n, n, n), kWhere, "layout A");
  cuda::check_cublas(cublasLtMatrixLayoutCreate(&lb, ab, n, n, n), kWhere, "layout B");
  cuda::check_cublas(cublasLtMatrixLayoutCreate(&ld, CUDA_R_16BF, n, n, n), kWhere, "layout D");
  cuda::check_cublas(cublasLtMatmulPreferenceCreate(&pref), kWhere, "PreferenceCreate");
  const DeviceTensor workspace(DType::uint8, {int64_t{32} << 20});
  const uint64_t ws_bytes = workspace.nbytes();
  cuda::check_cublas(cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES,
                                                          &ws_bytes, sizeof ws_bytes),
                     kWhere, "workspace preference");
  cublasLtMatmulHeuristicResult_t best{};
  int found = 0;
  const cublasLtHandle_t handle = cuda::cublaslt_handle();
  const cublasStatus_t st =
      cublasLtMatmulAlgoGetHeuristic(handle, desc, la, lb, ld, ld, pref, 1, &best, &found);
  double tflops = 0;
  if (st == CUBLAS_STATUS_SUCCESS && found > 0) {
    const float alpha = 1.0f, beta = 0.0f;
    const double us = time_us(stream, reps, [&] {
      cuda::check_cublas(cublasLtMatmul(handle, desc, &alpha, a.data, la, b.data, lb, &beta, d.data, ld,
                                        d.data, ld, &best.algo, workspace.view().data, ws_bytes, stream),
                         kWhere, "cublasLtMatmul");
    });
    tflops = 2.0 * n * static_cast<double>(n) * n / (us * 1e-6) / 1e12;
  }
  cublasLtMatmulPreferenceDestroy(pref);
  cublasLtMatrixLayoutDestroy(ld);
  cublasLtMatrixLayoutDestroy(lb);
  cublasLtMatrixLayoutDestroy(la);
  cublasLtMatmulDescDestroy(desc);
  if (found < 1) fail(kWhere, ": cuBLASLt has no ", dtype_name(a.dtype), " GEMM of ", n, "^3");
  return tflops;
}

}  // namespace

MeasuredCeilings measure_cuda_ceilings(int n, int reps) {
  if (!cuda_available()) fail(kWhere, ": no CUDA device is visible");
  cudaStream_t stream = nullptr;
  check(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking), "cudaStreamCreate");
  MeasuredCeilings out;
  try {
    const int64_t N = n;
    const DeviceTensor a(DType::bf16, {N, N}), b(DType::bf16, {N, N}), d(DType::bf16, {N, N});
    cuda::fill_random_bf16(a.view().data, a.numel(), 11, -1.0f, 1.0f, stream);
    cuda::fill_random_bf16(b.view().data, b.numel(), 12, -1.0f, 1.0f, stream);
    out.value.bf16_tflops = gemm_tflops(stream, a, b, d, n, reps);
    out.bf16_how = gemm_how("bf16 -> bf16", n, reps);

    // FP8 operands: the bf16 data quantized as the layer quantizes activations (real e4m3 codes).
    const DeviceTensor a8(DType::fp8_e4m3, {N, N}), b8(DType::fp8_e4m3, {N, N});
    const DeviceTensor scale(DType::fp32, {N, N / 128});
    quantize_act_fp8(a, 128, a8, scale, stream);
    quantize_act_fp8(b, 128, b8, scale, stream);
    out.value.fp8_tflops = gemm_tflops(stream, a8, b8, d, n, reps);
    out.fp8_how = gemm_how("fp8 e4m3 -> bf16", n, reps);

    const int64_t bytes = int64_t{1} << 30;
    const DeviceTensor src(DType::bf16, {bytes / 2}), dst(DType::bf16, {bytes / 2});
    cuda::fill_random_bf16(src.view().data, src.numel(), 13, -1.0f, 1.0f, stream);
    const double us = time_us(stream, reps, [&] {
      check(cudaMemcpyAsync(dst.view().data, src.view().data, bytes, cudaMemcpyDeviceToDevice, stream),
            "cudaMemcpyAsync");
    });
    out.value.copy_gbps = 2.0 * static_cast<double>(bytes) / (us * 1e-6) / 1e9;
    out.copy_how = detail::concat("1 GiB device-to-device cudaMemcpyAsync, read + write, median of ", reps);
    check(cudaStreamSynchronize(stream), "cudaStreamSynchronize");
  } catch (...) {
    cudaStreamDestroy(stream);
    throw;
  }
  cudaStreamDestroy(stream);
  return out;
}
#else
MeasuredCeilings measure_cuda_ceilings(int, int) {
  fail("bench layer: ceilings: this build has no CUDA backend");
}
#endif

MeasuredCeilings measure_cpu_ceilings() {
  using Clock = std::chrono::steady_clock;
  constexpr int kReps = 5;
  auto median_us = [](const std::function<void()>& f) {
    f();
    std::vector<double> us;
    for (int i = 0; i < kReps; ++i) {
      const auto t0 = Clock::now();
      f();
      us.push_back(std::chrono::duration<double, std::micro>(Clock::now() - t0).count());
    }
    return median(us);
  };
  constexpr int64_t T = 64, K = 512, N = 512;
  HostTensor x(DType::bf16, {T, K}), w(DType::fp32, {N, K}), y(DType::fp32, {T, N});
  std::mt19937 rng(7);
  std::uniform_real_distribution<float> u(-1.0f, 1.0f);
  for (int64_t i = 0; i < x.numel(); ++i) x.set(i, u(rng));
  for (int64_t i = 0; i < w.numel(); ++i) w.set(i, u(rng));
  const HostTensor w_bf16 = HostTensor::copy_of(w, DType::bf16);
  const Weight w_fp8 = quantize_weight_fp8(w);
  const double flop = 2.0 * T * K * N;
  MeasuredCeilings out;
  out.value.bf16_tflops = flop / median_us([&] { linear(x, {}, w_bf16, {}, y); }) / 1e6;
  out.value.fp8_tflops = flop / median_us([&] { linear(x, {}, w_fp8.value, w_fp8.scale, y); }) / 1e6;
  const size_t bytes = size_t{64} << 20;
  std::vector<uint8_t> src(bytes, 1), dst(bytes);
  out.value.copy_gbps = 2.0 * static_cast<double>(bytes) /
                        median_us([&] { std::memcpy(dst.data(), src.data(), bytes); }) / 1e3;
  const std::string shape = detail::concat(T, "x", K, "x", N);
  out.bf16_how = "CPU reference dsv4::linear " + shape + ", bf16 weight, median of 5";
  out.fp8_how = "CPU reference dsv4::linear " + shape + ", FP8 weight, median of 5";
  out.copy_how = "memcpy of 64 MiB, read + write, median of 5";
  return out;
}

}  // namespace dsv4::bench

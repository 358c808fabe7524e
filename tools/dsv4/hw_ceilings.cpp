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
#include "runtime/ceiling_gemm.h"
#include "runtime/device_runtime.h"
#include "runtime/random_fill.h"

namespace dsv4::bench {

namespace {

constexpr const char* kWhere = "bench layer: ceilings";

std::string gemm_how(const char* dtypes, int n, int reps) {
  return detail::concat("cuBLASLt ", n, "x", n, "x", n, " ", dtypes, " (TN, fp32 accumulate), median of ", reps);
}

// Median µs of `reps` CUDA-event-timed calls of `launch` (which enqueues on `stream`) after 3
// warm-ups. Every event is created (first recorded) before the timed calls.
double time_us(Stream stream, int reps, const std::function<void()>& launch) {
  std::vector<rt::Event> ev;
  ev.reserve(2 * static_cast<size_t>(reps));
  for (int i = 0; i < 2 * reps; ++i) ev.emplace_back(/*timing=*/true).record(stream);
  for (int i = 0; i < 3; ++i) launch();
  for (int i = 0; i < reps; ++i) {
    ev[2 * i].record(stream);
    launch();
    ev[2 * i + 1].record(stream);
  }
  rt::synchronize_stream(stream, kWhere);
  std::vector<double> us(reps);
  for (int i = 0; i < reps; ++i) us[i] = 1000.0 * rt::Event::elapsed_ms(ev[2 * i], ev[2 * i + 1]);
  return median(us);
}

// TFLOP/s of d [n, n] bf16 = b · aᵀ with a, b of one dtype (bf16 or fp8 e4m3), as the layer's
// GEMMs are laid out (row-major x · wᵀ: cuBLASLt's "TN"), with a 32 MiB workspace.
double gemm_tflops(Stream stream, const TensorView& a, const TensorView& b, const TensorView& d, int n, int reps) {
  const DeviceTensor workspace(DType::uint8, {int64_t{32} << 20});
  const rt::CeilingGemm gemm(kWhere, a, b, d, workspace);
  const double us = time_us(stream, reps, [&] { gemm.run(stream); });
  return 2.0 * n * static_cast<double>(n) * n / (us * 1e-6) / 1e12;
}

}  // namespace

MeasuredCeilings measure_cuda_ceilings(int n, int reps) {
  if (!rt::built()) fail(kWhere, ": this build has no CUDA backend");
  if (!rt::device_available()) fail(kWhere, ": no CUDA device is visible");
  const rt::OwnedStream owned_stream;
  const Stream stream = owned_stream.get();
  MeasuredCeilings out;
  const int64_t N = n;
  const DeviceTensor a(DType::bf16, {N, N}), b(DType::bf16, {N, N}), d(DType::bf16, {N, N});
  rt::fill_random_bf16(a.view().data, a.numel(), 11, -1.0f, 1.0f, stream);
  rt::fill_random_bf16(b.view().data, b.numel(), 12, -1.0f, 1.0f, stream);
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
  rt::fill_random_bf16(src.view().data, src.numel(), 13, -1.0f, 1.0f, stream);
  const double us = time_us(stream, reps, [&] {
    rt::copy_device_to_device_async(dst.view().data, src.view().data, bytes, stream);
  });
  out.value.copy_gbps = 2.0 * static_cast<double>(bytes) / (us * 1e-6) / 1e9;
  out.copy_how = detail::concat("1 GiB device-to-device cudaMemcpyAsync, read + write, median of ", reps);
  rt::synchronize_stream(stream, kWhere);
  return out;
}

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

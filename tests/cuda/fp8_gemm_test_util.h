// Operands and checks of the FP8 GEMM tests on CUDA (test_fp8_gemm_cpu_vs_cuda.cpp,
// test_gemm_paths_cuda.cpp): block-scaled activations and weights in both the CPU op's and the
// CUDA layouts, Σ|x w| per output (the tolerance's scale), and the CUDA-vs-CPU comparison.
#pragma once

#include <cuda_runtime.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <string>
#include <utility>
#include <vector>

#include "cpu/dense_operands.h"
#include "cuda/gpu_test_util.h"
#include "dsv4/device_tensor.h"
#include "dsv4/ops.h"
#include "dsv4/weights.h"

namespace fp8_gemm_test {
using namespace dense_test;
using dsv4::DeviceTensor;
using dsv4::test::poisoned_device;
using dsv4::test::synced_to_host;

// The 2-d view with its dims swapped (the CUDA activation-scale layout is a transposed buffer).
inline TensorView transposed(TensorView v) {
  std::swap(v.shape[0], v.shape[1]);
  std::swap(v.strides[0], v.strides[1]);
  return v;
}
// One bf16 ulp at the magnitude of v.
inline double bf16_ulp(double v) { return v == 0.0 ? std::ldexp(1.0, -133) : std::ldexp(1.0, std::ilogb(v) - 7); }

// An FP8 activation [T, K]: random bf16 quantized by quantize_act_fp8 (fp32 scales) on the host,
// its scales both as the CUDA layout's contiguous [K/128, T] buffer and row-major; `real` the
// dequantized values (fp32, for Σ|x w|).
struct Fp8Activation {
  HostTensor codes, scale_t /* [K/128, T] */, real;
  TensorView host_scale() const { return transposed(scale_t.view()); }
};
inline Fp8Activation make_activation(int64_t T, int64_t K, uint64_t seed) {
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
inline Fp8Weight make_weight(int64_t G, int64_t N, int64_t K, uint64_t seed) {
  Fp8Weight w{make_operand(Enc::fp8_fp32, G, N, K, 128, 128, seed), {}, {}};
  w.cuda_scale = dsv4::cuda_weight_scale(dsv4::Weight{w.op.values, w.op.scale});
  w.real = dsv4::dequantize_weight(dsv4::Weight{w.op.values, w.op.scale});
  return w;
}
// The device copy of a padded CUDA scale buffer, viewed with the grid's columns.
inline TensorView scale_window(const DeviceTensor& d, int64_t cols) {
  TensorView v = d.view();
  v.shape[v.ndim - 1] = cols;
  return v;
}
// Σ_k |x_k w_k| per output (the GEMM's error scale), through the CPU GEMM on |x| and |w|.
inline HostTensor abs_sums(const HostTensor& x_real, const TensorView& w_real, int64_t T, int64_t N) {
  HostTensor xa(DType::fp32, x_real.shape()), wa(DType::fp32, {w_real.shape[0], w_real.shape[1]});
  for (int64_t i = 0; i < xa.numel(); ++i) xa.data<float>()[i] = std::fabs(x_real.data<float>()[i]);
  for (int64_t i = 0; i < wa.numel(); ++i) wa.data<float>()[i] = std::fabs(static_cast<const float*>(w_real.data)[i]);
  HostTensor s(DType::fp32, {T, N});
  dsv4::linear(xa, {}, wa, {}, s);
  return s;
}
// CUDA against the CPU op at the FP8 GEMM tolerance (test_fp8_gemm_cpu_vs_cuda.cpp says why):
// |y_cuda − y_cpu| ≤ 2e-3 · Σ_k |x_k w_k| (+ one bf16 ulp for a bf16 y).
inline void expect_fp8_gemm_match(const std::string& what, const HostTensor& cpu, const HostTensor& gpu,
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

// Σ|o w| per output of grouped_wo_a (z [T, G·L]), group by group.
inline HostTensor grouped_abs_sums(const Fp8Activation& o, const Fp8Weight& w, int64_t T, int64_t G, int64_t L,
                                   int64_t Dg) {
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
  return sums;
}

}  // namespace fp8_gemm_test

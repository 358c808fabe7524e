// Random GEMM operands for the projection tests (linear, grouped_wo_a, output path): values in
// every supported encoding together with the real (dequantized) matrix in float64, computed
// here from the format definitions.
#pragma once

#include <cmath>
#include <random>
#include <string>
#include <vector>

#include "dense_test_support.h"

namespace dense_test {

// How an operand is stored: plain bf16/fp32, or fp8 e4m3 with ue8m0 / fp32 block scales.
enum class Enc { bf16, fp32, fp8_ue8m0, fp8_fp32 };
inline std::string enc_name(Enc e) {
  switch (e) {
    case Enc::bf16: return "bf16";
    case Enc::fp32: return "fp32";
    case Enc::fp8_ue8m0: return "fp8_ue8m0";
    case Enc::fp8_fp32: return "fp8_fp32";
  }
  return "?";
}
inline bool is_fp8(Enc e) { return e == Enc::fp8_ue8m0 || e == Enc::fp8_fp32; }

struct Operand {
  HostTensor values;         // [rows, cols] (or [G, rows, cols])
  HostTensor scale;          // block scales, empty for bf16/fp32
  std::vector<double> real;  // dequantized values, row-major like `values`
};

// A [batch ×] rows × cols operand with block_rows × block_cols scale blocks (ceil-divided).
// fp8 bytes are random non-zero, non-NaN codes; ue8m0 scales random powers of two
// (2^-12 .. 2^-2); fp32 scales arbitrary values in [1e-3, 1e-2).
inline Operand make_operand(Enc enc, int64_t batch, int64_t rows, int64_t cols, int64_t block_rows,
                            int64_t block_cols, uint64_t seed) {
  Operand op;
  std::vector<int64_t> dims = batch > 0 ? std::vector<int64_t>{batch, rows, cols}
                                        : std::vector<int64_t>{rows, cols};
  const int64_t nb = std::max<int64_t>(batch, 1);
  if (!is_fp8(enc)) {
    op.values = random_tensor(enc == Enc::bf16 ? DType::bf16 : DType::fp32, dims, seed);
    op.real = to_doubles(op.values);
    return op;
  }
  std::mt19937_64 rng(seed);
  op.values = HostTensor(DType::fp8_e4m3, dims);
  std::uniform_int_distribution<int> code(1, 0x7D);  // skip ±0 and NaN
  std::bernoulli_distribution neg(0.5);
  for (int64_t i = 0; i < op.values.numel(); ++i)
    op.values.data<uint8_t>()[i] = static_cast<uint8_t>(code(rng) | (neg(rng) ? 0x80 : 0));
  const int64_t sr = (rows + block_rows - 1) / block_rows, sc = (cols + block_cols - 1) / block_cols;
  std::vector<int64_t> sdims = batch > 0 ? std::vector<int64_t>{batch, sr, sc}
                                         : std::vector<int64_t>{sr, sc};
  op.scale = HostTensor(enc == Enc::fp8_ue8m0 ? DType::ue8m0 : DType::fp32, sdims);
  std::uniform_int_distribution<int> exp(-12, -2);
  std::uniform_real_distribution<double> arbitrary(1e-3, 1e-2);
  std::vector<double> scale_real(static_cast<size_t>(op.scale.numel()));
  for (int64_t i = 0; i < op.scale.numel(); ++i) {
    if (enc == Enc::fp8_ue8m0) {
      const int k = exp(rng);
      op.scale.data<uint8_t>()[i] = static_cast<uint8_t>(k + 127);
      scale_real[static_cast<size_t>(i)] = std::ldexp(1.0, k);
    } else {
      const float s = static_cast<float>(arbitrary(rng));
      op.scale.data<float>()[i] = s;
      scale_real[static_cast<size_t>(i)] = s;
    }
  }
  op.real.resize(static_cast<size_t>(op.values.numel()));
  for (int64_t b = 0; b < nb; ++b)
    for (int64_t r = 0; r < rows; ++r)
      for (int64_t c = 0; c < cols; ++c) {
        const int64_t i = (b * rows + r) * cols + c;
        op.real[static_cast<size_t>(i)] =
            fp8_value(op.values.data<uint8_t>()[i]) *
            scale_real[static_cast<size_t>((b * sr + r / block_rows) * sc + c / block_cols)];
      }
  return op;
}

// Reference y[t][n] = Σ_k x[t][k] · w[n][k] in float64, and Σ_k |x w| (the scale of the fp32
// accumulation error). x: T × K at x_off with row stride x_ld; w: N × K at w_off.
struct GemmReference {
  std::vector<double> y, abs_sum;
};
inline GemmReference reference_gemm(const std::vector<double>& x, int64_t x_off, int64_t x_ld,
                                    const std::vector<double>& w, int64_t w_off, int64_t T,
                                    int64_t N, int64_t K) {
  GemmReference r{std::vector<double>(static_cast<size_t>(T * N)),
                  std::vector<double>(static_cast<size_t>(T * N))};
  for (int64_t t = 0; t < T; ++t)
    for (int64_t n = 0; n < N; ++n) {
      double s = 0, a = 0;
      const double* xr = x.data() + x_off + t * x_ld;
      const double* wr = w.data() + w_off + n * K;
      for (int64_t k = 0; k < K; ++k) {
        s += xr[k] * wr[k];
        a += std::fabs(xr[k] * wr[k]);
      }
      r.y[static_cast<size_t>(t * N + n)] = s;
      r.abs_sum[static_cast<size_t>(t * N + n)] = a;
    }
  return r;
}

// Tolerance of one GEMM output against float64. fp32 accumulation over K terms in a fixed order
// errs by about sqrt(K)·2^-24·Σ|x w| for random signs (~4e-6 at K = 4096); 1e-5·Σ|x w| bounds it
// with margin. A bf16 output adds one rounding of at most 2^-9 relative; 2^-8 leaves margin.
inline double gemm_tolerance(DType y_dtype, double ref, double abs_sum) {
  return 1e-5 * abs_sum + (y_dtype == DType::bf16 ? std::ldexp(std::fabs(ref), -8) : 0.0) + 1e-30;
}

// Inputs for the FP8 activation quantizer (its CPU test and the CPU-vs-CUDA test): each block of
// x [T, K] gets its own magnitude (2^-20 .. 2^12), some are all-zero or tiny (the 1e-4 floor),
// and some have an amax of exactly 448 · 2^j (the power-of-two boundary of the scale rule).
inline void shape_blocks(HostTensor& x, int64_t T, int64_t K, int block, uint64_t seed) {
  std::mt19937_64 rng(seed);
  std::uniform_int_distribution<int> exp(-20, 12);
  for (int64_t t = 0; t < T; ++t)
    for (int64_t b = 0; b < K / block; ++b) {
      const int64_t base = t * K + b * block;
      const int kind = static_cast<int>((t * 7 + b) % 9);
      for (int i = 0; i < block; ++i) {
        const double v = at(x, base + i);
        if (kind == 0) x.set(base + i, 0.0f);
        else if (kind == 1) x.set(base + i, static_cast<float>(v * 1e-7));
        else x.set(base + i, static_cast<float>(std::ldexp(v, exp(rng))));
      }
      if (kind == 2) x.set(base + (t % block), static_cast<float>(448.0 * std::ldexp(1.0, exp(rng) / 4)));
    }
}

}  // namespace dense_test

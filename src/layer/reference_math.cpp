// Float64 building blocks of the layer references (see reference_math.h).
#include "layer/reference_math.h"

#include <algorithm>
#include <cmath>

#include "dsv4/dtype.h"
#include "dsv4/status.h"

namespace dsv4::reference_math {

Mat to_mat(const HostTensor& t) {
  Mat m;
  m.cols = t.shape().back();
  m.rows = t.numel() / m.cols;
  m.a.resize(static_cast<size_t>(t.numel()));
  for (int64_t i = 0; i < t.numel(); ++i) m.a[i] = t.get(i);
  return m;
}
Mat to_mat(const Weight& w) { return to_mat(dequantize_weight(w)); }
std::vector<double> to_vec(const HostTensor& t) { return to_mat(t).a; }


// Plain dot products in double, blocked so a block of X rows stays in cache while W streams once
// per block; parallel over W rows. Projections of all positions at once: the layer has no
// recurrence through them, and streaming a 268 MB weight matrix once per token would dominate the
// check.
#if defined(__x86_64__) && defined(__GNUC__) && !defined(__clang__)
__attribute__((target_clones("arch=x86-64-v4", "arch=x86-64-v3", "default")))
#endif
void gemm_t(const double* X, int64_t ldx, int64_t rows, const double* W, int64_t ldw, int64_t n_out,
            int64_t K, double* Y, int64_t ldy) {
  constexpr int64_t kRowBlock = 16;
  for (int64_t t0 = 0; t0 < rows; t0 += kRowBlock) {
    const int64_t t1 = std::min(rows, t0 + kRowBlock);
#pragma omp parallel for schedule(static) if (n_out * K > 65536)
    for (int64_t n = 0; n < n_out; ++n) {
      const double* w = W + n * ldw;
      for (int64_t t = t0; t < t1; ++t) {
        const double* xr = X + t * ldx;
        double s = 0;
#pragma omp simd reduction(+ : s)
        for (int64_t k = 0; k < K; ++k) s += w[k] * xr[k];
        Y[t * ldy + n] = s;
      }
    }
  }
}

Mat project(const Mat& X, const Mat& M) {
  DSV4_CHECK(X.cols == M.cols, "reference: projection K mismatch ", X.cols, " vs ", M.cols);
  Mat Y;
  Y.rows = X.rows;
  Y.cols = M.rows;
  Y.a.resize(static_cast<size_t>(Y.rows * Y.cols));
  gemm_t(X.a.data(), X.cols, X.rows, M.a.data(), M.cols, M.rows, M.cols, Y.a.data(), Y.cols);
  return Y;
}

void rmsnorm(double* v, int64_t n, const std::vector<double>* weight, double eps) {
  double ss = 0;
  for (int64_t i = 0; i < n; ++i) ss += v[i] * v[i];
  const double inv = 1.0 / std::sqrt(ss / n + eps);
  for (int64_t i = 0; i < n; ++i) v[i] *= inv * (weight ? (*weight)[i] : 1.0);
}

std::vector<double> frequencies(const RopeConfig& rc) {
  const int R = rc.rope_dims;
  std::vector<double> f(R / 2);
  for (int i = 0; i < R / 2; ++i) f[i] = std::pow(rc.theta, -2.0 * i / R);
  if (rc.yarn && rc.original_seq_len > 0) {
    auto corr = [&](double n) {
      return R * std::log(static_cast<double>(rc.original_seq_len) / (n * 2 * M_PI)) /
             (2 * std::log(rc.theta));
    };
    const double low = std::max(0.0, std::floor(corr(rc.beta_fast)));
    const double high = std::min(static_cast<double>(R - 1), std::ceil(corr(rc.beta_slow)));
    for (int i = 0; i < R / 2; ++i) {
      const double ramp = std::clamp((i - low) / (high == low ? 1e-3 : high - low), 0.0, 1.0);
      f[i] = f[i] / rc.factor * ramp + f[i] * (1 - ramp);
    }
  }
  return f;
}

void rotate(double* v, int64_t n, const std::vector<double>& freqs, double p, double sign) {
  double* r = v + n - 2 * static_cast<int64_t>(freqs.size());
  for (size_t i = 0; i < freqs.size(); ++i) {
    const double c = std::cos(p * freqs[i]), s = sign * std::sin(p * freqs[i]);
    const double a = r[2 * i], b = r[2 * i + 1];
    r[2 * i] = a * c - b * s;
    r[2 * i + 1] = a * s + b * c;
  }
}

// FP8 quantization per block of n values with one power-of-two (UE8M0) scale, dequantized:
// the activation quant before wo_a (n = 128) and the indexer's q / key rows (n = 128).
void fp8_round(double* v, int64_t len, int n) {
  for (int64_t b = 0; b + n <= len; b += n) {
    double amax = 0;
    for (int i = 0; i < n; ++i) amax = std::max(amax, std::fabs(v[b + i]));
    const int k = ue8m0_exponent_for_amax(static_cast<float>(amax));
    for (int i = 0; i < n; ++i)
      v[b + i] = fp8_e4m3_to_float(float_to_fp8_e4m3(static_cast<float>(std::ldexp(v[b + i], -k)))) *
                 std::ldexp(1.0, k);
  }
}

void bf16_round(double* v, int64_t n) {
  for (int64_t i = 0; i < n; ++i) v[i] = round_bf16(static_cast<float>(v[i]));
}

// Sylvester-order Hadamard transform scaled by n^-0.5 (orthonormal).
void hadamard(double* v, int n) {
  for (int h = 1; h < n; h *= 2)
    for (int i = 0; i < n; i += 2 * h)
      for (int j = i; j < i + h; ++j) {
        const double a = v[j], b = v[j + h];
        v[j] = a + b;
        v[j + h] = a - b;
      }
  const double s = 1.0 / std::sqrt(static_cast<double>(n));
  for (int i = 0; i < n; ++i) v[i] *= s;
}

}  // namespace dsv4::reference_math

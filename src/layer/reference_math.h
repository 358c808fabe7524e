// Float64 building blocks of the layer references (reference_layer.cpp for V4,
// sparse_mla/sparse_mla_reference.cpp for V3.2): dense double matrices and projections, RMSNorm,
// docs/spec.md §3 RoPE frequencies and rotation, the FP8 / bf16 roundings the production path
// stores, the Hadamard transform — written from the formulas, sharing no code with the ops they
// judge.
#pragma once

#include <cstdint>
#include <limits>
#include <vector>

#include "dsv4/config.h"
#include "dsv4/tensor.h"
#include "dsv4/weights.h"

namespace dsv4::reference_math {

inline constexpr double kInf = std::numeric_limits<double>::infinity();

// A dense row-major matrix of doubles.
struct Mat {
  int64_t rows = 0, cols = 0;
  std::vector<double> a;
  const double* row(int64_t r) const { return a.data() + r * cols; }
};

Mat to_mat(const HostTensor& t);
Mat to_mat(const Weight& w);
std::vector<double> to_vec(const HostTensor& t);

// Y[t][n] = Σ_k X[t][k] · W[n][k] for t < rows, n < n_out (row strides ldx, ldw, ldy).
void gemm_t(const double* X, int64_t ldx, int64_t rows, const double* W, int64_t ldw, int64_t n_out,
            int64_t K, double* Y, int64_t ldy);
// All rows of X [rows, K] times Mᵀ (M [n, K]) → [rows, n], in double.
Mat project(const Mat& X, const Mat& M);

// v ← v · rsqrt(mean(v²) + eps) · weight (no weight when null).
void rmsnorm(double* v, int64_t n, const std::vector<double>* weight, double eps);

// docs/spec.md §3 frequencies of a RopeConfig.
std::vector<double> frequencies(const RopeConfig& rc);
// GPT-J rotation of the last 2*freqs.size() dims of v[0..n) at position p (sign -1: inverse).
void rotate(double* v, int64_t n, const std::vector<double>& freqs, double p, double sign = 1);

// FP8 quantization per block of n values with one power-of-two (UE8M0) scale, dequantized.
void fp8_round(double* v, int64_t len, int n);
void bf16_round(double* v, int64_t n);

// Sylvester-order Hadamard transform scaled by n^-0.5 (orthonormal).
void hadamard(double* v, int n);

}  // namespace dsv4::reference_math

// RMSNorm math shared by rms_norm, fused_qkv_rms_norm and the per-head q norm of
// qnorm_rope_kv_insert — on the CPU and in their CUDA kernels (DSV4_HD) — so all of them
// normalize bit-identically.
//
// The sum of squares has one fixed, warp-shaped order: lane j of kRmsLanes = 32 accumulates
// x[j]², x[j+32]², … in index order; the 32 partial sums are then added pairwise,
// partial[j] += partial[j + w] for w = 16, 8, 4, 2, 1. That is exactly what a warp's xor
// butterfly (__shfl_xor_sync with offsets 16 … 1) leaves in every lane, since fp32 addition is
// commutative. Every operation is IEEE-rounded (dtype.h ieee_*), so host and device round alike.
#pragma once

#include <cstdint>

#include "dsv4/dtype.h"

namespace dsv4::cpu {

inline constexpr int kRmsLanes = 32;

// One step of a lane's partial sum of squares.
DSV4_HD float rms_accumulate(float partial, float x) { return ieee_add(partial, ieee_mul(x, x)); }

// 1 / sqrt(sum_sq / n + eps).
DSV4_HD float rms_inverse_of_sum(float sum_sq, int64_t n, float eps) {
  return ieee_div(1.0f, ieee_sqrt(ieee_add(ieee_div(sum_sq, static_cast<float>(n)), eps)));
}

// One normalized value: x · inv · weight (weight 1 when the norm has none: the product is exact).
DSV4_HD float rms_apply(float x, float inv, float weight) {
  return ieee_mul(ieee_mul(x, inv), weight);
}

// The sum of squares of x[0..n) in the order described above.
inline float rms_sum_of_squares(const float* x, int64_t n) {
  float partial[kRmsLanes] = {};
  for (int64_t i = 0; i < n; ++i) partial[i % kRmsLanes] = rms_accumulate(partial[i % kRmsLanes], x[i]);
  for (int w = kRmsLanes / 2; w >= 1; w /= 2)
    for (int j = 0; j < w; ++j) partial[j] = ieee_add(partial[j], partial[j + w]);
  return partial[0];
}

// 1 / sqrt(mean(x²) + eps).
inline float rms_inverse(const float* x, int64_t n, float eps) {
  return rms_inverse_of_sum(rms_sum_of_squares(x, n), n, eps);
}

// x[i] ← x[i] · rms_inverse(x) (· weight[i] when weight != nullptr), in place.
inline void rms_normalize(float* x, int64_t n, float eps, const float* weight) {
  const float inv = rms_inverse(x, n, eps);
  for (int64_t i = 0; i < n; ++i) x[i] = rms_apply(x[i], inv, weight != nullptr ? weight[i] : 1.0f);
}

}  // namespace dsv4::cpu

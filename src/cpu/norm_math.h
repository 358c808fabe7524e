// RMSNorm math shared by rms_norm, fused_qkv_rms_norm and the per-head q norm of
// qnorm_rope_kv_insert — on the CPU and in their CUDA kernels (DSV4_HD pieces) — so all of them
// normalize bit-identically.
//
// The sum of squares is accumulated in index order, one element after the other (the order the
// reference has always used: the layer's float64 checks are tuned on its exact results). The CUDA
// kernels keep this order (src/cuda/norm/warp_rms.cuh). Every operation is IEEE-rounded (dtype.h
// ieee_*), so host and device round alike.
#pragma once

#include <cstdint>

#include "dsv4/dtype.h"

namespace dsv4::cpu {

// One step of the sum of squares: partial + x².
DSV4_HD float rms_accumulate(float partial, float x) { return ieee_add(partial, ieee_mul(x, x)); }

// 1 / sqrt(sum_sq / n + eps).
DSV4_HD float rms_inverse_of_sum(float sum_sq, int64_t n, float eps) {
  return ieee_div(1.0f, ieee_sqrt(ieee_add(ieee_div(sum_sq, static_cast<float>(n)), eps)));
}

// One normalized value: x · inv · weight (weight 1 when the norm has none: the product is exact).
DSV4_HD float rms_apply(float x, float inv, float weight) {
  return ieee_mul(ieee_mul(x, inv), weight);
}

// 1 / sqrt(mean(x²) + eps), the sum accumulated in index order (one thread's loop on a device).
DSV4_HD float rms_inverse(const float* x, int64_t n, float eps) {
  float sum_sq = 0.0f;
  for (int64_t i = 0; i < n; ++i) sum_sq = rms_accumulate(sum_sq, x[i]);
  return rms_inverse_of_sum(sum_sq, n, eps);
}

// x[i] ← x[i] · rms_inverse(x) (· weight[i] when weight != nullptr), in place.
inline void rms_normalize(float* x, int64_t n, float eps, const float* weight) {
  const float inv = rms_inverse(x, n, eps);
  for (int64_t i = 0; i < n; ++i) x[i] = rms_apply(x[i], inv, weight != nullptr ? weight[i] : 1.0f);
}

}  // namespace dsv4::cpu

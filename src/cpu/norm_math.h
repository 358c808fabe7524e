// RMSNorm of one fp32 row, shared by rms_norm, fused_qkv_rms_norm and the per-head q norm of
// qnorm_rope_kv_insert so they normalize identically.
#pragma once

#include <cmath>
#include <cstdint>

namespace dsv4::cpu {

// 1 / sqrt(mean(x²) + eps), the mean accumulated in fp32 in index order.
inline float rms_inverse(const float* x, int64_t n, float eps) {
  float sum_sq = 0.0f;
  for (int64_t i = 0; i < n; ++i) sum_sq += x[i] * x[i];
  return 1.0f / std::sqrt(sum_sq / static_cast<float>(n) + eps);
}

// x[i] ← x[i] · rms_inverse(x) (· weight[i] when weight != nullptr), in place.
inline void rms_normalize(float* x, int64_t n, float eps, const float* weight) {
  const float inv = rms_inverse(x, n, eps);
  if (weight != nullptr) {
    for (int64_t i = 0; i < n; ++i) x[i] = x[i] * inv * weight[i];
  } else {
    for (int64_t i = 0; i < n; ++i) x[i] *= inv;
  }
}

}  // namespace dsv4::cpu

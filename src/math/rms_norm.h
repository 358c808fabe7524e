// RMSNorm math shared by rms_norm, fused_qkv_rms_norm, the per-head q norm of
// qnorm_rope_kv_insert and the compressor's entry norm — on the CPU and in their CUDA kernels
// (DSV4_HD pieces) — so all of them normalize bit-identically.
//
// The order of the sum of squares is the one a warp computes at full bandwidth: the row is cut
// into chunks of kRmsChunk = 8 consecutive elements (one 16-byte load of bf16), dealt round-robin
// to kRmsLanes = 32 partial sums (chunk c to partial c mod 32 — lane c mod 32 of the warp); each
// partial adds its elements' squares in index order; the 32 partials are then combined by the
// butterfly p[l] ← p[l] + p[l ^ off] for off = 16, 8, 4, 2, 1 (what __shfl_xor_sync computes, so
// every lane ends with the same total). Every operation is IEEE-rounded (dtype.h ieee_*), so host
// and device round alike.
#pragma once

#include <cstdint>

#include "dsv4/dtype.h"

namespace dsv4::math {

inline constexpr int kRmsChunk = 8;
inline constexpr int kRmsLanes = 32;

// The partial sum element i of a row belongs to.
DSV4_HD int rms_lane_of(int64_t i) { return static_cast<int>((i / kRmsChunk) % kRmsLanes); }

// One step of a partial sum of squares: partial + x².
DSV4_HD float rms_accumulate(float partial, float x) { return ieee_add(partial, ieee_mul(x, x)); }

// The butterfly over the 32 partials (p is overwritten); returns the total.
DSV4_HD float rms_combine_lanes(float* p) {
  for (int off = kRmsLanes / 2; off > 0; off /= 2) {
    float next[kRmsLanes];
    for (int l = 0; l < kRmsLanes; ++l) next[l] = ieee_add(p[l], p[l ^ off]);
    for (int l = 0; l < kRmsLanes; ++l) p[l] = next[l];
  }
  return p[0];
}

// 1 / sqrt(sum_sq / n + eps).
DSV4_HD float rms_inverse_of_sum(float sum_sq, int64_t n, float eps) {
  return ieee_div(1.0f, ieee_sqrt(ieee_add(ieee_div(sum_sq, static_cast<float>(n)), eps)));
}

// One normalized value: x · inv · weight (weight 1 when the norm has none: the product is exact).
DSV4_HD float rms_apply(float x, float inv, float weight) {
  return ieee_mul(ieee_mul(x, inv), weight);
}

// 1 / sqrt(mean(x²) + eps) in the order above (one thread's loop; a warp's kernels split it).
DSV4_HD float rms_inverse(const float* x, int64_t n, float eps) {
  float part[kRmsLanes] = {};
  for (int64_t i = 0; i < n; ++i) {
    const int l = rms_lane_of(i);
    part[l] = rms_accumulate(part[l], x[i]);
  }
  return rms_inverse_of_sum(rms_combine_lanes(part), n, eps);
}

// x[i] ← x[i] · rms_inverse(x) (· weight[i] when weight != nullptr), in place.
inline void rms_normalize(float* x, int64_t n, float eps, const float* weight) {
  const float inv = rms_inverse(x, n, eps);
  for (int64_t i = 0; i < n; ++i) x[i] = rms_apply(x[i], inv, weight != nullptr ? weight[i] : 1.0f);
}

}  // namespace dsv4::math

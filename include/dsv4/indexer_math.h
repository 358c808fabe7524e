// Per-element math of the C4A indexer (docs/spec.md §5): the visible-entry count and the total order of
// top-k as an unsigned key, shared by the CPU reference (src/cpu/indexer.cpp) and the CUDA kernels
// (src/cuda/indexer/) so both select identically from the same scores; and the CPU's fixed
// summation order of a query·key dot product and head term of a score (the CUDA scores run on FP8
// tensor cores instead, within the tolerance include/dsv4/indexer.h states).
//
// Every multiply and add here is rounded on its own (dtype.h ieee_*): nvcc contracts a·b + c into
// one FMA by default (and the project builds kernels with --use_fast_math), which ieee_* never
// are. Host code targets x86-64 without FMA contraction.
#pragma once

#include <cmath>
#include <cstdint>

#include "dsv4/dtype.h"
#include "dsv4/indexer_key_cache.h"

namespace dsv4::indexer_math {

// Entries a query at position p may see: the fully emitted windows, (p+1) div r (0 for p < 0).
// Computed without forming p + 1, which overflows for p = INT64_MAX (positions are caller data
// the CPU checks against this count). With r = 1 that position's count, INT64_MAX + 1, saturates
// at INT64_MAX: no cache holds that many entries, so the checks refuse it all the same.
DSV4_HD int64_t visible_entries(int64_t p, int ratio) {
  if (p < 0) return 0;
  const int64_t whole = p / ratio;
  return p % ratio == ratio - 1 && whole < INT64_MAX ? whole + 1 : whole;
}

// Lanes of the dot product: lane l sums the products of dims l, l+8, l+16, ... in order.
inline constexpr int kDotLanes = 8;

// q·k over the 128 dims of two fp8-decoded vectors (every product of two fp8 values is exact in
// fp32, so only the additions round): 8 lane sums, then the tree (l, l+4), (l, l+2), (0, 1).
// Fixed so that the CPU (which vectorizes the lanes) is deterministic whatever the compiler does.
DSV4_HD float dot128(const float* q, const float* k) {
  float lane[kDotLanes] = {};
#if defined(__CUDA_ARCH__)
#pragma unroll
#endif
  for (int d = 0; d < indexer_keys::kDim; d += kDotLanes) {
#if defined(__CUDA_ARCH__)
#pragma unroll
#endif
    for (int l = 0; l < kDotLanes; ++l) lane[l] = ieee_add(lane[l], ieee_mul(q[d + l], k[d + l]));
  }
  for (int l = 0; l < 4; ++l) lane[l] = ieee_add(lane[l], lane[l + 4]);
  for (int l = 0; l < 2; ++l) lane[l] = ieee_add(lane[l], lane[l + 2]);
  return ieee_add(lane[0], lane[1]);
}

// One head's term of a score: w · ReLU(dot · (q_scale · k_scale)). The scales are powers of two,
// so applying them after the dot is exact. ReLU keeps NaN (as std::max(x, 0.0f) does).
DSV4_HD float head_term(float w, float dot, float q_scale, float k_scale) {
  const float s = ieee_mul(dot, ieee_mul(q_scale, k_scale));
  return ieee_mul(w, s < 0.0f ? 0.0f : s);
}

// The rank order of top-k as an unsigned key: ascending key = descending score, −0 == +0, every
// NaN after −inf (all NaNs equal). Ties between equal keys go to the lower column.
DSV4_HD uint32_t topk_key(float score) {
  uint32_t u = float_bits(score);
  if ((u & 0x7fffffffu) > 0x7f800000u) return 0xffffffffu;  // NaN: last
  if ((u & 0x7fffffffu) == 0u) u = 0u;                      // −0 ranks as +0
  // Order-preserving map of floats to unsigned (negative: flip all bits; positive: set the
  // sign bit), then complemented for descending order. No number maps to 0xffffffff.
  const uint32_t ascending = (u & 0x80000000u) ? ~u : (u | 0x80000000u);
  return ~ascending;
}

// The scale of the head weights, 128^-0.5 · H_I^-0.5, rounded once from double (host code: the
// CPU op and the CUDA launch compute it alike).
inline float indexer_weight_scale(int64_t heads) {
  const double terms = double{indexer_keys::kDim} * static_cast<double>(heads);
  return static_cast<float>(1.0 / std::sqrt(terms));
}

}  // namespace dsv4::indexer_math

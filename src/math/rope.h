// GPT-J interleaved RoPE on fp32 rows, shared by apply_rope, inv_rope_fp8_quant,
// qnorm_rope_kv_insert and the compressor on the CPU and in their CUDA kernels, so all rotate
// identically. The table's argument checks are host code: src/cpu/rope_common.h.
#pragma once

#include <cstdint>

#include "dsv4/dtype.h"

namespace dsv4::math {

// Rotates one pair (a, b) by the angle with cosine c and sine s: (a·c − b·s, a·s + b·c), each
// product and sum IEEE-rounded (DSV4_HD: the CUDA kernels rotate with this very function, so CPU
// and GPU results are bit-identical).
DSV4_HD void rope_rotate_pair(float& a, float& b, float c, float s) {
  const float ya = ieee_sub(ieee_mul(a, c), ieee_mul(b, s));
  const float yb = ieee_add(ieee_mul(a, s), ieee_mul(b, c));
  a = ya;
  b = yb;
}

// Rotates the pairs (2i, 2i+1) of x[0 .. 2·half) by angle θ_i, where cos_sin holds
// [cos θ_0 .. cos θ_{half-1} | sin θ_0 .. sin θ_{half-1}] (one row of build_rope_cache).
// inverse: the conjugate rotation (−θ_i).
inline void rope_rotate_pairs(float* x, const float* cos_sin, int64_t half, bool inverse) {
  for (int64_t i = 0; i < half; ++i)
    rope_rotate_pair(x[2 * i], x[2 * i + 1], cos_sin[i], inverse ? -cos_sin[half + i] : cos_sin[half + i]);
}

}  // namespace dsv4::math

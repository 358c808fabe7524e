// GPT-J interleaved RoPE on fp32 rows and the argument checks of a cos/sin table lookup, shared
// by apply_rope and qnorm_rope_kv_insert (and their CUDA kernels) so all rotate identically.
#pragma once

#include <cstdint>

#include "dsv4/dtype.h"
#include "dsv4/tensor.h"

namespace dsv4::cpu {

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

// cos_sin: fp32 [max_pos, R] with R even and 2 <= R <= head_dim, rows contiguous. Returns R.
int64_t check_rope_table(const char* where, const TensorView& cos_sin, int64_t head_dim);

// Every positions[t] lies in [0, cos_sin.shape[0]) (a CPU pass over the data).
void check_positions_in_table(const char* where, const TensorView& positions,
                              const TensorView& cos_sin);

// Pointer to the table row of position p.
inline const float* rope_table_row(const TensorView& cos_sin, int64_t p) {
  return static_cast<const float*>(cos_sin.data) + p * cos_sin.strides[0];
}

}  // namespace dsv4::cpu

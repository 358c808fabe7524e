// The compressor's per-element math that no other op shares (docs/spec.md §4), used by the CPU op
// (src/cpu/compressor_emit.cpp) and its CUDA kernels (src/cuda/compressor/) alike: the softmax
// weights' exp and the per-dim pooling. Every operation is IEEE-rounded on its own (dtype.h
// ieee_*: non-fused, non-flushing PTX on the device, plain operators on the host), so both
// backends compute bit-identical entries. The RMSNorm and RoPE of an entry are the shared ones
// of math/rms_norm.h and math/rope.h.
#pragma once

#include <cstdint>

#include "dsv4/dtype.h"

namespace dsv4::compressor_math {

// e^x for the softmax weights (x = s − max <= 0), from IEEE-rounded operations only, so host and
// device agree bit for bit (std::exp and CUDA's expf are different approximations). Cody–Waite
// reduction x = n·ln2 + r (ln2 split in C1 + C2, n·C1 exact for |n| < 2^15) and Cephes' expf
// polynomial for e^r, |r| <= ln2/2: relative error below 3e-7 (tests/cpu/test_compressor_math).
// NaN stays NaN; x < −87 gives 0 (e^−87 ≈ 1.6e−38: every nonzero result is a normal float);
// x > 88 gives +inf.
DSV4_HD float softmax_exp(float x) {
  if (x != x) return x;
  if (x < -87.0f) return 0.0f;
  if (x > 88.0f) return bits_float(0x7f800000u);
  constexpr float kLog2e = 1.44269504088896341f;
  constexpr float kC1 = 0.693359375f, kC2 = -2.12194440e-4f;  // C1 + C2 ≈ ln2
  const float n = floorf(ieee_add(ieee_mul(x, kLog2e), 0.5f));  // in [−126, 127]
  float r = ieee_sub(x, ieee_mul(n, kC1));
  r = ieee_sub(r, ieee_mul(n, kC2));
  const float z = ieee_mul(r, r);
  float y = 1.9875691500e-4f;
  y = ieee_add(ieee_mul(y, r), 1.3981999507e-3f);
  y = ieee_add(ieee_mul(y, r), 8.3334519073e-3f);
  y = ieee_add(ieee_mul(y, r), 4.1665795894e-2f);
  y = ieee_add(ieee_mul(y, r), 1.6666665459e-1f);
  y = ieee_add(ieee_mul(y, r), 5.0000001201e-1f);
  y = ieee_add(ieee_add(ieee_mul(y, z), r), 1.0f);
  return ieee_mul(y, exp2_int(static_cast<int32_t>(n)));
}

// Dim d of the pooled entry (docs/spec.md §4): Σ_i softmax_i(s_i[d]) · kv_i[d] over the window's n
// present rows, in row order: the max first, then weighted sum and normalizer in one pass.
DSV4_HD float pool_dim(const float* const* kv, const float* const* s, int n, int d) {
  float m = -bits_float(0x7f800000u);
  for (int i = 0; i < n; ++i) m = (m < s[i][d]) ? s[i][d] : m;  // std::max's comparison
  float num = 0.0f, den = 0.0f;
  for (int i = 0; i < n; ++i) {
    const float w = softmax_exp(ieee_sub(s[i][d], m));
    num = ieee_add(num, ieee_mul(w, kv[i][d]));
    den = ieee_add(den, w);
  }
  return ieee_div(num, den);
}

}  // namespace dsv4::compressor_math

// The softmax scale of the sparse attention ops (docs/spec.md §6): the caller's, or d_qk^-0.5 when it
// passes 0 — one rule for every entry point's validation (the front doors and the CUDA backends'
// own entries), the CPU kernels and the CUDA launchers. The CUDA kernels work in base 2 with
// scale · log2(e) (kLog2e).
#pragma once

#include <cmath>
#include <cstdint>

namespace dsv4::math {

// Base-2 conversions of the CUDA kernels: logits · kLog2e into base 2, lse and max_logits · kLn2
// back to natural units (usable in device code: constexpr scalars).
inline constexpr float kLog2e = 1.4426950408889634f;
inline constexpr float kLn2 = 0.6931471805599453f;

// The rule every entry point checks a caller's softmax_scale against: 0 (d_qk^-0.5), or a finite
// value whose scale · log2(e) is a normal float. The CUDA kernels work with that product: the
// sparse prefill multiplies a masked logit's −inf by it inside each exponent's FFMA, and under
// flush-to-zero a subnormal product would make that −inf · 0 = NaN (an overflow to inf would be
// NaN as well). kSoftmaxScaleRule says it in an error message's words.
inline constexpr const char* kSoftmaxScaleRule = "0 (d_qk^-0.5) or a magnitude from 8.2e-39 to 2.35e38";
inline bool is_valid_softmax_scale(float scale) {
  return std::isfinite(scale) && (scale == 0.0f || std::isnormal(scale * kLog2e));
}

inline float effective_softmax_scale(float scale, int64_t d_qk) {
  return scale != 0.0f ? scale : static_cast<float>(1.0 / std::sqrt(static_cast<double>(d_qk)));
}

}  // namespace dsv4::math

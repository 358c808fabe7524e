// The softmax scale of the sparse attention ops (docs/spec.md §6): the caller's, or d_qk^-0.5 when it
// passes 0 — one rule for the front doors' validation and the CPU kernels. The CUDA kernels work in
// base 2 with scale · log2(e) (kLog2e).
#pragma once

#include <cmath>
#include <cstdint>

namespace dsv4::math {

// Base-2 conversions of the CUDA kernels: logits · kLog2e into base 2, lse and max_logits · kLn2
// back to natural units (usable in device code: constexpr scalars).
inline constexpr float kLog2e = 1.4426950408889634f;
inline constexpr float kLn2 = 0.6931471805599453f;

inline float effective_softmax_scale(float scale, int64_t d_qk) {
  return scale != 0.0f ? scale : static_cast<float>(1.0 / std::sqrt(static_cast<double>(d_qk)));
}

}  // namespace dsv4::math

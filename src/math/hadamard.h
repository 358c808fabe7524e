// Hadamard rotation of the indexer (docs/spec.md §4/§5): v ← H_n · v · n^-0.5 with H_n the Sylvester
// Hadamard matrix (H_2n = [[H_n, H_n], [H_n, −H_n]]; entry (i, k) = (−1)^popcount(i & k)), the
// ordering of fast_hadamard_transform that DeepSeek's reference uses. The scale makes it
// orthonormal, so dot products between rotated vectors are unchanged; it only spreads outliers
// across the dims before FP8 quantization.
#pragma once

#include <cmath>

namespace dsv4::math {

// n^-0.5 rounded once from double: the scale of every Hadamard rotation, CPU and CUDA alike.
inline float hadamard_scale(int n) {
  return static_cast<float>(1.0 / std::sqrt(static_cast<double>(n)));
}

// In place, n a power of two (fp32 butterflies, log2(n) stages, then one scale).
inline void hadamard_rotate(float* v, int n) {
  for (int h = 1; h < n; h *= 2)
    for (int i = 0; i < n; i += 2 * h)
      for (int k = i; k < i + h; ++k) {
        const float a = v[k], b = v[k + h];
        v[k] = a + b;
        v[k + h] = a - b;
      }
  const float scale = hadamard_scale(n);
  for (int i = 0; i < n; ++i) v[i] *= scale;
}

}  // namespace dsv4::math

// FP8 e4m3 quantization of one block of values with one power-of-two scale (the UE8M0 rule of
// docs/spec.md §7: scale = 2^ceil(log2(max(amax / 448, 1e-4)))). Shared by the compressor (the nope dims
// of an entry, blocks of 64, for caches that do not store FP8 themselves), the indexer key cache
// (one block of 128 per entry) and the indexer queries (one block of 128 per head), on the host
// and in CUDA kernels (DSV4_HD), so every path rounds identically.
#pragma once

#include <cmath>
#include <cstdint>

#include "dsv4/dtype.h"

namespace dsv4 {

// Writes fp8 codes q[i] = fp8(v[i] / 2^k) and returns the exponent k (value = fp8 * 2^k).
DSV4_HD int32_t fp8_quantize_block(const float* v, int n, uint8_t* q) {
  float amax = 0.0f;
  for (int i = 0; i < n; ++i) amax = fmaxf(amax, fabsf(v[i]));
  const int32_t k = ue8m0_exponent_for_amax(amax);
  const float inv = exp2_int(-k);
  for (int i = 0; i < n; ++i) q[i] = float_to_fp8_e4m3(ieee_mul(v[i], inv));
  return k;
}

// In place: v[i] ← fp8(v[i] / 2^k) · 2^k, the value an FP8 block cache would hand back.
DSV4_HD void fp8_round_block(float* v, int n) {
  float amax = 0.0f;
  for (int i = 0; i < n; ++i) amax = fmaxf(amax, fabsf(v[i]));
  const int32_t k = ue8m0_exponent_for_amax(amax);
  const float inv = exp2_int(-k), scale = exp2_int(k);
  for (int i = 0; i < n; ++i)
    v[i] = ieee_mul(fp8_e4m3_to_float(float_to_fp8_e4m3(ieee_mul(v[i], inv))), scale);
}

}  // namespace dsv4

// FP8 e4m3 quantization of one block of values with one scale: a power of two (the UE8M0 rule of
// docs/spec.md §7: scale = 2^ceil(log2(max(amax / 448, 1e-4)))), or an arbitrary fp32 scale
// given for a whole tensor (below). The power-of-two rule is shared by the compressor (the nope dims
// of an entry, blocks of 64, for caches that do not store FP8 themselves), the indexer key cache
// (one block of 128 per entry) and the indexer queries (one block of 128 per head), on the host
// and in CUDA kernels (DSV4_HD), so every path rounds identically.
#pragma once

#include <cmath>
#include <cstdint>

#include "dsv4/dtype.h"

namespace dsv4 {

// The code of one value of a block quantized with exponent k: fp8(v / 2^k). (Kernels that spread
// a block over threads take the block's amax — exact in any order — and call this per value.)
DSV4_HD uint8_t fp8_encode_value(float v, int32_t k) { return float_to_fp8_e4m3(ieee_mul(v, exp2_int(-k))); }

// Writes fp8 codes q[i] = fp8(v[i] / 2^k) and returns the exponent k (value = fp8 * 2^k).
DSV4_HD int32_t fp8_quantize_block(const float* v, int n, uint8_t* q) {
  float amax = 0.0f;
  for (int i = 0; i < n; ++i) amax = fmaxf(amax, fabsf(v[i]));
  const int32_t k = ue8m0_exponent_for_amax(amax);
  for (int i = 0; i < n; ++i) q[i] = fp8_encode_value(v[i], k);
  return k;
}

// One arbitrary fp32 scale for a whole tensor (vLLM's per-tensor FP8: the FP8_PER_TENSOR cache,
// the FP8 query of qnorm_rope_kv_insert): code = fp8(v · inv_scale), inv_scale = ieee_div(1, scale)
// computed once by the caller (a multiply per value, as the port's kernels do; not always the
// same code as fp8(v / scale)), saturating at ±448; the value a code means is fp8 · scale, one
// fp32 rounding (exact for a power-of-two scale).
DSV4_HD uint8_t fp8_encode_scaled(float v, float inv_scale) { return float_to_fp8_e4m3(ieee_mul(v, inv_scale)); }
DSV4_HD float fp8_decode_scaled(uint8_t code, float scale) { return ieee_mul(fp8_e4m3_to_float(code), scale); }

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

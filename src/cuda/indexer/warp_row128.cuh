// The per-row steps the indexers' rows share, for one warp holding a 128-dim row (lane l: dims
// 4l .. 4l+3): RoPE (GPT-J pairs for V4, NeoX halves for V3.2), the Hadamard rotation and the
// FP8 encoding with one power-of-two scale. Every fp32 operation is the CPU reference's
// (math::rope_rotate_pair, math::hadamard_rotate, fp8_quantize_block) one for one, so identical
// rows give identical codes and scales.
#pragma once

#include <cuda_runtime.h>

#include <cstdint>

#include "cuda/common/rope_table.cuh"
#include "dsv4/dtype.h"
#include "dsv4/fp8_block.h"
#include "dsv4/indexer_key_cache.h"

namespace dsv4::cuda::warp_row128 {

inline constexpr int kDim = indexer_keys::kDim;  // 128 = 32 lanes × 4 values
static_assert(kDim == 32 * 4, "a warp holds a row as 4 values per lane");

// V4: GPT-J pairs (2i, 2i+1) of the last 2·half dims; pairs never straddle lanes (4l is even).
__device__ __forceinline__ void rope_pairs(float (&v)[4], int lane, const RopeTable& table, int64_t pos) {
  const int first = kDim - 2 * table.half;
  for (int m = 0; m < 2; ++m) {
    const int d = 4 * lane + 2 * m;
    if (d < first) continue;
    table.rotate(pos, (d - first) / 2, v[2 * m], v[2 * m + 1]);
  }
}

// V3.2: NeoX halves of the FIRST 2·half dims, pair i = (i, i + half). The two values of a pair
// may sit in different lanes (and elements): the row goes through `stage` (128 floats of shared
// memory owned by the warp), and each lane computes the rotation of the pairs it holds a side
// of, keeping its own side (the same arithmetic on both sides: bit for bit the CPU's). Called by
// every lane of the warp.
__device__ __forceinline__ void rope_halves(float (&v)[4], int lane, const RopeTable& table, int64_t pos,
                                            float* stage) {
  const int half = table.half;
  for (int j = 0; j < 4; ++j) stage[4 * lane + j] = v[j];
  __syncwarp();
  for (int j = 0; j < 4; ++j) {
    const int d = 4 * lane + j;
    if (d < half) {
      float a = v[j], b = stage[d + half];
      table.rotate(pos, d, a, b);
      v[j] = a;
    } else if (d < 2 * half) {
      float a = stage[d - half], b = v[j];
      table.rotate(pos, d - half, a, b);
      v[j] = b;
    }
  }
  __syncwarp();  // the stage is free again
}

// In place v ← H_128 v · scale (Sylvester order): stages s = 1, 2 inside the lane, s = 4 .. 64
// across lanes (partner lane l ^ s/4). Each stage is element-wise on the previous one
// (v[k] ← v[k] + v[k+s], v[k+s] ← v[k] − v[k+s] for k without bit s), so the shuffles give the
// CPU's butterflies bit for bit.
__device__ __forceinline__ void hadamard(float (&v)[4], int lane, float scale) {
  for (int j = 0; j < 4; j += 2) {  // s = 1
    const float a = v[j], b = v[j + 1];
    v[j] = ieee_add(a, b);
    v[j + 1] = ieee_sub(a, b);
  }
  for (int j = 0; j < 2; ++j) {  // s = 2
    const float a = v[j], b = v[j + 2];
    v[j] = ieee_add(a, b);
    v[j + 2] = ieee_sub(a, b);
  }
  for (int lane_bit = 1; lane_bit < 32; lane_bit *= 2) {
    const bool upper = (lane & lane_bit) != 0;  // this lane holds the v[k+s] side
    for (int j = 0; j < 4; ++j) {
      const float other = __shfl_xor_sync(0xffffffffu, v[j], lane_bit);
      v[j] = upper ? ieee_sub(other, v[j]) : ieee_add(v[j], other);
    }
  }
  for (int j = 0; j < 4; ++j) v[j] = ieee_mul(v[j], scale);
}

// fp8_quantize_block over the warp's 128 values: the block maximum (order-free), the UE8M0
// exponent k (returned, the same on every lane) and this lane's 4 codes.
__device__ __forceinline__ int32_t quantize(const float (&v)[4], uint8_t (&codes)[4]) {
  float amax = 0.0f;
  for (int j = 0; j < 4; ++j) amax = fmaxf(amax, fabsf(v[j]));
  for (int off = 16; off > 0; off /= 2) amax = fmaxf(amax, __shfl_xor_sync(0xffffffffu, amax, off));
  const int32_t k = ue8m0_exponent_for_amax(amax);
  for (int j = 0; j < 4; ++j) codes[j] = fp8_encode_value(v[j], k);
  return k;
}

}  // namespace dsv4::cuda::warp_row128

// A 128-dim indexer row held by a group of kLanes consecutive lanes (kLanes a power of two ≤ 16),
// for kernels that stream many rows: lane l of the group holds the row's float4 groups
// l, l + kLanes, l + 2·kLanes, …, so its value e is dim 4·(kLanes·(e / 4) + l) + e % 4.
//
// Why this layout: each of the lane's 32 / kLanes float4 loads is part of a contiguous
// 16·kLanes-byte piece of the row (whole sectors per warp instruction), and the Hadamard
// rotation's seven stages split by the dim bit they pair: bits 0-1 (e's bits 0-1) and bits
// 2 + log2 kLanes and up (e's bits 2 and up) pair values inside the lane, leaving only the
// log2 kLanes stages of bits 2 .. 1 + log2 kLanes (the lane bits) to shuffles. A warp per row
// (warp_row128.cuh) needs five shuffle stages, a shuffle and two predicated adds per value each;
// four lanes need two, a shuffle and one FMA per value each (hadamard below).
//
// The arithmetic is the CPU reference's (math::rope_rotate_pair, math::hadamard_rotate's
// butterflies stage by stage, fp8_quantize_block's rule through act_quant.cuh), so identical rows
// give identical codes and scales.
#pragma once

#include <cuda_runtime.h>

#include <cstdint>

#include "cuda/common/act_quant.cuh"
#include "cuda/common/rope_table.cuh"
#include "dsv4/dtype.h"
#include "dsv4/indexer_key_cache.h"

namespace dsv4::cuda {

template <int kLanes>
struct LaneGroupRow128 {
  static constexpr int kDim = indexer_keys::kDim;      // 128
  static constexpr int kGroups = kDim / 4 / kLanes;    // float4 groups per lane
  static constexpr int kValues = 4 * kGroups;          // values per lane
  // At least 8 values per lane: whole 8-code words for quantize_block_values.
  static_assert(kLanes >= 1 && kLanes <= 16 && (kLanes & (kLanes - 1)) == 0,
                "lanes per row: 1, 2, 4, 8 or 16");
  static_assert(kDim == 128, "the layout splits 128 dims");

  // Dim of the lane's value e (a float4 group's first value for e % 4 == 0).
  static __device__ __forceinline__ int dim(int lane, int e) {
    return 4 * (kLanes * (e / 4) + lane) + e % 4;
  }

  // The row's values of this lane from `row` (16-byte aligned, contiguous).
  static __device__ __forceinline__ void load(const float* row, int lane, float (&v)[kValues]) {
    const float4* src = reinterpret_cast<const float4*>(row) + lane;
#pragma unroll
    for (int g = 0; g < kGroups; ++g) {
      const float4 x = src[g * kLanes];
      v[4 * g] = x.x, v[4 * g + 1] = x.y, v[4 * g + 2] = x.z, v[4 * g + 3] = x.w;
    }
  }

  // V4 RoPE: GPT-J pairs (2i, 2i+1) of the dims from `first` on, rotated by the row's angles
  // (RopeTable::angles). A pair never straddles lanes (dims 4m .. 4m+3 stay together). Groups
  // wholly before `first` are skipped by a test the whole warp agrees on.
  static __device__ __forceinline__ void rope_pairs(float (&v)[kValues], int lane,
                                                    const RopeAngles& angles, int first) {
    // The pair at the lane's group g, place m (dims d = dim(lane, 4g + 2m), d + 1) is rope pair
    // j = (d − first) / 2 = j_lane + 2·kLanes·g + m: a lane base plus a constant, so every angle
    // load is one base address plus an immediate.
    const int j_lane = 2 * lane - first / 2;
#pragma unroll
    for (int g = 0; g < kGroups; ++g) {
      if (4 * kLanes * (g + 1) <= first) continue;  // every lane's group g lies before `first`
#pragma unroll
      for (int m = 0; m < 2; ++m) {
        if (dim(lane, 4 * g + 2 * m) < first) continue;
        angles.rotate(j_lane + 2 * kLanes * g + m, v[4 * g + 2 * m], v[4 * g + 2 * m + 1]);
      }
    }
  }

  // In place v ← H_128 v · scale in math::hadamard_rotate's stage order s = 1, 2, …, 64. Each
  // stage pairs the values whose dims differ in bit log2 s: (v[k], v[k+s]) ← (v[k] + v[k+s],
  // v[k] − v[k+s]), every sum and difference IEEE-rounded as the CPU's.
  static __device__ __forceinline__ void hadamard(float (&v)[kValues], int lane, float scale) {
#pragma unroll
    for (int bit = 1; bit < 4; bit *= 2) butterflies_in_lane(v, bit);  // s = 1, 2
#pragma unroll
    for (int lane_bit = 1; lane_bit < kLanes; lane_bit *= 2) {  // s = 4, …, 2·kLanes
      // The lane holding the v[k+s] side (its lane bit set) computes other − own, the one
      // holding v[k] own + other. As own·(∓1) + other in one FMA: the product is exact (a sign
      // flip) and the sum rounds once, so the result is the IEEE sum / difference bit for bit
      // (zeros' signs included: x + y and y + x round alike), one instruction instead of a
      // predicated pair.
      const float sign = (lane & lane_bit) ? -1.0f : 1.0f;
#pragma unroll
      for (int e = 0; e < kValues; ++e) {
        const float other = __shfl_xor_sync(0xffffffffu, v[e], lane_bit);
        v[e] = exact_fma(v[e], sign, other);
      }
    }
#pragma unroll
    for (int bit = 4; bit < kValues; bit *= 2) butterflies_in_lane(v, bit);  // s = 4·kLanes, …, 64
#pragma unroll
    for (int e = 0; e < kValues; ++e) v[e] = ieee_mul(v[e], scale);
  }

 private:
  // One stage among the lane's own values: pairs (e, e + bit) for e without `bit`.
  static __device__ __forceinline__ void butterflies_in_lane(float (&v)[kValues], int bit) {
#pragma unroll
    for (int e = 0; e < kValues; ++e) {
      if (e & bit) continue;
      const float a = v[e], b = v[e + bit];
      v[e] = ieee_add(a, b);
      v[e + bit] = ieee_sub(a, b);
    }
  }
  // a·b + c rounded once, subnormals kept (the fast-math build would flush fmaf's).
  static __device__ __forceinline__ float exact_fma(float a, float b, float c) {
    float r;
    asm("fma.rn.f32 %0, %1, %2, %3;" : "=f"(r) : "f"(a), "f"(b), "f"(c));
    return r;
  }
};

}  // namespace dsv4::cuda

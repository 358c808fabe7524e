// The device half of FP8 activation quantization (quantize_act_fp8's rule: per row and block of
// 64 / 128 values, the UE8M0 scale 2^k with k = ue8m0_exponent_for_amax(amax), codes fp8(v / 2^k)),
// for kernels that hold a block spread over a group of lanes, a multiple of 8 values per lane
// (FloatRows::kChunk): quantize_act_fp8 and the FP8 output of fused_qkv_rms_norm (8 per lane),
// inv_rope_fp8_quant (16) and the indexer query rows (one block of 128 over 4 lanes, 32 each; the
// same rule as fp8_quantize_block). Codes and scales are bit-identical to the CPU's (dtype.h /
// fp8_block.h).
#pragma once

#include <cstdint>

#include "cuda/common/fp8_convert.cuh"
#include "dsv4/dtype.h"
#include "dsv4/tensor.h"

namespace dsv4::cuda {

// A [rows, blocks] scale output at any strides (the CUDA FP8 GEMMs take it row-minor: strides
// {1, rows}), ue8m0 bytes or fp32 powers of two.
struct ActScales {
  void* data = nullptr;
  int64_t row_stride = 0, block_stride = 0;
  bool ue8m0 = false;

  static ActScales of(const TensorView& t) {
    return ActScales{t.data, t.strides[0], t.strides[1], t.dtype == DType::ue8m0};
  }
  __device__ __forceinline__ void store(int64_t row, int64_t block, int32_t k) const {
    const int64_t i = row * row_stride + block * block_stride;
    if (ue8m0)
      static_cast<uint8_t*>(data)[i] = static_cast<uint8_t>(k + 127);
    else
      static_cast<float*>(data)[i] = exp2_int(k);
  }
};

// Quantizes one block held by kLanes consecutive lanes (aligned to kLanes within the warp),
// kValues values per lane (a multiple of 8): returns the block's exponent k (the same in all its
// lanes) and the lane's codes, codes[i] holding those of v[8i .. 8i+7]. All 32 lanes of the warp
// must call it (lanes without data pass zeros).
template <int kLanes, int kValues>
__device__ __forceinline__ int32_t quantize_block_values(const float* v, uint2* codes) {
  static_assert(kLanes >= 1 && kLanes <= 32 && (kLanes & (kLanes - 1)) == 0, "lanes per block: a power of two");
  static_assert(kValues % 8 == 0, "values per lane: whole 8-byte code words");
  float amax = 0.0f;
#pragma unroll
  for (int i = 0; i < kValues; ++i) amax = fmaxf(amax, fabsf(v[i]));  // skips a NaN, as the CPU does
#pragma unroll
  for (int off = kLanes / 2; off > 0; off /= 2) amax = fmaxf(amax, __shfl_xor_sync(0xffffffffu, amax, off));
  const int32_t k = ue8m0_exponent_for_amax(amax);
  const float inv = exp2_int(-k);  // exact: dividing by a power of two
  uint32_t nan_codes = 0;  // the hardware codes first, one NaN test for all of them
#pragma unroll
  for (int c = 0; c < kValues / 8; ++c) {
    float scaled[8];
#pragma unroll
    for (int i = 0; i < 8; ++i) scaled[i] = ieee_mul(v[8 * c + i], inv);
    codes[c] = fp8x8_e4m3_encode_hw(scaled);
    nan_codes |= fp8x8_nan_code_bits(codes[c]);
  }
  // Rare: the NaNs' signs, as fp8x2_e4m3_encode restores them. The codes are converted again
  // rather than reused: kept for this branch they cost quantize_act_fp8 8 registers (36 → 44).
  if (nan_codes) {
#pragma unroll
    for (int c = 0; c < kValues / 8; ++c) {
      float scaled[8];
#pragma unroll
      for (int i = 0; i < 8; ++i) scaled[i] = ieee_mul(v[8 * c + i], inv);
      codes[c] = fp8x8_restore_nan_signs(fp8x8_e4m3_encode_hw(scaled), scaled);
    }
  }
  return k;
}

// The common case: eight values (one FloatRows chunk) per lane.
template <int kLanes>
__device__ __forceinline__ int32_t quantize_block_chunk(const float v[8], uint2& codes) {
  return quantize_block_values<kLanes, 8>(v, &codes);
}

// Stores eight codes at p (element i of a row): one 8-byte store when kVector (p 8-byte aligned),
// else the first `count` bytes one by one.
template <bool kVector>
__device__ __forceinline__ void store_codes(uint8_t* p, const uint2& codes, int count) {
  if (kVector && count == 8) {
    *reinterpret_cast<uint2*>(p) = codes;
    return;
  }
#pragma unroll
  for (int i = 0; i < 8; ++i)
    if (i < count) p[i] = static_cast<uint8_t>((i < 4 ? codes.x : codes.y) >> (8 * (i % 4)));
}

}  // namespace dsv4::cuda

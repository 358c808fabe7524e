// One FP8 scale block of a KV cache token encoded by a whole warp: the bytes kv_encode_scale_block
// (dsv4/kv_layout.h) writes, for kernels that encode a token or a few at a time, where one thread
// walking the block's 64 or 128 values (amax, then each value through the software encoder) was
// the step's serial tail. The block maximum is a warp max (fmaxf: exact in any order, NaNs
// dropped as the serial loop drops them); each lane encodes adjacent pairs with the hardware pair
// encoder (fp8_convert.cuh, bit-identical to float_to_fp8_e4m3).
#pragma once

#include <cstdint>

#include "cuda/common/fp8_convert.cuh"
#include "dsv4/fp8_block.h"
#include "dsv4/kv_layout.h"

namespace dsv4::cuda {

// Scale block s of the token at `offset` of `block` from values[0 .. dim) (the whole token); every
// lane of the warp calls it with the same arguments.
__device__ __forceinline__ void warp_encode_kv_scale_block(const KvGeometry& g, uint8_t* block, int offset,
                                                           int s, const float* values, int lane) {
  const int width = kv_scale_block_width(g.layout);  // 64 or 128: a multiple of 64
  const float* v = values + s * width;
  float amax = 0.0f;
  for (int i = 2 * lane; i < width; i += 64) amax = fmaxf(amax, fmaxf(fabsf(v[i]), fabsf(v[i + 1])));
  for (int off = 16; off > 0; off /= 2) amax = fmaxf(amax, __shfl_xor_sync(0xffffffffu, amax, off));
  const int32_t k = ue8m0_exponent_for_amax(amax);
  const float inv = exp2_int(-k);
  uint8_t* codes = block + g.data_offset(offset) + s * width;  // even: both layouts' rows are
  for (int i = 2 * lane; i < width; i += 64)
    *reinterpret_cast<uint16_t*>(codes + i) =
        static_cast<uint16_t>(fp8x2_e4m3_encode(ieee_mul(v[i], inv), ieee_mul(v[i + 1], inv)));
  if (lane == 0) kv_store_block_scale(g, block, offset, s, k);
}

}  // namespace dsv4::cuda

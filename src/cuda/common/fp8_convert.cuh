// Register-level conversions for kernels that dequantize FP8 on the fly: fp8 e4m3 → bf16 with a
// power-of-two scale (exact: e4m3 · 2^k fits bf16), and float pairs → packed bf16x2.
#pragma once

#include <cuda_fp16.h>
#include <cuda_fp8.h>

#include <cstdint>

namespace dsv4::cuda {

// Two floats → packed bf16x2 (round to nearest even), `lo` in the low half.
__device__ __forceinline__ uint32_t pack_bf16x2(float lo, float hi) {
  uint32_t r;
  asm("cvt.rn.bf16x2.f32 %0, %1, %2;" : "=r"(r) : "f"(hi), "f"(lo));
  return r;
}

// Four fp8 e4m3 values (little-endian in a word) times `scale` → two packed bf16x2 words.
__device__ __forceinline__ uint2 fp8x4_to_bf16x4(uint32_t fp8x4, float scale) {
  const __half2 lo = __half2(__nv_cvt_fp8x2_to_halfraw2(
      static_cast<__nv_fp8x2_storage_t>(fp8x4 & 0xffffu), __NV_E4M3));
  const __half2 hi = __half2(__nv_cvt_fp8x2_to_halfraw2(
      static_cast<__nv_fp8x2_storage_t>(fp8x4 >> 16), __NV_E4M3));
  const float2 a = __half22float2(lo), b = __half22float2(hi);
  return make_uint2(pack_bf16x2(a.x * scale, a.y * scale), pack_bf16x2(b.x * scale, b.y * scale));
}

// Sixteen fp8 values (one 16-byte chunk) → two 16-byte chunks of bf16.
__device__ __forceinline__ void fp8x16_to_bf16x16(const uint4& v, float scale, uint4& lo, uint4& hi) {
  const uint2 a = fp8x4_to_bf16x4(v.x, scale), b = fp8x4_to_bf16x4(v.y, scale);
  const uint2 c = fp8x4_to_bf16x4(v.z, scale), d = fp8x4_to_bf16x4(v.w, scale);
  lo = make_uint4(a.x, a.y, b.x, b.y);
  hi = make_uint4(c.x, c.y, d.x, d.y);
}

}  // namespace dsv4::cuda

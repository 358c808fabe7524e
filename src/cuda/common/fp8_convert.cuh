// Register-level conversions: fp8 e4m3 → bf16 with a power-of-two scale (exact: e4m3 · 2^k fits
// bf16) for kernels that dequantize FP8 on the fly, or with any scale rounded as the host rounds
// it (an FP8 query), float pairs → packed bf16x2, and floats →
// fp8 e4m3 codes for the quantizing kernels.
#pragma once

#include <cuda_fp16.h>
#include <cuda_fp8.h>

#include <cstdint>

#include "dsv4/dtype.h"

namespace dsv4::cuda {

// Two floats → packed bf16x2 (round to nearest even), `lo` in the low half.
__device__ __forceinline__ uint32_t pack_bf16x2(float lo, float hi) {
  uint32_t r;
  asm("cvt.rn.bf16x2.f32 %0, %1, %2;" : "=r"(r) : "f"(hi), "f"(lo));
  return r;
}

// dtype.h's float_to_bf16_bits of eight floats, packed in pairs (v[0] in the lowest half), by four
// hardware conversions: cvt.rn rounds to nearest even (subnormals kept, overflow to ±inf) exactly
// as float_to_bf16_bits does; only a NaN, which the hardware turns into 0x7fff, takes dtype.h's
// own rule (its payload kept, made quiet), so a group holding one is converted value by value
// (one test for the eight, a rare branch).
__device__ __forceinline__ uint4 pack_bf16x8(const float* v) {
  bool nan = false;
#pragma unroll
  for (int i = 0; i < 8; ++i) nan |= v[i] != v[i];
  uint32_t w[4];
#pragma unroll
  for (int k = 0; k < 4; ++k)
    w[k] = nan ? static_cast<uint32_t>(float_to_bf16_bits(v[2 * k])) |
                     (static_cast<uint32_t>(float_to_bf16_bits(v[2 * k + 1])) << 16)
               : pack_bf16x2(v[2 * k], v[2 * k + 1]);
  return make_uint4(w[0], w[1], w[2], w[3]);
}

// dtype.h's round_bf16 of eight floats, in place (pack_bf16x8's rounding).
__device__ __forceinline__ void round_bf16x8(float* v) {
  const uint4 p = pack_bf16x8(v);
  const uint32_t w[4] = {p.x, p.y, p.z, p.w};
#pragma unroll
  for (int k = 0; k < 4; ++k) {
    v[2 * k] = __uint_as_float(w[k] << 16);
    v[2 * k + 1] = __uint_as_float(w[k] & 0xffff0000u);
  }
}

// Two fp8 e4m3 codes (bits 0-15 of `pair`, the low byte's first) → their values, exactly: every
// e4m3 value is a normal fp16, so the hardware's pair conversion to fp16 and then to float is exact.
__device__ __forceinline__ float2 e4m3x2_to_float2(uint32_t pair) {
  return __half22float2(
      __half2(__nv_cvt_fp8x2_to_halfraw2(static_cast<__nv_fp8x2_storage_t>(pair & 0xffffu), __NV_E4M3)));
}

// Four fp8 e4m3 values (little-endian in a word) times `scale` → two packed bf16x2 words.
__device__ __forceinline__ uint2 fp8x4_to_bf16x4(uint32_t fp8x4, float scale) {
  const float2 a = e4m3x2_to_float2(fp8x4), b = e4m3x2_to_float2(fp8x4 >> 16);
  return make_uint2(pack_bf16x2(a.x * scale, a.y * scale), pack_bf16x2(b.x * scale, b.y * scale));
}

// Eight fp8 e4m3 codes (little-endian) → eight bf16 values bf16(fp8 · scale) for any fp32 scale,
// bit-identical to the host's round_bf16(fp8_decode_scaled(code, scale)) (fp8_block.h) for every
// non-NaN code: the conversion to float is exact (e4m3 ⊂ fp16, all normal there), the product
// IEEE-rounded (ieee_mul, immune to --use_fast_math's flush-to-zero), then rounded once to bf16
// (to nearest even, subnormals kept; a NaN code gives some NaN).
__device__ __forceinline__ uint4 fp8x8_to_bf16x8_scaled(const uint2& codes, float scale) {
  uint32_t packed[4];
#pragma unroll
  for (int k = 0; k < 4; ++k) {
    const float2 v = e4m3x2_to_float2((k < 2 ? codes.x : codes.y) >> (16 * (k % 2)));
    packed[k] = pack_bf16x2(ieee_mul(v.x, scale), ieee_mul(v.y, scale));
  }
  return make_uint4(packed[0], packed[1], packed[2], packed[3]);
}

// A power-of-two scale (a UE8M0 byte's 2^(u - 127), a NaN for 255) as the bf16x2 factor of
// fp8x16_to_bf16x16_bf16_scale, in both halves: exact, since its float has no mantissa bits below
// bf16's (2^-127, a float subnormal, is bf16's subnormal 0x0040).
__device__ __forceinline__ uint32_t pow2_scale_bf16x2(float scale) { return (__float_as_uint(scale) >> 16) * 0x10001u; }

// The UE8M0 scale byte `byte` (0-3) of `word`, 2^(u - 127), as the bf16x2 factor of
// fp8x16_to_bf16x16_bf16_scale in both halves, straight from the byte: the same bits as
// pow2_scale_bf16x2(ue8m0_to_float(u)). For u in 1..254 that is u << 7; u 0 is 2^-127 (bf16's
// subnormal 0x0040) and u 255 the NaN 0x7fc0, taken by two selects where ue8m0_to_float's two
// special cases compile to two branches a scale.
__device__ __forceinline__ uint32_t ue8m0_scale_bf16x2(uint32_t word, int byte) {
  const uint32_t u = (word >> (8 * byte)) & 0xffu;
  uint32_t bits = u << 7;
  bits = u == 0u ? 0x0040u : bits;
  bits = u == 255u ? 0x7fc0u : bits;
  return bits * 0x10001u;
}

// Any float scale rounded to bf16 (to nearest even, dtype.h's round_bf16 for every non-NaN), in
// both halves: the factor of fp8x16_to_bf16x16_bf16_scale for V3.2's fp32 block scales, which are
// read as bf16 (docs/spec.md §7; exact for the UE8M0 scales writers store).
__device__ __forceinline__ uint32_t rounded_scale_bf16x2(float scale) { return pack_bf16x2(scale, scale); }

// Sixteen fp8 e4m3 codes (one 16-byte chunk) times a scale held in bf16 → two 16-byte chunks of
// bf16, bit-identical to the host's round_bf16(fp8 · scale): every e4m3 value is a bf16 exactly,
// so each pair is packed to bf16 unscaled and multiplied once in bf16 (`scale_bf16x2`, the scale
// in both halves), which rounds the exact product once; the host's fp32 product is exact too (at
// most 4 + 8 significant bits, the lowest no finer than 2^-142), so its one bf16 rounding is the
// same (subnormal results and overflow included; a NaN code or scale gives a NaN). One instruction
// fewer per pair than the float multiply. (Tested for every code at every scale byte and every
// bf16 scale: test_fp8_convert_cuda.cu.)
__device__ __forceinline__ void fp8x16_to_bf16x16_bf16_scale(const uint4& codes, uint32_t scale_bf16x2, uint4& lo,
                                                             uint4& hi) {
  const uint32_t word[4] = {codes.x, codes.y, codes.z, codes.w};
  uint32_t out[8];
#pragma unroll
  for (int k = 0; k < 8; ++k) {
    const float2 v = e4m3x2_to_float2(word[k / 2] >> (16 * (k % 2)));
    asm("mul.rn.bf16x2 %0, %1, %2;" : "=r"(out[k]) : "r"(pack_bf16x2(v.x, v.y)), "r"(scale_bf16x2));
  }
  lo = make_uint4(out[0], out[1], out[2], out[3]);
  hi = make_uint4(out[4], out[5], out[6], out[7]);
}

// Sixteen fp8 values (one 16-byte chunk) → two 16-byte chunks of bf16.
__device__ __forceinline__ void fp8x16_to_bf16x16(const uint4& v, float scale, uint4& lo, uint4& hi) {
  const uint2 a = fp8x4_to_bf16x4(v.x, scale), b = fp8x4_to_bf16x4(v.y, scale);
  const uint2 c = fp8x4_to_bf16x4(v.z, scale), d = fp8x4_to_bf16x4(v.w, scale);
  lo = make_uint4(a.x, a.y, b.x, b.y);
  hi = make_uint4(c.x, c.y, d.x, d.y);
}

// Two floats → two fp8 e4m3 codes (`lo`'s in the low byte) as the hardware converts them: round
// to nearest even, saturating to ±448 (infinities included), a NaN → a NaN code of either sign.
// Every code of a non-NaN has bits 0-6 at most 0x7e; a NaN's has them all set.
__device__ __forceinline__ uint32_t fp8x2_e4m3_encode_hw(float lo, float hi) {
  return __nv_cvt_float2_to_fp8x2(make_float2(lo, hi), __NV_SATFINITE, __NV_E4M3) & 0xffffu;
}

// Two floats → two fp8 e4m3 codes (`lo`'s in the low byte), bit-identical to dtype.h's
// float_to_fp8_e4m3 but one hardware conversion per pair (the software encoder costs ~15
// instructions per value, as much as a memory-bound kernel's whole budget): both round to nearest
// even and saturate to ±448 (infinities included); only a NaN's sign needs restoring, since the
// hardware returns the positive NaN code.
__device__ __forceinline__ uint32_t fp8x2_e4m3_encode(float lo, float hi) {
  uint32_t codes = __nv_cvt_float2_to_fp8x2(make_float2(lo, hi), __NV_SATFINITE, __NV_E4M3);
  const uint32_t lo_bits = float_bits(lo), hi_bits = float_bits(hi);
  if ((lo_bits & 0x7fffffffu) > 0x7f800000u) codes = (codes & 0xff00u) | ((lo_bits >> 24) & 0x80u) | 0x7fu;
  if ((hi_bits & 0x7fffffffu) > 0x7f800000u) codes = (codes & 0x00ffu) | (((hi_bits >> 24) & 0x80u) | 0x7fu) << 8;
  return codes & 0xffffu;
}

// Eight floats → eight fp8 e4m3 codes as the hardware converts them (fp8x2_e4m3_encode_hw),
// little-endian (v[0] in the lowest byte).
__device__ __forceinline__ uint2 fp8x8_e4m3_encode_hw(const float v[8]) {
  return make_uint2(fp8x2_e4m3_encode_hw(v[0], v[1]) | (fp8x2_e4m3_encode_hw(v[2], v[3]) << 16),
                    fp8x2_e4m3_encode_hw(v[4], v[5]) | (fp8x2_e4m3_encode_hw(v[6], v[7]) << 16));
}

// Nonzero iff one of the eight codes in `c` (fp8x8_e4m3_encode_hw's) is a NaN's: bits 0-6 of a
// byte all set, so adding 1 to them carries into its bit 7 (and no further: they are at most
// 0x7f, so bytes never carry into each other). Callers OR the results of several groups and test
// once.
__device__ __forceinline__ uint32_t fp8x8_nan_code_bits(const uint2& c) {
  constexpr uint32_t kLow7 = 0x7f7f7f7fu, kOnes = 0x01010101u, kHigh = 0x80808080u;
  return (((c.x & kLow7) + kOnes) | ((c.y & kLow7) + kOnes)) & kHigh;
}

// fp8x2_e4m3_encode's codes from fp8x8_e4m3_encode_hw's codes of v: a NaN's byte becomes its
// sign | 0x7f (the hardware gives the positive NaN code); every other byte is already the same.
// Quantizers test the hardware codes first (fp8x8_nan_code_bits: ~1 instruction per value) and
// call this only for groups that hold a NaN: tested value by value, the fix costs ~6 instructions
// per value, more than the conversion.
__device__ __forceinline__ uint2 fp8x8_restore_nan_signs(const uint2& codes, const float v[8]) {
  uint32_t w[2] = {codes.x, codes.y};
#pragma unroll
  for (int i = 0; i < 8; ++i) {
    const uint32_t bits = float_bits(v[i]);
    if ((bits & 0x7fffffffu) <= 0x7f800000u) continue;
    const int shift = 8 * (i % 4);
    w[i / 4] = (w[i / 4] & ~(0xffu << shift)) | ((((bits >> 24) & 0x80u) | 0x7fu) << shift);
  }
  return make_uint2(w[0], w[1]);
}

// Eight floats → eight fp8 e4m3 codes, little-endian (v[0] in the lowest byte): fp8x2_e4m3_encode's
// bytes, the NaN test done once on the hardware codes.
__device__ __forceinline__ uint2 fp8x8_e4m3_encode(const float v[8]) {
  const uint2 codes = fp8x8_e4m3_encode_hw(v);
  return fp8x8_nan_code_bits(codes) ? fp8x8_restore_nan_signs(codes, v) : codes;
}

}  // namespace dsv4::cuda

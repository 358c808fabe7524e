// Element types and bit-exact scalar conversions.
//
// All conversions are pure bit manipulation (no dependence on the floating-point environment), so
// the CPU reference and CUDA kernels produce identical bytes. They are usable from device code
// (DSV4_HD) so kernels share the exact rounding rules of the reference.
//
//   bf16     : round-to-nearest-even, NaN kept (quiet).
//   fp16     : IEEE binary16, round-to-nearest-even, overflow -> inf, NaN kept.
//   fp8 e4m3fn: 1-4-3, bias 7, no infinities; round-to-nearest-even, |x| >= 448 (and inf)
//               saturates to +-448, NaN -> 0x7F/0xFF (NaN kept).
//   ue8m0    : unsigned power-of-two scale, value 2^(byte-127); byte 0xFF is NaN.
#pragma once

#include <cstddef>
#include <cstdint>
#include <cstring>
#include <string_view>

#if defined(__CUDACC__)
#define DSV4_HD __host__ __device__ __forceinline__
#else
#define DSV4_HD inline
#endif

namespace dsv4 {

enum class DType : uint8_t { bf16, fp16, fp32, fp8_e4m3, ue8m0, int32, int64, uint8 };

constexpr size_t dtype_size(DType t) {
  switch (t) {
    case DType::bf16:
    case DType::fp16: return 2;
    case DType::fp32:
    case DType::int32: return 4;
    case DType::int64: return 8;
    case DType::fp8_e4m3:
    case DType::ue8m0:
    case DType::uint8: return 1;
  }
  return 0;
}

constexpr std::string_view dtype_name(DType t) {
  switch (t) {
    case DType::bf16: return "bf16";
    case DType::fp16: return "fp16";
    case DType::fp32: return "fp32";
    case DType::fp8_e4m3: return "fp8_e4m3";
    case DType::ue8m0: return "ue8m0";
    case DType::int32: return "int32";
    case DType::int64: return "int64";
    case DType::uint8: return "uint8";
  }
  return "?";
}

// Largest finite fp8 e4m3fn magnitude.
inline constexpr float kFp8Max = 448.0f;

DSV4_HD uint32_t float_bits(float f) {
#if defined(__CUDA_ARCH__)
  return __float_as_uint(f);
#else
  uint32_t u;
  std::memcpy(&u, &f, 4);
  return u;
#endif
}

DSV4_HD float bits_float(uint32_t u) {
#if defined(__CUDA_ARCH__)
  return __uint_as_float(u);
#else
  float f;
  std::memcpy(&f, &u, 4);
  return f;
#endif
}

// ---- exactly rounded fp32 arithmetic -------------------------------------------------------
// IEEE-754 fp32 add / sub / mul / div / sqrt, round-to-nearest-even, subnormals kept, with the
// same result on the host and in device code. The kernels are built with --use_fast_math
// (approximate division and square root, flush-to-zero, multiply-add contraction), so plain
// operators can round differently on the GPU; math that must match the CPU reference bit for bit
// uses these (explicit non-ftz PTX on the device; plain operators on the host, whose build
// targets baseline x86-64: no FMA contraction, no FTZ/DAZ).
DSV4_HD float ieee_add(float a, float b) {
#if defined(__CUDA_ARCH__)
  float r;
  asm("add.rn.f32 %0, %1, %2;" : "=f"(r) : "f"(a), "f"(b));
  return r;
#else
  return a + b;
#endif
}
DSV4_HD float ieee_sub(float a, float b) {
#if defined(__CUDA_ARCH__)
  float r;
  asm("sub.rn.f32 %0, %1, %2;" : "=f"(r) : "f"(a), "f"(b));
  return r;
#else
  return a - b;
#endif
}
DSV4_HD float ieee_mul(float a, float b) {
#if defined(__CUDA_ARCH__)
  float r;
  asm("mul.rn.f32 %0, %1, %2;" : "=f"(r) : "f"(a), "f"(b));
  return r;
#else
  return a * b;
#endif
}
DSV4_HD float ieee_div(float a, float b) {
#if defined(__CUDA_ARCH__)
  float r;
  asm("div.rn.f32 %0, %1, %2;" : "=f"(r) : "f"(a), "f"(b));
  return r;
#else
  return a / b;
#endif
}
DSV4_HD float ieee_sqrt(float a) {
#if defined(__CUDA_ARCH__)
  float r;
  asm("sqrt.rn.f32 %0, %1;" : "=f"(r) : "f"(a));
  return r;
#else
  return __builtin_sqrtf(a);
#endif
}

// ---- bf16 ----------------------------------------------------------------------------------
DSV4_HD uint16_t float_to_bf16_bits(float f) {
  uint32_t u = float_bits(f);
  if ((u & 0x7fffffffu) > 0x7f800000u) return static_cast<uint16_t>((u >> 16) | 0x0040u);  // NaN
  u += 0x7fffu + ((u >> 16) & 1u);
  return static_cast<uint16_t>(u >> 16);
}
DSV4_HD float bf16_bits_to_float(uint16_t b) { return bits_float(static_cast<uint32_t>(b) << 16); }
// Rounds a float to the nearest bf16 value (as float).
DSV4_HD float round_bf16(float f) { return bf16_bits_to_float(float_to_bf16_bits(f)); }

// ---- fp16 ----------------------------------------------------------------------------------
DSV4_HD uint16_t float_to_fp16_bits(float f) {
  const uint32_t u = float_bits(f);
  const uint32_t sign = (u >> 16) & 0x8000u;
  const uint32_t a = u & 0x7fffffffu;
  if (a > 0x7f800000u) return static_cast<uint16_t>(sign | 0x7e00u);  // NaN
  if (a >= 0x477ff000u) return static_cast<uint16_t>(sign | 0x7c00u);  // rounds to >= 65536: inf
  const int32_t e = static_cast<int32_t>(a >> 23) - 127;
  if (e < -14) {
    // Subnormal half: quantum 2^-24. a * 2^24 is exact in float for these magnitudes.
    const float v = bits_float(a) * 16777216.0f;
    uint32_t q = static_cast<uint32_t>(v);
    const float frac = v - static_cast<float>(q);
    if (frac > 0.5f || (frac == 0.5f && (q & 1u))) ++q;
    return static_cast<uint16_t>(sign | q);
  }
  const uint32_t mant = a & 0x7fffffu;
  uint32_t code = (static_cast<uint32_t>(e + 15) << 10) | (mant >> 13);
  const uint32_t rest = mant & 0x1fffu;
  if (rest > 0x1000u || (rest == 0x1000u && (code & 1u))) ++code;
  return static_cast<uint16_t>(sign | code);
}
DSV4_HD float fp16_bits_to_float(uint16_t h) {
  const uint32_t sign = static_cast<uint32_t>(h & 0x8000u) << 16;
  const uint32_t e = (h >> 10) & 0x1fu;
  const uint32_t m = h & 0x3ffu;
  if (e == 0) {
    const float v = static_cast<float>(m) * (1.0f / 16777216.0f);
    return bits_float(float_bits(v) | sign);
  }
  if (e == 31) return bits_float(sign | 0x7f800000u | (m << 13) | (m ? 0x400000u : 0u));
  return bits_float(sign | ((e - 15 + 127) << 23) | (m << 13));
}

// ---- fp8 e4m3fn ----------------------------------------------------------------------------
DSV4_HD uint8_t float_to_fp8_e4m3(float f) {
  const uint32_t u = float_bits(f);
  const uint8_t sign = static_cast<uint8_t>((u >> 24) & 0x80u);
  const uint32_t a = u & 0x7fffffffu;
  if (a > 0x7f800000u) return static_cast<uint8_t>(sign | 0x7fu);  // NaN kept
  if (a >= 0x43e00000u) return static_cast<uint8_t>(sign | 0x7eu);  // >= 448 (and inf): saturate
  const int32_t e = static_cast<int32_t>(a >> 23) - 127;
  if (e < -6) {
    // fp8 subnormal range (and zero): quantum 2^-9; q == 8 is exactly the smallest normal 0x08.
    const float v = bits_float(a) * 512.0f;
    uint32_t q = static_cast<uint32_t>(v);
    const float frac = v - static_cast<float>(q);
    if (frac > 0.5f || (frac == 0.5f && (q & 1u))) ++q;
    return static_cast<uint8_t>(sign | q);
  }
  const uint32_t mant = a & 0x7fffffu;
  uint32_t code = (static_cast<uint32_t>(e + 7) << 3) | (mant >> 20);
  const uint32_t rest = mant & 0xfffffu;
  if (rest > 0x80000u || (rest == 0x80000u && (code & 1u))) ++code;  // carry may bump exponent
  if (code > 0x7eu) code = 0x7eu;
  return static_cast<uint8_t>(sign | code);
}

DSV4_HD float fp8_e4m3_to_float(uint8_t b) {
  const uint32_t sign = static_cast<uint32_t>(b & 0x80u) << 24;
  const uint32_t e = (b >> 3) & 0xfu;
  const uint32_t m = b & 0x7u;
  if (e == 15 && m == 7) return bits_float(sign | 0x7fc00000u);
  if (e == 0) {
    const float v = static_cast<float>(m) * (1.0f / 512.0f);
    return bits_float(float_bits(v) | sign);
  }
  return bits_float(sign | ((e - 7 + 127) << 23) | (m << 20));
}

// ---- ue8m0 scales --------------------------------------------------------------------------
DSV4_HD float ue8m0_to_float(uint8_t b) {
  if (b == 0xffu) return bits_float(0x7fc00000u);
  if (b == 0) return bits_float(0x00400000u);  // 2^-127 (float subnormal)
  return bits_float(static_cast<uint32_t>(b) << 23);
}

// Exponent k of the power-of-two scale 2^k = 2^ceil(log2(max(amax / 448, 1e-4))) (docs/spec.md §7),
// computed exactly from the float's bits (no log2 rounding; the division is IEEE-rounded on the
// device too, so a kernel picks the same scale as the CPU at power-of-two boundaries).
DSV4_HD int32_t ue8m0_exponent_for_amax(float amax, float fmt_max = kFp8Max) {
  // (`/` under --use_fast_math is approximate: a quotient of amax = 448·2^j could land just above
  // 2^j and bump the scale.)
  float x = ieee_div(amax, fmt_max);
  if (!(x >= 1e-4f)) x = 1e-4f;  // also maps NaN to the floor scale
  const uint32_t u = float_bits(x);
  const int32_t e = static_cast<int32_t>(u >> 23) - 127;  // x is a normal float here
  return (u & 0x7fffffu) ? e + 1 : e;
}
// The UE8M0 byte (exponent + 127) for a block with absolute maximum amax.
DSV4_HD uint8_t ue8m0_for_amax(float amax, float fmt_max = kFp8Max) {
  return static_cast<uint8_t>(ue8m0_exponent_for_amax(amax, fmt_max) + 127);
}
// 2^k as a float for -126 <= k <= 127.
DSV4_HD float exp2_int(int32_t k) { return bits_float(static_cast<uint32_t>(k + 127) << 23); }

}  // namespace dsv4

// dtype conversions: fp8 e4m3fn, bf16, fp16, ue8m0 — against formulas written here independently.
#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>
#include <limits>
#include <random>

#include "dsv4/dtype.h"

namespace {

// Independent fp8 e4m3fn decode: (-1)^s * 2^(e-7) * (1 + m/8), subnormal 2^-6 * m/8.
double fp8_reference(int b) {
  const int s = (b >> 7) & 1, e = (b >> 3) & 15, m = b & 7;
  if (e == 15 && m == 7) return std::numeric_limits<double>::quiet_NaN();
  const double mag = e == 0 ? std::ldexp(m / 8.0, -6) : std::ldexp(1.0 + m / 8.0, e - 7);
  return s ? -mag : mag;
}

TEST(Fp8, All256PatternsDecode) {
  for (int b = 0; b < 256; ++b) {
    const double want = fp8_reference(b);
    const float got = dsv4::fp8_e4m3_to_float(static_cast<uint8_t>(b));
    if (std::isnan(want)) {
      EXPECT_TRUE(std::isnan(got)) << "byte " << b;
    } else {
      EXPECT_EQ(static_cast<double>(got), want) << "byte " << b;
      // Every finite pattern round-trips (−0 included).
      EXPECT_EQ(dsv4::float_to_fp8_e4m3(got), b) << "byte " << b;
    }
  }
}

TEST(Fp8, HandComputedEncodings) {
  struct Case { float x; uint8_t byte; };
  const Case cases[] = {
      {0.0f, 0x00}, {-0.0f, 0x80}, {1.0f, 0x38}, {-1.0f, 0xB8}, {448.0f, 0x7E}, {-448.0f, 0xFE},
      {500.0f, 0x7E},                 // saturates
      {1e30f, 0x7E}, {-1e30f, 0xFE},  // saturates
      {INFINITY, 0x7E}, {-INFINITY, 0xFE},
      {1.0625f, 0x38},   // 1 + 1/16: tie between 1.0 (even) and 1.125 → 1.0
      {1.1875f, 0x3A},   // 1 + 3/16: tie between 1.125 (odd) and 1.25 (even) → 1.25
      {1.07f, 0x39},     // above the tie → 1.125
      {0.001953125f, 0x01},   // 2^-9, smallest subnormal
      {0.0009765625f, 0x00},  // 2^-10: tie between 0 (even) and 2^-9 → 0
      {0.0029296875f, 0x02},  // 1.5 * 2^-9: tie between 1 and 2 quanta → 2 (even)
      {0.015625f, 0x08},      // 2^-6, smallest normal
      {0.0146484375f, 0x08},  // 7.5 * 2^-9: tie between subnormal 7 and normal 8 → 8 (even)
      {240.0f, 0x77}, {416.0f, 0x7D}, {432.0f, 0x7E},  // 432: tie 416/448 → 448 (even mantissa)
      {3.0f, 0x44}, {-0.3f, 0xAA},  // 3 = 2^1 * 1.5; 0.3 → 0.3125 = 2^-2 * 1.25
  };
  for (const auto& c : cases)
    EXPECT_EQ(dsv4::float_to_fp8_e4m3(c.x), c.byte) << "x = " << c.x;
  EXPECT_EQ(dsv4::float_to_fp8_e4m3(NAN) & 0x7F, 0x7F);
  EXPECT_EQ(dsv4::float_to_fp8_e4m3(-NAN), 0xFF);
}

TEST(Fp8, RandomRoundTripIsNearest) {
  std::mt19937 rng(1234);
  std::uniform_real_distribution<float> mag(-12.0f, 9.5f);
  for (int i = 0; i < 200000; ++i) {
    const float x = (rng() & 1 ? -1.0f : 1.0f) * std::exp2(mag(rng));
    const float q = dsv4::fp8_e4m3_to_float(dsv4::float_to_fp8_e4m3(x));
    // Brute force the nearest representable value (ties: even mantissa).
    double best = 0;
    double best_err = INFINITY;
    int best_b = 0;
    for (int b = 0; b < 256; ++b) {
      const double v = fp8_reference(b);
      if (std::isnan(v)) continue;
      const double err = std::fabs(v - static_cast<double>(std::clamp(x, -448.0f, 448.0f)));
      if (err < best_err || (err == best_err && (b & 1) == 0 && (best_b & 1) == 1)) {
        best = v; best_err = err; best_b = b;
      }
    }
    ASSERT_EQ(static_cast<double>(q), best) << "x = " << x;
  }
}

TEST(Bf16, RoundNearestEven) {
  EXPECT_EQ(dsv4::float_to_bf16_bits(1.0f), 0x3F80);
  // 1 + 2^-8 is a tie between 1.0 (even) and 1 + 2^-7 → 1.0.
  EXPECT_EQ(dsv4::float_to_bf16_bits(1.00390625f), 0x3F80);
  // 1 + 3*2^-8 is a tie between 1+2^-7 (odd) and 1+2^-6 (even) → 1+2^-6.
  EXPECT_EQ(dsv4::float_to_bf16_bits(1.01171875f), 0x3F82);
  EXPECT_EQ(dsv4::float_to_bf16_bits(-2.0f), 0xC000);
  EXPECT_TRUE(std::isnan(dsv4::bf16_bits_to_float(dsv4::float_to_bf16_bits(NAN))));
  EXPECT_EQ(dsv4::float_to_bf16_bits(INFINITY), 0x7F80);
  for (int b = 0; b < 65536; b += 7) {
    const float f = dsv4::bf16_bits_to_float(static_cast<uint16_t>(b));
    if (!std::isnan(f)) {
      EXPECT_EQ(dsv4::float_to_bf16_bits(f), b);
    }
  }
}

TEST(Fp16, RoundTripAndEdges) {
  for (int b = 0; b < 65536; ++b) {
    const float f = dsv4::fp16_bits_to_float(static_cast<uint16_t>(b));
    if (std::isnan(f)) {
      EXPECT_TRUE(std::isnan(dsv4::fp16_bits_to_float(dsv4::float_to_fp16_bits(f))));
    } else {
      ASSERT_EQ(dsv4::float_to_fp16_bits(f), b) << b;
    }
  }
  EXPECT_EQ(dsv4::float_to_fp16_bits(65504.0f), 0x7BFF);
  EXPECT_EQ(dsv4::float_to_fp16_bits(65520.0f), 0x7C00);  // rounds up to inf
  EXPECT_EQ(dsv4::float_to_fp16_bits(std::ldexp(1.0f, -25)), 0x0000);  // tie → even (0)
  EXPECT_EQ(dsv4::float_to_fp16_bits(std::ldexp(3.0f, -25)), 0x0002);  // tie 1|2 → 2
}

TEST(Ue8m0, HandComputedScales) {
  struct Case { float amax; int exponent; };
  const Case cases[] = {
      {448.0f, 0},          // amax/448 = 1 exactly → 2^0
      {449.0f, 1},          // just above → 2^1
      {224.0f, -1},         // 0.5 → 2^-1
      {300.0f, 0},          // 0.67 → ceil(log2) = 0
      {0.0f, -13},          // clamp 1e-4 → ceil(log2(1e-4)) = ceil(-13.29) = -13
      {0.01f, -13},         // 0.01/448 = 2.2e-5 < 1e-4 → -13
      {448.0f * 1024.0f, 10},
      {1.0f, -8},           // 1/448 = 0.00223 → log2 = -8.8 → -8
  };
  for (const auto& c : cases) {
    EXPECT_EQ(dsv4::ue8m0_exponent_for_amax(c.amax), c.exponent) << "amax " << c.amax;
    EXPECT_EQ(dsv4::ue8m0_for_amax(c.amax), c.exponent + 127);
    EXPECT_EQ(dsv4::ue8m0_to_float(static_cast<uint8_t>(c.exponent + 127)),
              std::ldexp(1.0f, c.exponent));
  }
  EXPECT_TRUE(std::isnan(dsv4::ue8m0_to_float(0xFF)));
  EXPECT_EQ(dsv4::ue8m0_to_float(127), 1.0f);
}

// Block quantization error bound: |x - fp8(x/s)*s| <= half-ulp(fp8 at x/s) * s, and amax/s <= 448.
TEST(Fp8, BlockQuantErrorBound) {
  std::mt19937 rng(7);
  std::normal_distribution<float> n(0.0f, 1.0f);
  for (int trial = 0; trial < 500; ++trial) {
    const float spread = std::exp2(static_cast<float>(trial % 40) - 20.0f);
    float x[64];
    float amax = 0;
    for (float& v : x) { v = n(rng) * spread; amax = std::max(amax, std::fabs(v)); }
    const int k = dsv4::ue8m0_exponent_for_amax(amax);
    const double s = std::ldexp(1.0, k);
    ASSERT_LE(amax / s, 448.0);
    for (float v : x) {
      const double y = v / s;
      const double q = dsv4::fp8_e4m3_to_float(dsv4::float_to_fp8_e4m3(static_cast<float>(y)));
      const double a = std::fabs(y);
      const int e = a < std::ldexp(1.0, -6) ? -6 : static_cast<int>(std::floor(std::log2(a)));
      const double half_ulp = std::ldexp(1.0, e - 3) / 2;
      ASSERT_LE(std::fabs(q - y), half_ulp * (1 + 1e-12)) << v;
    }
  }
}

}  // namespace

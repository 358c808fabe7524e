// Test support for the dense CPU ops: random data, poisoning, byte snapshots, and float64
// oracles for the number formats (fp8 e4m3 rounding, UE8M0 scale rule, bf16 decode) written from
// their definitions (docs/spec.md §7, OCP FP8), independently of include/dsv4/dtype.h.
#pragma once

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <functional>
#include <limits>
#include <random>
#include <string>
#include <vector>

#include "dsv4/status.h"
#include "dsv4/tensor.h"

namespace dense_test {

using dsv4::DType;
using dsv4::HostTensor;
using dsv4::TensorView;

// ---- number-format oracles -----------------------------------------------------------------
// Value of the fp8 e4m3fn byte b: (-1)^s 2^(e-7) (1 + m/8), subnormal 2^-6 · m/8; 0x7F/0xFF NaN.
inline double fp8_value(int b) {
  const int s = (b >> 7) & 1, e = (b >> 3) & 15, m = b & 7;
  if (e == 15 && m == 7) return std::numeric_limits<double>::quiet_NaN();
  const double mag = e == 0 ? std::ldexp(m / 8.0, -6) : std::ldexp(1.0 + m / 8.0, e - 7);
  return s ? -mag : mag;
}

// The fp8 e4m3fn byte nearest to v (ties to the even code), saturating to ±448. Codes 0..0x7E
// are the non-negative finite values in increasing order.
inline int fp8_encode(double v) {
  static const std::vector<double> magnitudes = [] {
    std::vector<double> m;
    for (int code = 0; code <= 0x7E; ++code) m.push_back(fp8_value(code));
    return m;
  }();
  const int sign = std::signbit(v) ? 0x80 : 0;
  const double a = std::fabs(v);
  if (a >= 448.0) return sign | 0x7E;
  const int hi = static_cast<int>(std::upper_bound(magnitudes.begin(), magnitudes.end(), a) -
                                  magnitudes.begin());  // first code above a (1..0x7E)
  const int lo = hi - 1;
  const double err_lo = a - magnitudes[lo], err_hi = magnitudes[hi] - a;
  const int code = err_lo < err_hi ? lo : err_hi < err_lo ? hi : (lo % 2 == 0 ? lo : hi);
  return sign | code;
}
inline double fp8_round(double v) { return fp8_value(fp8_encode(v)); }

// docs/spec.md §7: the UE8M0 scale exponent k, scale = 2^ceil(log2(max(amax / 448, 1e-4))).
inline int ue8m0_exponent(double amax) {
  return static_cast<int>(std::ceil(std::log2(std::max(amax / 448.0, 1e-4))));
}

inline double bf16_value(uint16_t bits) {
  const uint32_t u = static_cast<uint32_t>(bits) << 16;
  float f;
  std::memcpy(&f, &u, 4);
  return f;
}

// ---- tensors --------------------------------------------------------------------------------
// Element i of a float-like host tensor as double.
inline double at(const HostTensor& t, int64_t i) { return t.get(i); }
inline std::vector<double> to_doubles(const HostTensor& t) {
  std::vector<double> v(static_cast<size_t>(t.numel()));
  for (int64_t i = 0; i < t.numel(); ++i) v[static_cast<size_t>(i)] = t.get(i);
  return v;
}

// Uniform values in ±[lo, hi) (never zero), stored in t's dtype (so t holds exactly what the
// test reads back with at()).
inline void fill_random(HostTensor& t, uint64_t seed, double lo = 0.05, double hi = 1.0) {
  std::mt19937_64 rng(seed);
  std::uniform_real_distribution<double> mag(lo, hi);
  std::bernoulli_distribution neg(0.5);
  for (int64_t i = 0; i < t.numel(); ++i) {
    const double v = mag(rng);
    t.set(i, static_cast<float>(neg(rng) ? -v : v));
  }
}
inline HostTensor random_tensor(DType dt, std::vector<int64_t> dims, uint64_t seed,
                                double lo = 0.05, double hi = 1.0) {
  HostTensor t(dt, std::move(dims));
  fill_random(t, seed, lo, hi);
  return t;
}

// Poison: every byte 0xFF (NaN for bf16/fp32/fp8/ue8m0), so unwritten outputs show.
inline HostTensor poisoned(DType dt, std::vector<int64_t> dims) {
  HostTensor t(dt, std::move(dims));
  t.fill_bytes(0xFF);
  return t;
}

inline std::vector<uint8_t> bytes_of(const HostTensor& t) {
  const uint8_t* p = t.data<uint8_t>();
  return std::vector<uint8_t>(p, p + t.nbytes());
}

// Runs fn, expects dsv4::Error whose message contains every one of `parts`.
inline void expect_error(const std::function<void()>& fn, std::vector<std::string> parts) {
  try {
    fn();
    ADD_FAILURE() << "expected dsv4::Error containing '" << parts.front() << "'";
  } catch (const dsv4::Error& e) {
    for (const std::string& p : parts)
      EXPECT_NE(std::string(e.what()).find(p), std::string::npos)
          << "message '" << e.what() << "' lacks '" << p << "'";
  }
}

// A view that claims to live on the GPU (for dispatch tests; never dereferenced).
inline TensorView on_cuda(TensorView v) {
  v.device = dsv4::Device::cuda;
  return v;
}

}  // namespace dense_test

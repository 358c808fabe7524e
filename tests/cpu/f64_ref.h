// Small float64 building blocks for the compressor / indexer tests, written independently of the
// library code (straight from SPEC §3–§5): random data, GPT-J RoPE, the Hadamard matrix, and the
// UE8M0 FP8 block quantizer.
#pragma once

#include <bit>
#include <cmath>
#include <cstdint>
#include <random>
#include <vector>

#include "dsv4/dtype.h"

namespace dsv4::test {

// Uniform values in ±[lo, hi] (never zero, so unwritten or dropped terms show).
struct Rng {
  std::mt19937_64 gen;
  explicit Rng(uint64_t seed) : gen(seed) {}
  double uniform(double lo, double hi) { return std::uniform_real_distribution<double>(lo, hi)(gen); }
  double nonzero(double lo = 0.1, double hi = 1.0) {
    const double m = uniform(lo, hi);
    return (gen() & 1) ? m : -m;
  }
  int64_t integer(int64_t lo, int64_t hi) { return std::uniform_int_distribution<int64_t>(lo, hi)(gen); }
  std::vector<float> floats(size_t n, double lo = 0.1, double hi = 1.0) {
    std::vector<float> v(n);
    for (float& f : v) f = static_cast<float>(nonzero(lo, hi));
    return v;
  }
};

// GPT-J interleaved RoPE (no YaRN) on the last `rope_dims` of v at position p.
inline void rope_f64(double* v, int dim, int rope_dims, double theta, int64_t p) {
  const int nope = dim - rope_dims;
  for (int i = 0; i < rope_dims / 2; ++i) {
    const double f = std::pow(theta, -2.0 * i / rope_dims);
    const double c = std::cos(static_cast<double>(p) * f), s = std::sin(static_cast<double>(p) * f);
    const double a = v[nope + 2 * i], b = v[nope + 2 * i + 1];
    v[nope + 2 * i] = a * c - b * s;
    v[nope + 2 * i + 1] = a * s + b * c;
  }
}

// v ← H v / sqrt(n), H(i, k) = (−1)^popcount(i & k) (Sylvester), as an explicit matrix product.
inline std::vector<double> hadamard_f64(const std::vector<double>& v) {
  const size_t n = v.size();
  std::vector<double> out(n, 0.0);
  for (size_t i = 0; i < n; ++i) {
    double acc = 0.0;
    for (size_t k = 0; k < n; ++k)
      acc += (std::popcount(static_cast<unsigned>(i & k)) % 2 ? -1.0 : 1.0) * v[k];
    out[i] = acc / std::sqrt(static_cast<double>(n));
  }
  return out;
}

// UE8M0 scale of a block (SPEC §7): 2^ceil(log2(max(amax / 448, 1e-4))).
inline double ue8m0_scale_f64(double amax) {
  return std::exp2(std::ceil(std::log2(std::max(amax / 448.0, 1e-4))));
}

// The value an FP8 (e4m3, per-block UE8M0 scale) round trip of v[0..n) gives back, in place.
inline void fp8_round_f64(float* v, int n) {
  double amax = 0.0;
  for (int i = 0; i < n; ++i) amax = std::max(amax, std::fabs(static_cast<double>(v[i])));
  const double scale = ue8m0_scale_f64(amax);
  for (int i = 0; i < n; ++i)
    v[i] = static_cast<float>(fp8_e4m3_to_float(float_to_fp8_e4m3(static_cast<float>(v[i] / scale))) * scale);
}

}  // namespace dsv4::test

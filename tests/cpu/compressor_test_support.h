// Test support for the compressor / indexer tests: float64 pieces written from docs/spec.md §3–§5 on top
// of the dense tests' independent oracles (fp8 e4m3 / UE8M0 in dense_test_support.h, RoPE
// frequencies with YaRN in rope_reference.h): a seeded random source, RoPE of one vector, the
// Hadamard matrix, and the FP8 block round trip.
#pragma once

#include <bit>
#include <cmath>
#include <cstdint>
#include <random>
#include <vector>

#include "dense_test_support.h"
#include "dsv4/config.h"
#include "rope_reference.h"

namespace dsv4::test {

// Uniform values in ±[lo, hi] (never zero, so unwritten or dropped terms show).
struct Rng {
  std::mt19937_64 gen;
  explicit Rng(uint64_t seed) : gen(seed) {}
  double uniform(double lo, double hi) {
    return std::uniform_real_distribution<double>(lo, hi)(gen);
  }
  double nonzero(double lo = 0.1, double hi = 1.0) {
    const double m = uniform(lo, hi);
    return (gen() & 1) ? m : -m;
  }
  int64_t integer(int64_t lo, int64_t hi) {
    return std::uniform_int_distribution<int64_t>(lo, hi)(gen);
  }
  std::vector<float> floats(size_t n, double lo = 0.1, double hi = 1.0) {
    std::vector<float> v(n);
    for (float& f : v) f = static_cast<float>(nonzero(lo, hi));
    return v;
  }
};

// RoPE (docs/spec.md §3, the frequencies of `rope`) on the last rope.rope_dims of v[0..dim) at position p.
inline void rope_f64(double* v, int dim, const RopeConfig& rope, int64_t p) {
  const std::vector<double> f = dense_test::reference_rope_freqs(rope);
  double* pairs = v + (dim - rope.rope_dims);
  for (size_t i = 0; i < f.size(); ++i)
    dense_test::reference_rotate(pairs[2 * i], pairs[2 * i + 1], static_cast<double>(p) * f[i],
                                 pairs[2 * i], pairs[2 * i + 1]);
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

// UE8M0 scale of a block with absolute maximum amax (docs/spec.md §7), as a value.
inline double ue8m0_scale_f64(double amax) {
  return std::ldexp(1.0, dense_test::ue8m0_exponent(amax));
}

// The values an FP8 block (e4m3 codes, one UE8M0 scale) hands back for v[0..n), in place.
inline void fp8_round_block_f64(float* v, int n) {
  double amax = 0.0;
  for (int i = 0; i < n; ++i) amax = std::max(amax, std::fabs(double{v[i]}));
  const double scale = ue8m0_scale_f64(amax);
  for (int i = 0; i < n; ++i)
    v[i] = static_cast<float>(dense_test::fp8_round(v[i] / scale) * scale);
}

}  // namespace dsv4::test

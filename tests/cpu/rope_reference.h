// Float64 RoPE reference for the tests, written from docs/spec.md §3: GPT-J pairs (2i, 2i+1) of the last
// R dims rotate by p·f_i, f_i = theta^(-2i/R), with the YaRN blend when enabled.
#pragma once

#include <algorithm>
#include <cmath>
#include <numbers>
#include <vector>

#include "dsv4/config.h"

namespace dense_test {

inline std::vector<double> reference_rope_freqs(const dsv4::RopeConfig& c) {
  const int R = c.rope_dims;
  std::vector<double> f(static_cast<size_t>(R / 2));
  for (int i = 0; i < R / 2; ++i) f[i] = std::pow(c.theta, -2.0 * i / R);
  if (!c.yarn) return f;
  auto corr = [&](double n) {
    return R * std::log(static_cast<double>(c.original_seq_len) / (n * 2 * std::numbers::pi)) /
           (2 * std::log(c.theta));
  };
  const double low = std::clamp(std::floor(corr(c.beta_fast)), 0.0, R - 1.0);
  double high = std::clamp(std::ceil(corr(c.beta_slow)), 0.0, R - 1.0);
  if (high == low) high += 0.001;
  for (int i = 0; i < R / 2; ++i) {
    const double ramp = std::clamp((i - low) / (high - low), 0.0, 1.0);
    f[i] = f[i] / c.factor * ramp + f[i] * (1 - ramp);
  }
  return f;
}

// The layer configs of docs/spec.md §1/§3: SWA layers (theta 1e4, no YaRN) and compressed layers
// (theta 160000, YaRN factor 16 over 65536, beta 32/1).
inline dsv4::RopeConfig swa_rope(int R = 64) {
  dsv4::RopeConfig c;
  c.theta = 10000.0;
  c.rope_dims = R;
  return c;
}
inline dsv4::RopeConfig yarn_rope(int R = 64) {
  dsv4::RopeConfig c;
  c.theta = 160000.0;
  c.rope_dims = R;
  c.yarn = true;
  c.factor = 16.0;
  c.original_seq_len = 65536;
  c.beta_fast = 32.0;
  c.beta_slow = 1.0;
  return c;
}

// Rotates pair (a, b) by angle sign·p·f in float64.
inline void reference_rotate(double a, double b, double angle, double& ya, double& yb) {
  ya = a * std::cos(angle) - b * std::sin(angle);
  yb = a * std::sin(angle) + b * std::cos(angle);
}

}  // namespace dense_test

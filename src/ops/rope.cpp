// RoPE (docs/spec.md §3): frequencies (plain and YaRN), the cos/sin table, and apply_rope (forward and
// inverse, GPT-J interleaved pairs on the last R dims): the host-side table and apply_rope's front
// door.
#include <algorithm>
#include <cmath>
#include <numbers>
#include <vector>

#include "dsv4/ops.h"
#include "ops/backend.h"
#include "ops/validate.h"

namespace dsv4 {

namespace {

void validate_rope_config(const char* where, const RopeConfig& cfg) {
  if (cfg.rope_dims < 2 || cfg.rope_dims % 2 != 0)
    fail_expected(where, "cfg.rope_dims", "an even value >= 2", cfg.rope_dims);
  if (!(cfg.theta > 1.0) || !std::isfinite(cfg.theta))
    fail_expected(where, "cfg.theta", "a finite value > 1", cfg.theta);
  if (!cfg.yarn) return;
  if (cfg.original_seq_len <= 0)
    fail_expected(where, "cfg.original_seq_len", "> 0 with YaRN", cfg.original_seq_len);
  if (!(cfg.factor > 0.0) || !std::isfinite(cfg.factor))
    fail_expected(where, "cfg.factor", "a finite value > 0 with YaRN", cfg.factor);
  if (!(cfg.beta_fast > 0.0)) fail_expected(where, "cfg.beta_fast", "> 0 with YaRN", cfg.beta_fast);
  if (!(cfg.beta_slow > 0.0)) fail_expected(where, "cfg.beta_slow", "> 0 with YaRN", cfg.beta_slow);
}

// The YaRN correction dimension: the rope dim whose wavelength fits `rotations` times into the
// original context.
double yarn_correction_dim(const RopeConfig& cfg, double rotations) {
  return cfg.rope_dims * std::log(static_cast<double>(cfg.original_seq_len) /
                                  (rotations * 2.0 * std::numbers::pi)) /
         (2.0 * std::log(cfg.theta));
}

}  // namespace

void rope_frequencies(const RopeConfig& cfg, double* freqs) {
  validate_rope_config("rope_frequencies", cfg);
  DSV4_CHECK(freqs != nullptr, "rope_frequencies: freqs: expected an array of rope_dims / 2, got null");
  const int R = cfg.rope_dims, half = R / 2;
  for (int i = 0; i < half; ++i) freqs[i] = std::pow(cfg.theta, -2.0 * i / R);
  if (!cfg.yarn) return;
  // Dims below `low` (fast rotations) keep their frequency, dims above `high` are slowed by
  // `factor`, with a linear ramp between; both ends clamped to [0, R-1] (docs/spec.md §3), and a
  // degenerate range widened by 0.001 as DeepSeek's reference does.
  const double low = std::clamp(std::floor(yarn_correction_dim(cfg, cfg.beta_fast)), 0.0, R - 1.0);
  double high = std::clamp(std::ceil(yarn_correction_dim(cfg, cfg.beta_slow)), 0.0, R - 1.0);
  if (high == low) high += 0.001;
  for (int i = 0; i < half; ++i) {
    const double ramp = std::clamp((i - low) / (high - low), 0.0, 1.0);
    freqs[i] = freqs[i] / cfg.factor * ramp + freqs[i] * (1.0 - ramp);
  }
}

HostTensor build_rope_cache(const RopeConfig& cfg, int64_t max_pos) {
  validate_rope_config("build_rope_cache", cfg);
  if (max_pos < 1) fail_expected("build_rope_cache", "max_pos", ">= 1", max_pos);
  const int64_t half = cfg.rope_dims / 2;
  std::vector<double> freqs(static_cast<size_t>(half));
  rope_frequencies(cfg, freqs.data());
  HostTensor table(DType::fp32, {max_pos, 2 * half});
  float* out = table.data<float>();
  // Angles in double so large positions keep full fp32 accuracy in cos/sin.
#pragma omp parallel for schedule(static)
  for (int64_t p = 0; p < max_pos; ++p) {
    for (int64_t i = 0; i < half; ++i) {
      const double angle = static_cast<double>(p) * freqs[i];
      out[p * 2 * half + i] = static_cast<float>(std::cos(angle));
      out[p * 2 * half + half + i] = static_cast<float>(std::sin(angle));
    }
  }
  return table;
}

void apply_rope(const TensorView& x, const TensorView& positions, const TensorView& cos_sin,
                bool inverse, const TensorView& y, Stream stream) {
  constexpr const char* kOp = "apply_rope";
  check_defined(kOp, "x", x);
  check_defined(kOp, "y", y);
  ops::check_dtype_in(kOp, "x", x, {DType::bf16, DType::fp32});
  ops::check_dtype_in(kOp, "y", y, {DType::bf16, DType::fp32});
  if (x.ndim != 2 && x.ndim != 3)
    fail_expected(kOp, "x.ndim", "2 ([T, D]) or 3 ([T, H, D])", x.ndim);
  check_ndim(kOp, "y", y, x.ndim);
  for (int d = 0; d < x.ndim; ++d) check_dim(kOp, "y", y, d, x.shape[d]);
  ops::check_row_strided(kOp, "x", x);
  ops::check_output_layout(kOp, "y", y);
  ops::check_alias_exact_or_disjoint(kOp, "y", y, "x", x);
  const int64_t T = x.shape[0], D = x.shape[x.ndim - 1];
  ops::check_index_vector(kOp, "positions", positions, T);
  ops::check_rope_table(kOp, cos_sin, D);
  // Rows of y are written while positions and the table are still being read.
  ops::check_outputs_disjoint(kOp, {{"y", y}}, {{"positions", positions}, {"cos_sin", cos_sin}});
  const Device device = ops::common_device(
      kOp, {{"x", x}, {"positions", positions}, {"cos_sin", cos_sin}, {"y", y}});
  // Position values are checked by the CPU kernel; on CUDA they live on the device and the kernel
  // leaves rows with an invalid one unwritten.
  ops::kernel(kOp, ops::kApplyRope, device)(x, positions, cos_sin, inverse, y, stream);
}

}  // namespace dsv4

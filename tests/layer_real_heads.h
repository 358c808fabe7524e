// Layer checks at the released models' head counts (issue 17 item 5), shared by the CPU suite
// (tests/cpu/test_attention_layer_real_heads.cpp) and the GPU suite
// (tests/cuda/test_attention_layer_real_heads_cuda.cpp): V4-Flash (64 heads, dim 4096) and
// V4-Pro (128 heads, dim 7168), one layer of each kind, with random FP8 weights as released, a
// few tokens of one request in one prefill step, judged per token against the float64 reference.
#pragma once

#include <algorithm>
#include <cmath>
#include <ostream>
#include <string>
#include <vector>

#include "dsv4/layer.h"
#include "dsv4/reference.h"
#include "dsv4/weights.h"
#include "layer_test_support.h"

namespace dsv4_test {

struct RealHeadsCase {
  const char* model;  // "v4-flash" or "v4-pro"
  int layer;          // a layer of the kind
  const char* kind;   // "SWA", "C4A", "C128A"
  int tokens;         // C4A: 4 entries visible at the end; C128A: 129, so its first entry is seen
};
// "v4_flash_SWA" (a gtest parameter name: letters, digits and underscores only).
inline std::string real_heads_name(const RealHeadsCase& c) {
  std::string name = std::string(c.model) + "_" + c.kind;
  for (char& ch : name)
    if (ch == '-') ch = '_';
  return name;
}
inline std::ostream& operator<<(std::ostream& os, const RealHeadsCase& c) {
  return os << real_heads_name(c);
}

// Flash: layers 0 SWA, 2 C4A, 3 C128A. Pro: 0 C128A, 2 C4A, and its MTP block (SWA).
inline std::vector<RealHeadsCase> real_heads_cases() {
  return {{"v4-flash", 0, "SWA", 8},  {"v4-flash", 2, "C4A", 16}, {"v4-flash", 3, "C128A", 129},
          {"v4-pro", 61, "SWA", 8},   {"v4-pro", 2, "C4A", 16},   {"v4-pro", 0, "C128A", 129}};
}

// Per-token errors max|y - ref| / max|ref| of one request's prefill through `backend`, sorted.
inline std::vector<double> real_heads_errors(const RealHeadsCase& c, dsv4::Backend backend,
                                             uint64_t seed) {
  const dsv4::ModelConfig cfg = dsv4::ModelConfig::builtin(c.model);
  dsv4::AttentionWeights w = dsv4::random_attention_weights(cfg, c.layer, seed, true);
  dsv4::AttentionOptions opts;
  opts.backend = backend;
  opts.caches.swa_blocks = 8;
  opts.caches.compressed_blocks = 8;
  opts.caches.state_blocks = 8;
  dsv4::Attention layer(cfg, c.layer, w, opts);
  const dsv4::BatchPlan plan = dsv4::BatchPlan::make({{1, 0, c.tokens}});
  // bf16-representable x: a CUDA layer rounds a host x to bf16, the reference takes it as given.
  StepIo io = step_io(plan, cfg.dim, seed, /*bf16_representable=*/true);
  layer.forward(plan, io.x, io.y);
  std::vector<double> x(io.x.data<float>(), io.x.data<float>() + io.x.numel());
  const std::vector<double> ref = dsv4::reference_attention_layer(cfg, c.layer, w, x);
  std::vector<double> errs;
  for (int t = 0; t < c.tokens; ++t) {
    const std::vector<float> got(io.y.data<float>() + int64_t{t} * cfg.dim,
                                 io.y.data<float>() + int64_t{t + 1} * cfg.dim);
    const std::vector<double> want(ref.begin() + int64_t{t} * cfg.dim, ref.begin() + int64_t{t + 1} * cfg.dim);
    const double e = row_rel_err(got, want);
    errs.push_back(std::isnan(e) ? INFINITY : e);
  }
  std::sort(errs.begin(), errs.end());
  return errs;
}

}  // namespace dsv4_test

// Shared by the layer suites (tests/cpu/test_attention_layer.cpp, tests/cuda/
// test_attention_layer_cuda.cpp): deterministic hidden states, per-token outputs and the
// per-token relative error the layer tolerances are stated in.
#pragma once

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <map>
#include <string>
#include <random>
#include <utility>
#include <vector>

#include <cstring>

#include "dsv4/batch.h"
#include "dsv4/dtype.h"
#include "dsv4/tensor.h"

namespace dsv4_test {

// The hidden state of request `req` at position `pos`: deterministic N(0, 1) for a seed, rounded
// to bf16 when asked (so a backend that rounds x to bf16 sees the same input as one that doesn't).
inline std::vector<float> layer_hidden(int dim, int64_t req, int64_t pos, uint64_t seed,
                                       bool bf16_representable = false) {
  std::mt19937_64 rng(seed * 1000003u + static_cast<uint64_t>(req) * 7919u + static_cast<uint64_t>(pos));
  std::normal_distribution<float> n(0.0f, 1.0f);
  std::vector<float> v(dim);
  for (float& f : v) f = bf16_representable ? dsv4::round_bf16(n(rng)) : n(rng);
  return v;
}

// Every token's output row, by (request id, position).
using LayerOutputs = std::map<std::pair<int64_t, int64_t>, std::vector<float>>;

// One step's input x [T, dim] (token t: layer_hidden of its request and position) and output y,
// NaN-poisoned so every row the layer leaves unwritten shows.
struct StepIo {
  dsv4::HostTensor x, y;
};
inline StepIo step_io(const dsv4::BatchPlan& plan, int dim, uint64_t seed, bool bf16_representable = false) {
  const int64_t T = plan.num_tokens();
  StepIo io{dsv4::HostTensor(dsv4::DType::fp32, {T, dim}), dsv4::HostTensor(dsv4::DType::fp32, {T, dim})};
  io.y.fill_bytes(0xFF);
  for (int64_t t = 0; t < T; ++t) {
    const int64_t req = plan.requests[plan.token_to_req[t]].req_id;
    const std::vector<float> h = layer_hidden(dim, req, plan.positions[t], seed, bf16_representable);
    std::memcpy(io.x.data<float>() + t * dim, h.data(), dim * sizeof(float));
  }
  return io;
}

// Records y's row of every token of the step under (request id, position).
inline void record_outputs(const dsv4::BatchPlan& plan, const dsv4::HostTensor& y, int dim, LayerOutputs& out) {
  for (int64_t t = 0; t < plan.num_tokens(); ++t) {
    const int64_t req = plan.requests[plan.token_to_req[t]].req_id;
    out[{req, plan.positions[t]}] = std::vector<float>(y.data<float>() + t * dim, y.data<float>() + (t + 1) * dim);
  }
}

// max_i |a_i − b_i| / max_i |b_i| over one token's row.
inline double row_rel_err(const std::vector<float>& a, const std::vector<double>& b) {
  double num = 0, den = 0;
  for (size_t i = 0; i < a.size(); ++i) {
    num = std::max(num, std::fabs(a[i] - b[i]));
    den = std::max(den, std::fabs(b[i]));
  }
  return num / den;
}
inline double row_rel_err(const std::vector<float>& a, const std::vector<float>& b) {
  return row_rel_err(a, std::vector<double>(b.begin(), b.end()));
}

}  // namespace dsv4_test

#include "dsv4/config.h"
#include "dsv4/layer.h"
#include "dsv4/reference.h"
#include "dsv4/weights.h"

namespace dsv4_test {

// The released models' shapes, each layer kind (the RealHeads suites on the CPU and on CUDA).
struct RealHeadsCase {
  const char* model;
  dsv4::LayerKind kind;
};
inline std::vector<RealHeadsCase> real_heads_cases() {
  std::vector<RealHeadsCase> cases;
  for (const char* model : {"v4-flash", "v4-pro"})
    for (dsv4::LayerKind kind : {dsv4::LayerKind::swa, dsv4::LayerKind::c4a, dsv4::LayerKind::c128a})
      cases.push_back({model, kind});
  return cases;
}
inline std::string real_heads_case_name(const RealHeadsCase& c) {
  std::string n = std::string(c.model) + "_" + std::string(dsv4::layer_kind_name(c.kind));
  for (char& ch : n)
    if (ch == '-' || ch == '.') ch = '_';
  return n;
}

// The first layer of `kind` in `cfg` (the real models interleave the kinds).
inline int first_layer_of_kind(const dsv4::ModelConfig& cfg, dsv4::LayerKind kind) {
  for (int l = 0; l < cfg.n_layers(); ++l)
    if (cfg.layer_kind(l) == kind) return l;
  return -1;
}

// One request through `a` as a prefill of `prefill` tokens then `decodes` single-token steps
// (bf16-representable inputs), each token's output against the float64 reference layer over the
// same tokens; returns the per-token errors by position.
inline std::vector<double> errors_vs_float64(dsv4::Attention& a, const dsv4::AttentionWeights& w,
                                                    int layer, int prefill, int decodes, uint64_t seed) {
  const dsv4::ModelConfig& cfg = a.config();
  LayerOutputs got;
  const auto run = [&](int64_t pos, int64_t n) {
    const dsv4::BatchPlan plan = dsv4::BatchPlan::make({{7, pos, n}});
    StepIo io = step_io(plan, cfg.dim, seed, /*bf16_representable=*/true);
    a.forward(plan, io.x, io.y);
    record_outputs(plan, io.y, cfg.dim, got);
  };
  run(0, prefill);
  for (int i = 0; i < decodes; ++i) run(prefill + i, 1);
  const int L = prefill + decodes;
  std::vector<double> x;
  for (int p = 0; p < L; ++p) {
    const std::vector<float> h = layer_hidden(cfg.dim, 7, p, seed, /*bf16_representable=*/true);
    x.insert(x.end(), h.begin(), h.end());
  }
  const std::vector<double> ref = dsv4::reference_attention_layer(cfg, layer, w, x);
  std::vector<double> errs;
  for (int p = 0; p < L; ++p)
    errs.push_back(row_rel_err(got.at({7, p}), std::vector<double>(ref.begin() + int64_t{p} * cfg.dim,
                                                                  ref.begin() + int64_t{p + 1} * cfg.dim)));
  return errs;
}

// A RealHeadsCase on `backend`: random FP8 weights, 8 prompt tokens (two ratio-4 entries) and 4
// decodes (one more entry, read by the indexer) against the float64 reference. Prints the errors
// by position; returns them sorted.
inline std::vector<double> real_heads_errors(const RealHeadsCase& c, dsv4::Backend backend) {
  const dsv4::ModelConfig cfg = dsv4::ModelConfig::builtin(c.model);
  const int layer = first_layer_of_kind(cfg, c.kind);
  constexpr uint64_t kSeed = 5;
  const dsv4::AttentionWeights w = dsv4::random_attention_weights(cfg, layer, kSeed, /*fp8=*/true);
  dsv4::AttentionOptions opts;
  opts.backend = backend;
  opts.caches.swa_blocks = 4;
  opts.caches.compressed_blocks = 4;
  opts.caches.state_blocks = 8;
  dsv4::Attention a(cfg, layer, w, opts);
  const std::vector<double> by_position = errors_vs_float64(a, w, layer, 8, 4, kSeed);
  std::vector<double> errs = by_position;
  std::sort(errs.begin(), errs.end());
  std::printf("  %s layer %d (%d heads): median %.3e, max %.3e; by position:", c.model, layer, cfg.n_heads,
              errs[errs.size() / 2], errs.back());
  for (double e : by_position) std::printf(" %.1e", e);
  std::printf("\n");
  return errs;
}

}  // namespace dsv4_test

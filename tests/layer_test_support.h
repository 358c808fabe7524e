// Shared by the layer suites (tests/cpu/test_attention_layer.cpp, tests/cuda/
// test_attention_layer_cuda.cpp): deterministic hidden states, per-token outputs and the
// per-token relative error the layer tolerances are stated in.
#pragma once

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <map>
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

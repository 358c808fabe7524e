// The serving simulation behind `dsv4 run`: N requests are prefilled in chunks under a per-step
// token budget and then decoded for M steps, every step one mixed batch (decodes first) through
// the whole attention stack, with paged caches. Optionally checks a sample of requests against
// the unbatched float64 reference layer by layer.
#pragma once

#include <cstdint>
#include <functional>
#include <string>
#include <vector>

#include "dsv4/config.h"
#include "dsv4/model.h"

namespace dsv4::cli {

struct SimConfig {
  int requests = 4;
  std::vector<int64_t> prompt_lens;  // one value: all requests; N values: one each
  int64_t decode_steps = 16;
  int64_t chunk = 256;               // token budget per step (decodes count one each)
  uint64_t seed = 1;
  int check_requests = 0;            // requests re-run through the float64 reference (0: none)
  // Rounding flips between the fp32 batched path and the float64 reference (a value landing on the
  // other side of an FP8 / bf16 rounding boundary) measure up to ~1.3e-2; semantic errors (a
  // missing scope, the sink, a RoPE position) are an order of magnitude above.
  double check_tolerance = 3e-2;     // CPU backend; `dsv4 run` uses 5e-2 for CUDA (cmd_run.cpp)
};

struct PhaseStats {
  std::string phase;  // "prefill" (steps with prefill chunks, decodes riding along), "decode"
  int64_t steps = 0, tokens = 0;
  double seconds = 0, flops = 0;
};

struct LayerCheck {
  int layer = 0;
  LayerKind kind = LayerKind::swa;
  int64_t tokens = 0;
  double max_rel_err = 0;  // max over tokens of max|y - ref| / max|ref|
};

struct SimReport {
  std::vector<PhaseStats> phases;
  std::vector<LayerCheck> checks;
  double check_tolerance = 0;
  bool check_passed = true;
};

// `progress` receives a one-line status now and then (may be empty).
SimReport run_serving_sim(AttentionStack& stack, const SimConfig& cfg,
                          const std::function<void(const std::string&)>& progress);

// FLOPs of one token of one layer at position p (projections, compressor, indexer, attention),
// as the batched path computes them.
double layer_token_flops(const ModelConfig& cfg, LayerKind kind, int64_t p);

}  // namespace dsv4::cli

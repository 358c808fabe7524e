// The serving simulation behind `dsv4 run`: N requests, all arriving at once, are run through the
// whole attention stack with paged caches by the continuous-batching scheduler (scheduler.h):
// admitted as the caches allow, prefilled in chunks under a per-step token budget, then decoded
// for M steps; every step one mixed batch (decodes first). Optionally checks a sample of
// requests against the unbatched float64 reference layer by layer.
#pragma once

#include <cstdint>
#include <functional>
#include <string>
#include <vector>

#include "dsv4/config.h"
#include "dsv4/model.h"
#include "scheduler.h"

namespace dsv4::cli {

struct SimConfig {
  int requests = 4;
  std::vector<int64_t> prompt_lens;  // one value: all requests; N values: one each
  int64_t decode_steps = 16;
  int64_t chunk = 256;               // token budget per step (decodes count one each)
  int max_running = 0;               // requests running at once (0: as many as the caches hold)
  uint64_t seed = 1;
  int check_requests = 0;            // requests re-run through the float64 reference (0: none)
  // Rounding flips between the fp32 batched path and the float64 reference (a value landing on the
  // other side of an FP8 / bf16 rounding boundary) measure up to ~1.3e-2; semantic errors (a
  // missing scope, the sink, a RoPE position) are an order of magnitude above.
  double check_tolerance = 3e-2;     // CPU backend; `dsv4 run` uses 5e-2 for CUDA (cmd_run.cpp)
  KvLayout kv_layout = KvLayout::model1_fp8;  // the layers' cache layout, for the reference's rounding
  float kv_scale = 1.0f;                      // and its FP8_PER_TENSOR scale
  float q_scale = 1.0f;                       // and, with it, the FP8 queries' scale
  bool warmup = true;  // GPU: an untimed warm-up step pair before the run (SimReport::warmup_*)
};

// Throws dsv4::Error naming the flag for a config `dsv4 run` cannot simulate on `model`.
void validate_sim_config(const SimConfig& cfg, const ModelConfig& model);
// Each request's prompt length (SimConfig::prompt_lens expanded to one per request).
std::vector<int64_t> request_prompts(const SimConfig& cfg);

struct PhaseStats {
  // "prefill": steps of prefill chunks only; "decode": decodes only; "mixed": both.
  std::string phase;
  int64_t steps = 0, tokens = 0;
  double seconds = 0, flops = 0;
  std::vector<double> step_seconds = {};  // each step's wall time, in step order
  double p50_ms() const { return 1e3 * percentile(step_seconds, 50); }
  double p99_ms() const { return 1e3 * percentile(step_seconds, 99); }
};

struct LayerCheck {
  int layer = 0;
  LayerKind kind = LayerKind::swa;
  std::string kind_name = "SWA";  // layer_kind_name(kind), or "MLA" for a V3.2 layer
  int64_t tokens = 0;
  double max_rel_err = 0;  // max over tokens of max|y - ref| / max|ref|
};

struct SimReport {
  std::vector<PhaseStats> phases;  // prefill, decode, mixed
  SchedulerStats scheduler;
  std::vector<LayerCheck> checks;
  // The warm-up's reservation (AttentionStack::reserve) for the run's largest step, per layer.
  struct Reserved {
    int64_t max_tokens = 0, max_context = 0;
    int max_requests = 0;
  } reserved;
  std::vector<LayerMemory> memory;  // as reserved; workspace_used: the most the run took
  bool reservation_outgrown = false;  // a layer's workspace or upload grew past it during the run
  // GPU: the untimed warm-up before the run (one prefill step of `warmup_requests` stand-in
  // requests of `warmup_prompt` tokens, then one decode step of them), its wall seconds.
  int warmup_requests = 0;
  int64_t warmup_prompt = 0;
  double warmup_seconds = 0;
  double check_tolerance = 0;
  bool check_passed = true;
};

// Receives the stack's output row y[dim] of every token a step computed; a token recomputed
// after a preemption is reported again.
using OutputHook = std::function<void(int64_t req, int64_t pos, const float* y)>;

// `progress` receives a one-line status now and then (may be empty). The stack's caches must
// be empty; the scheduler fits the requests into whatever pools they have.
SimReport run_serving_sim(AttentionStack& stack, const SimConfig& cfg,
                          const std::function<void(const std::string&)>& progress,
                          const OutputHook& on_output = {});

// FLOPs of one token of one layer at position p (projections, compressor, indexer, attention),
// as the batched path computes them.
double layer_token_flops(const ModelConfig& cfg, LayerKind kind, int64_t p);

}  // namespace dsv4::cli

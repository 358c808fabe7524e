// The cases of `dsv4 bench layer` and how they run on one layer: the layer is built with pools
// sized for its cases, contexts are built by untimed steps, each case's steps are timed (wall clock,
// and per op through the layer's OpTimer hook), and the layer is freed before the next one.
//
// Decode and MTP cases share one pool of requests built to the context once per layer; each timed
// step advances its requests, so later cases run a little past the nominal context (reported as
// context_range). Prefill cases use fresh requests per timed step; a continuing case builds every
// set's context first, then idles, then times the sets back to back.
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "dsv4/communicator.h"
#include "dsv4/config.h"
#include "dsv4/paged_cache.h"
#include "layer/rank_threads.h"
#include "layer_bench_report.h"

namespace dsv4::bench {

// How a case's wall time is taken: forward() + stream sync, host planning and the step upload
// included. graph (CUDA default): the layer replays its CUDA graph for decode-only steps
// (AttentionOptions::cuda_graphs; MTP and prefill steps run eagerly either way). eager: graphs off.
// Per-op GPU times always come from an eager, serial pass with the op timer active.
enum class WallMode { eager, graph };

struct CaseSpec {
  std::string name;   // "prefill-8x2048", "prefill-4x4096@8192", "decode-128", "mtp-128x2"
  std::string phase;  // "prefill", "decode", "mtp"
  int64_t requests = 0, new_tokens = 0, context = 0;
  bool shares_pool() const { return phase != "prefill"; }
};

// How `--tp N` runs. none: N = 1. shard: rank 0's shard of the N-way split alone on one device
// (its n_heads/N heads and o_groups/N wo_a groups, include/dsv4/tensor_parallel.h), y left as
// its partial sum, the all-reduce not run (the CPU, or fewer than N GPUs, or no NCCL). gpus: the
// N ranks on GPUs 0..N-1, one host thread each, y summed by NCCL ("tp_allreduce", timed with
// the rest).
enum class TpMode { none, shard, gpus };
const char* tp_mode_name(TpMode mode);

struct LayerBenchSettings {
  bool cuda = false;
  int64_t prefill_tokens = 16384, context = 4096, mtp_requests = 128, build_chunk = 16384;
  std::vector<int64_t> decode_requests{1, 32, 128, 256};
  int warmup = 2, reps = 20, prefill_reps = 5, cooldown_ms = 1000;
  bool fp8_weights = true;
  WallMode wall = WallMode::graph;  // the CLI defaults to eager on the CPU (no graphs there)
  uint64_t seed = 1;
  // Tensor-parallel ranks of the layer and how they run; ops are priced on one rank's shard.
  int tp = 1;
  TpMode tp_mode = TpMode::none;
};

// prefill-8x(P/8), prefill-4x(P/4)@(P/2), decode-N for each N, mtp-Mx2 (P = prefill_tokens).
std::vector<CaseSpec> layer_bench_cases(const LayerBenchSettings& s);

// Pool sizes for `cases` on a layer of `kind`: the largest set of requests resident at once.
LayerCacheOptions cache_options(const ModelConfig& cfg, LayerKind kind, const std::vector<CaseSpec>& cases,
                                const LayerBenchSettings& s);

// `--host-only`: the host half of the shared-pool cases' steps (decode, MTP) on `layer` — the
// layer's StepPlanner (checks, cache bookkeeping, block tables into the step upload, the graph
// key), which is all that stands between a caller and a replayed decode graph. Needs no GPU and
// no weights. Prints one line per case: host µs per step (median, p90) and the upload's bytes.
void run_host_plan_cases(const ModelConfig& cfg, int layer, const std::vector<CaseSpec>& cases,
                         const LayerBenchSettings& s);

// Where the layer's ranks run: the host threads (one, the caller's, unless tp_mode is gpus: then
// one per GPU 0..tp-1) and, for gpus, their NCCL group. Made once for every layer of a run: each
// thread keeps per-thread CUDA state (cuBLASLt plans, the fan-out streams) that a new one would
// build again, and an NCCL group takes seconds to make.
struct BenchRanks {
  std::unique_ptr<RankThreads> threads;
  std::vector<std::unique_ptr<Communicator>> group;  // gpus: rank r's communicator; else empty
};
BenchRanks make_bench_ranks(const LayerBenchSettings& s);

// Builds `layer` of `cfg` (random weights, the settings' backend; with tp_mode gpus one rank per
// thread of `ranks`, on its GPU), runs `cases` on it (decode / MTP first, fewest requests first,
// then prefill), frees it; appends one report per case and calls on_case after each.
void run_layer_cases(const ModelConfig& cfg, int layer, const std::vector<CaseSpec>& cases,
                     const LayerBenchSettings& s, const Ceilings& ceil, BenchRanks& ranks,
                     std::vector<CaseReport>& out, const std::function<void(const CaseReport&)>& on_case);

}  // namespace dsv4::bench

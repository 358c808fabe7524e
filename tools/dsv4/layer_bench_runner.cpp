#include "layer_bench_runner.h"

#include <algorithm>
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <map>
#include <memory>
#include <random>
#include <thread>

#include "dsv4/device_tensor.h"
#include "dsv4/layer.h"
#include "dsv4/paged_cache.h"
#include "dsv4/status.h"
#include "dsv4/tensor_parallel.h"
#include "dsv4/weights.h"
#include "layer_cost_model.h"
#include "layer_op_timer.h"
#include "runtime/device_runtime.h"
#include "runtime/random_fill.h"

namespace dsv4::bench {

namespace {

using Clock = std::chrono::steady_clock;

// ---- one layer under test ---------------------------------------------------------------------

struct StepTimes {
  double wall_us = 0;
  double forward_us = 0;  // host time until forward() returned (planning + enqueue / replay launch)
  double graph_gpu_us = -1;  // rank 0's replayed graph on the GPU (negative: the step ran eagerly)
  // Rank 0's host clock: from the step's start to the graph launch call, and the call itself.
  double before_launch_us = 0, launch_us = 0;
  std::vector<std::pair<std::string, double>> host_phases_us;  // rank 0: OpTimer::host_phase, from the start
  ForwardTimes ops;  // empty when timed without the op timer
};

// One rank's layer (the only one unless --tp runs on GPUs) with its own stream (CUDA), op timer,
// and an input x / output y large enough for any step of its cases (x random, on the layer's
// device: a serving engine's hidden states are there; the same values on every rank, as tensor
// parallelism replicates the layer's input).
class RankLayer {
 public:
  RankLayer(const ModelConfig& cfg, int layer, const AttentionWeights& w, const LayerBenchSettings& s,
            const LayerCacheOptions& caches, int64_t max_tokens, TensorParallel tp)
      : cuda_(s.cuda), stream_(make_stream(s.cuda)), timer_(make_timer(s.cuda)),
        layer_(cfg, layer, w, options(s, caches, stream(), timer_.get(), tp)) {
    const std::vector<int64_t> dims{max_tokens, cfg.dim};
    if (cuda_) {
      x_dev_ = DeviceTensor(DType::bf16, dims);
      y_dev_ = DeviceTensor(DType::fp32, dims);
      rt::fill_random_bf16(x_dev_.view().data, x_dev_.numel(), s.seed, -1.0f, 1.0f, stream());
      sync();
    } else {
      x_host_ = HostTensor(DType::fp32, dims);
      y_host_ = HostTensor(DType::fp32, dims);
      std::mt19937_64 rng(s.seed);
      std::normal_distribution<float> n(0.0f, 1.0f);
      float* x = x_host_.data<float>();
      for (int64_t i = 0; i < x_host_.numel(); ++i) x[i] = n(rng);
    }
  }

  Attention& layer() { return layer_; }
  TimingOpTimer& timer() { return *timer_; }
  // Enqueues the forward of `plan` (CPU: runs it).
  void forward(const BatchPlan& plan) {
    const int64_t T = plan.num_tokens();
    layer_.forward(plan, (cuda_ ? x_dev_.view() : x_host_.view()).slice0(0, T),
                   (cuda_ ? y_dev_.view() : y_host_.view()).slice0(0, T));
  }
  void sync() {
    if (cuda_) rt::synchronize_stream(stream(), "bench layer");
  }

 private:
  // The CUDA layer's own stream; none (nullptr) on the CPU.
  static std::unique_ptr<rt::OwnedStream> make_stream(bool cuda) {
    return cuda ? std::make_unique<rt::OwnedStream>() : nullptr;
  }
  Stream stream() const { return stream_ ? stream_->get() : nullptr; }
  static std::unique_ptr<TimingOpTimer> make_timer(bool cuda) {
    if (cuda) return std::make_unique<CudaEventOpTimer>();
    return std::make_unique<HostOpTimer>();
  }
  static AttentionOptions options(const LayerBenchSettings& s, const LayerCacheOptions& caches, Stream stream,
                                  OpTimer* timer, TensorParallel tp) {
    AttentionOptions o;
    o.backend = s.cuda ? Backend::cuda : Backend::cpu;
    o.stream = stream;
    o.caches = caches;
    o.op_timer = timer;
    o.cuda_graphs = s.wall == WallMode::graph;
    o.tp = tp;
    return o;
  }

  bool cuda_;
  // Destroyed in reverse: the layer (which uses the timer and the stream) goes first.
  std::unique_ptr<rt::OwnedStream> stream_;
  std::unique_ptr<TimingOpTimer> timer_;
  Attention layer_;
  DeviceTensor x_dev_, y_dev_;
  HostTensor x_host_, y_host_;
};

// The layer under test: rank 0's shard alone (--tp N without N GPUs: y stays its partial sum),
// or every rank on its own GPU and host thread, their y summed by NCCL (TpMode::gpus). Steps are
// timed on the calling thread around all ranks; the per-op times are rank 0's (its
// "tp_allreduce" included, which waits for the slowest rank).
class LayerRunner {
 public:
  LayerRunner(const ModelConfig& cfg, int layer, const LayerBenchSettings& s, const LayerCacheOptions& caches,
              int64_t max_tokens, BenchRanks& bench_ranks)
      : threads_(bench_ranks.threads.get()) {
    const AttentionWeights w = random_attention_weights(cfg, layer, s.seed, s.fp8_weights);
    const auto& group = bench_ranks.group;
    for (int r = 0; r < threads_->size(); ++r) {
      const rt::DeviceGuard on_device(threads_->device(r), "bench layer");  // built on its GPU
      const TensorParallel tp{r, s.tp, group.empty() ? nullptr : group[static_cast<size_t>(r)].get()};
      ranks_.push_back(std::make_unique<RankLayer>(cfg, layer, w, s, caches, max_tokens, tp));
    }
  }
  ~LayerRunner() {
    for (size_t r = 0; r < ranks_.size(); ++r) {
      try {
        const rt::DeviceGuard on_device(threads_->device(static_cast<int>(r)), "bench layer");
        ranks_[r].reset();
      } catch (...) {
        ranks_[r].reset();
      }
    }
  }
  LayerRunner(const LayerRunner&) = delete;
  LayerRunner& operator=(const LayerRunner&) = delete;

  int64_t new_request() { return next_id_++; }
  void release(int64_t id) {
    for (const auto& rank : ranks_) rank->layer().release(id);
  }

  // One forward of `steps` on every rank. With op timing, rank 0's per-op times of this forward
  // come back.
  StepTimes step(const std::vector<RequestStep>& steps, bool op_timing) {
    const BatchPlan plan = BatchPlan::make(steps);
    // Every rank takes the step before any enqueues a collective.
    for (const auto& rank : ranks_) rank->layer().check_plan(plan);
    for (const auto& rank : ranks_) {
      rank->timer().reset();
      rank->timer().set_enabled(op_timing);  // every rank alike: graph steps in lock-step
    }
    StepTimes out;
    const auto t0 = Clock::now();
    threads_->run([&](int r) {
      ranks_[static_cast<size_t>(r)]->forward(plan);
      if (r == 0) out.forward_us = std::chrono::duration<double, std::micro>(Clock::now() - t0).count();
    });
    for (size_t r = 0; r < ranks_.size(); ++r) {  // the step ends when the slowest rank's does
      const rt::DeviceGuard on_device(threads_->device(static_cast<int>(r)), "bench layer");
      ranks_[r]->sync();
    }
    out.wall_us = std::chrono::duration<double, std::micro>(Clock::now() - t0).count();
    if (op_timing) out.ops = ranks_[0]->timer().collect();
    for (const auto& [phase, at] : ranks_[0]->timer().take_host_phases())
      out.host_phases_us.push_back({phase, std::chrono::duration<double, std::micro>(at - t0).count()});
    out.graph_gpu_us = ranks_[0]->timer().take_graph_us();
    if (out.graph_gpu_us >= 0) {
      const auto [began, ended] = ranks_[0]->timer().graph_launch_span();
      out.before_launch_us = std::chrono::duration<double, std::micro>(began - t0).count();
      out.launch_us = std::chrono::duration<double, std::micro>(ended - began).count();
    }
    return out;
  }

  // Runs the requests `ids` from their current context to `target` in untimed steps of at most
  // `budget` tokens (earlier requests first, as a chunked-prefill scheduler does).
  void build_context(std::map<int64_t, int64_t>& context, const std::vector<int64_t>& ids, int64_t target,
                     int64_t budget) {
    size_t next = 0;
    while (next < ids.size()) {
      std::vector<RequestStep> steps;
      int64_t left = budget;
      for (size_t i = next; i < ids.size() && left > 0; ++i) {
        const int64_t have = context[ids[i]];
        const int64_t n = std::min(left, target - have);
        if (n <= 0) continue;
        steps.push_back({ids[i], have, n});
        left -= n;
      }
      if (steps.empty()) break;
      step(steps, false);
      for (const RequestStep& st : steps) context[st.req_id] += st.num_new;
      while (next < ids.size() && context[ids[next]] >= target) ++next;
    }
  }

 private:
  RankThreads* threads_;
  std::vector<std::unique_ptr<RankLayer>> ranks_;
  int64_t next_id_ = 0;
};

void cooldown(const LayerBenchSettings& s) {
  if (s.cooldown_ms > 0) std::this_thread::sleep_for(std::chrono::milliseconds(s.cooldown_ms));
}

// Folds a case's timed steps into its report (ops priced on the first timed step's plan).
CaseReport make_report(const ModelConfig& cfg, int layer, LayerKind kind, const CaseSpec& c, const LayerBenchSettings& s,
                       const Ceilings& ceil, const BatchPlan& first_plan, const std::vector<StepTimes>& timed,
                       const std::vector<StepTimes>& wall_steps, int64_t ctx_min, int64_t ctx_max) {
  CaseReport r;
  r.model = cfg.name;
  r.layer = layer;
  r.kind = std::string(layer_kind_name(kind));
  r.name = c.name;
  r.phase = c.phase;
  r.requests = c.requests;
  r.tokens = c.requests * c.new_tokens;
  r.context = c.context;
  r.context_min = ctx_min;
  r.context_max = ctx_max;
  r.reps = static_cast<int>(timed.size());
  r.wall_mode = s.wall == WallMode::graph ? "graph" : "eager";
  std::vector<ForwardTimes> runs;
  for (const StepTimes& t : timed) runs.push_back(t.ops);
  const ForwardTimes med = median_times(runs);
  std::vector<double> wall_us, forward_us, graph_gpu_us, before_launch_us, launch_us;
  std::vector<std::pair<std::string, std::vector<double>>> phases;  // per phase, over the replayed steps
  for (const StepTimes& t : wall_steps) {
    wall_us.push_back(t.wall_us);
    forward_us.push_back(t.forward_us);
    if (t.graph_gpu_us >= 0) {
      graph_gpu_us.push_back(t.graph_gpu_us);
      before_launch_us.push_back(t.before_launch_us);
      launch_us.push_back(t.launch_us);
      for (const auto& [name, us] : t.host_phases_us) {
        auto it = std::find_if(phases.begin(), phases.end(), [&](const auto& p) { return p.first == name; });
        if (it == phases.end()) it = phases.emplace(phases.end(), name, std::vector<double>{});
        it->second.push_back(us);
      }
    }
  }
  r.wall_us = median(wall_us);
  r.forward_us = median(forward_us);
  // Over the steps that replayed, when they are at least half (a step whose shape changed — a
  // width crossing a power of two — runs eagerly once, then is captured).
  r.graph_replays = static_cast<int>(graph_gpu_us.size());
  if (!graph_gpu_us.empty() && 2 * graph_gpu_us.size() >= wall_steps.size()) {
    r.graph_gpu_us = median(graph_gpu_us);
    r.before_launch_us = median(before_launch_us);
    r.launch_us = median(launch_us);
    for (const auto& [name, us] : phases) r.host_phases_us.push_back({name, median(us)});
  }
  r.gpu_us = med.gpu_us;
  r.host_us = med.host_us;
  const StepShape shape = StepShape::make(tensor_parallel_config(cfg, s.tp), kind, first_plan, s.fp8_weights);
  for (const OpTime& o : med.ops) {
    OpReport op{o.name, o.gpu_us, o.host_us, op_cost(o.name, shape), 0.0};
    if (op.cost) op.floor_us = op.cost->floor_us(ceil);
    r.ops.push_back(std::move(op));
  }
  return r;
}

// The decode / MTP cases of one layer over a shared pool of requests built to the context.
void run_pool_cases(LayerRunner& runner, const ModelConfig& cfg, int layer, LayerKind kind,
                    const std::vector<CaseSpec>& cases, const LayerBenchSettings& s, const Ceilings& ceil,
                    std::vector<CaseReport>& out, const std::function<void(const CaseReport&)>& done) {
  int64_t pool_size = 0;
  for (const CaseSpec& c : cases) pool_size = std::max(pool_size, c.requests);
  if (pool_size == 0) return;
  std::vector<int64_t> ids;
  std::map<int64_t, int64_t> context;
  for (int64_t i = 0; i < pool_size; ++i) ids.push_back(runner.new_request());
  const auto t0 = Clock::now();
  runner.build_context(context, ids, s.context, s.build_chunk);
  std::fprintf(stderr, "  built context %lld for %lld requests (%.1f s)\n", static_cast<long long>(s.context),
               static_cast<long long>(pool_size), std::chrono::duration<double>(Clock::now() - t0).count());
  for (const CaseSpec& c : cases) {
    const std::vector<int64_t> mine(ids.begin(), ids.begin() + c.requests);
    auto next_steps = [&] {
      std::vector<RequestStep> steps;
      for (int64_t id : mine) steps.push_back({id, context[id], c.new_tokens});
      return steps;
    };
    auto advance = [&](const std::vector<RequestStep>& steps) {
      for (const RequestStep& st : steps) context[st.req_id] += st.num_new;
    };
    for (int i = 0; i < s.warmup; ++i) {
      const auto steps = next_steps();
      runner.step(steps, true);
      advance(steps);
    }
    cooldown(s);
    std::vector<StepTimes> timed;
    std::vector<StepTimes> wall;
    int64_t ctx_min = INT64_MAX, ctx_max = 0;
    BatchPlan first_plan;
    for (int pass = 0; pass < 2; ++pass) {  // 0: op timing, 1: wall clock without the timer
      // Without the timer a decode step of a new shape runs eagerly once and is captured the
      // second time: two untimed steps first, so the timed ones replay.
      for (int i = 0; pass == 1 && i < 2; ++i) {
        const auto steps = next_steps();
        runner.step(steps, false);
        advance(steps);
      }
      for (int i = 0; i < s.reps; ++i) {
        const auto steps = next_steps();
        if (pass == 0 && i == 0) first_plan = BatchPlan::make(steps);
        for (const RequestStep& st : steps) {
          ctx_min = std::min(ctx_min, st.context);
          ctx_max = std::max(ctx_max, st.context);
        }
        StepTimes t = runner.step(steps, pass == 0);
        advance(steps);
        if (pass == 0) timed.push_back(std::move(t));
        else wall.push_back(std::move(t));
      }
    }
    out.push_back(make_report(cfg, layer, kind, c, s, ceil, first_plan, timed, wall, ctx_min, ctx_max));
    done(out.back());
  }
  for (int64_t id : ids) runner.release(id);
}

// One prefill case: fresh requests per timed step (continuing cases: built to the context first,
// every set before the cool-down, so the timed steps run back to back on an idle-started GPU).
void run_prefill_case(LayerRunner& runner, const ModelConfig& cfg, int layer, LayerKind kind, const CaseSpec& c,
                      const LayerBenchSettings& s, const Ceilings& ceil, std::vector<CaseReport>& out) {
  const int warmup = std::min(s.warmup, 1);
  const int sets = warmup + s.prefill_reps;
  std::vector<std::vector<int64_t>> ids(sets);
  std::map<int64_t, int64_t> context;
  for (auto& set : ids)
    for (int64_t i = 0; i < c.requests; ++i) set.push_back(runner.new_request());
  if (c.context > 0) {
    const auto t0 = Clock::now();
    for (const auto& set : ids) runner.build_context(context, set, c.context, s.build_chunk);
    std::fprintf(stderr, "  built context %lld for %d x %lld requests (%.1f s)\n", static_cast<long long>(c.context),
                 sets, static_cast<long long>(c.requests), std::chrono::duration<double>(Clock::now() - t0).count());
  }
  cooldown(s);
  std::vector<StepTimes> timed;
  std::vector<StepTimes> wall;
  BatchPlan first_plan;
  for (int i = 0; i < sets; ++i) {
    std::vector<RequestStep> steps;
    for (int64_t id : ids[i]) steps.push_back({id, context[id], c.new_tokens});
    StepTimes t = runner.step(steps, true);
    for (int64_t id : ids[i]) runner.release(id);
    if (i < warmup) continue;
    if (timed.empty()) first_plan = BatchPlan::make(steps);
    wall.push_back(t);
    timed.push_back(std::move(t));
  }
  out.push_back(make_report(cfg, layer, kind, c, s, ceil, first_plan, timed, wall, c.context, c.context));
}

}  // namespace

// Per-layer pool sizes: the largest set of requests resident at once, over the phases of the
// layer's cases (the decode pool; each prefill case's requests). Each request is sized for the
// largest chunk it holds (SWA blocks stay mapped until its next append recycles them) plus the
// next chunk it appends: the layer's capacity check counts no block that recycling would free.
LayerCacheOptions cache_options(const ModelConfig& cfg, LayerKind kind, const std::vector<CaseSpec>& cases,
                                const LayerBenchSettings& s) {
  const int64_t W = cfg.window_size, B = CacheDefaults::kSwaBlock;
  const int r = kind == LayerKind::c4a ? 4 : kind == LayerKind::c128a ? 128 : 0;
  int64_t swa = 0, compressed = 0, state = 0;
  auto resident = [&](int64_t requests, int64_t held_chunk, int64_t next_chunk, int64_t max_len) {
    const int64_t swa_each = (held_chunk + W + B - 1) / B + (next_chunk + B - 1) / B + 2;
    const int64_t cblock = r > 0 ? CacheDefaults::compressed_block(r) : 1;
    const int64_t compressed_each = r > 0 ? (max_len / r + cblock - 1) / cblock + 2 : 0;
    swa = std::max(swa, requests * swa_each);
    compressed = std::max(compressed, requests * compressed_each);
    state = std::max(state, requests * 3);  // a ring is coff <= 2 blocks
  };
  int64_t pool = 0, pool_growth = 0, pool_step = 1;
  for (const CaseSpec& c : cases) {
    if (c.shares_pool()) {
      pool = std::max(pool, c.requests);
      pool_step = std::max(pool_step, c.new_tokens);
      pool_growth += (s.warmup + 2 * s.reps + 2) * c.new_tokens;  // warm-up, op-timed and wall-clock steps
      continue;
    }
    // Continuing cases build every set first (in chunks of at most --build-chunk), then time them.
    // A context longer than the build chunk arrives in several chunks: the next one may be a whole
    // build chunk too.
    const int64_t sets = c.context > 0 ? 1 + s.prefill_reps : 1;
    const int64_t split = c.context > s.build_chunk ? s.build_chunk : 0;
    resident(sets * c.requests, std::min(c.context, s.build_chunk), std::max(c.new_tokens, split),
             c.context + c.new_tokens);
  }
  const int64_t split = s.context > s.build_chunk ? s.build_chunk : 0;
  if (pool > 0)
    resident(pool, std::min(s.context, s.build_chunk), std::max(pool_step, split), s.context + pool_growth);
  LayerCacheOptions o;
  o.swa_blocks = static_cast<int32_t>(std::max<int64_t>(swa, 8));
  o.compressed_blocks = static_cast<int32_t>(std::max<int64_t>(compressed, 8));
  o.state_blocks = static_cast<int32_t>(std::max<int64_t>(state, 8));
  return o;
}

const char* tp_mode_name(TpMode mode) {
  switch (mode) {
    case TpMode::none: return "none";
    case TpMode::shard: return "shard";
    case TpMode::gpus: return "gpus";
  }
  return "?";
}

std::vector<CaseSpec> layer_bench_cases(const LayerBenchSettings& s) {
  const int64_t P = s.prefill_tokens;
  if (P < 8 || P % 8 != 0) fail_expected("bench layer", "--prefill-tokens", "a positive multiple of 8", P);
  std::vector<CaseSpec> cases;
  cases.push_back({detail::concat("prefill-8x", P / 8), "prefill", 8, P / 8, 0});
  cases.push_back({detail::concat("prefill-4x", P / 4, "@", P / 2), "prefill", 4, P / 4, P / 2});
  for (int64_t n : s.decode_requests) {
    if (n < 1) fail_expected("bench layer", "--decode-requests", "values >= 1", n);
    cases.push_back({detail::concat("decode-", n), "decode", n, 1, s.context});
  }
  if (s.mtp_requests > 0) cases.push_back({detail::concat("mtp-", s.mtp_requests, "x2"), "mtp", s.mtp_requests, 2, s.context});
  return cases;
}

BenchRanks make_bench_ranks(const LayerBenchSettings& s) {
  BenchRanks out;
  if (s.tp_mode != TpMode::gpus) {
    out.threads = std::make_unique<RankThreads>(1);
    return out;
  }
  std::vector<int> devices;
  for (int r = 0; r < s.tp; ++r) devices.push_back(r);
  out.group = make_nccl_group(devices);  // before the threads start
  out.threads = std::make_unique<RankThreads>(s.tp, devices);
  return out;
}

void run_layer_cases(const ModelConfig& cfg, int layer, const std::vector<CaseSpec>& cases,
                     const LayerBenchSettings& s, const Ceilings& ceil, BenchRanks& ranks,
                     std::vector<CaseReport>& out, const std::function<void(const CaseReport&)>& on_case) {
  const LayerKind kind = cfg.layer_kind(layer);
  int64_t max_tokens = s.build_chunk;
  for (const CaseSpec& c : cases) max_tokens = std::max(max_tokens, c.requests * c.new_tokens);
  const auto t0 = Clock::now();
  std::fprintf(stderr, "%s layer %d (%s): building the layer\n", cfg.name.c_str(), layer,
               std::string(layer_kind_name(kind)).c_str());
  // Scoped: the layer's weights, caches and workspaces are freed before the next one's.
  LayerRunner runner(cfg, layer, s, cache_options(cfg, kind, cases, s), max_tokens, ranks);
  std::fprintf(stderr, "  layer ready (%.1f s)\n", std::chrono::duration<double>(Clock::now() - t0).count());
  std::vector<CaseSpec> pool_cases;
  for (const CaseSpec& c : cases)
    if (c.shares_pool()) pool_cases.push_back(c);
  // Decode before MTP, fewest requests first: the pool's shared requests drift least in the
  // smallest cases.
  std::stable_sort(pool_cases.begin(), pool_cases.end(), [](const CaseSpec& x, const CaseSpec& y) {
    return x.phase != y.phase ? x.phase == "decode" : x.requests < y.requests;
  });
  run_pool_cases(runner, cfg, layer, kind, pool_cases, s, ceil, out, on_case);
  for (const CaseSpec& c : cases)
    if (!c.shares_pool()) {
      run_prefill_case(runner, cfg, layer, kind, c, s, ceil, out);
      on_case(out.back());
    }
}

}  // namespace dsv4::bench

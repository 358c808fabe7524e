// `dsv4 bench layer`: one attention layer of each kind (SWA, C4A, C128A) of V4-Flash and V4-Pro,
// timed step by step against its floor (issue 14 item 7).
//
// Cases (sizes adjustable, see --help):
//   prefill-8x2048        8 requests x 2048 new tokens from context 0           (16384 tokens)
//   prefill-4x4096@8192   4 requests x 4096 new tokens continuing context 8192  (16384 tokens;
//                         the context is built by earlier, untimed steps)
//   decode-N              N ∈ {1, 32, 128, 256} requests x 1 token at context 4096
//   mtp-128x2             128 requests x 2 tokens at context 4096 (MTP verification)
// Decode and MTP cases share one pool of requests built to the context once per layer; each
// timed step advances its requests' contexts, so later cases run a little past the nominal
// context (reported as context_range).
//
// Per case: wall time of a step (eager forward + stream sync; graph replay once the layer has a
// graph-capturable decode, see WallMode), GPU time (CUDA events at the layer's OpTimer marks),
// per-op GPU and host time, and per op FLOPs / bytes / floor from layer_cost_model.h against the
// ceilings measured at the start of the same run (hw_ceilings.h). The GPU idles --cooldown-ms
// before each case's timed steps: back to back, the tensor-heavy steps hold an H100 at its power
// cap and the next case would start throttled (bench/RESULTS.md, "Sparse attention v9").
#include <algorithm>
#include <cctype>
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <ctime>
#include <functional>
#include <map>
#include <memory>
#include <random>
#include <set>
#include <string>
#include <thread>
#include <vector>

#include <omp.h>

#include "args.h"
#include "bench_harness.h"
#include "commands.h"
#include "dsv4/device_tensor.h"
#include "dsv4/layer.h"
#include "dsv4/status.h"
#include "dsv4/weights.h"
#include "hw_ceilings.h"
#include "layer_bench_report.h"
#include "layer_cost_model.h"
#include "layer_op_timer.h"

#if defined(DSV4_WITH_CUDA)
#include <cuda_runtime.h>

#include "cuda/common/random_fill.h"
#endif

#ifndef DSV4_SOURCE_DIR
#define DSV4_SOURCE_DIR "."
#endif

namespace dsv4::bench {

namespace {

using cli::FlagSpec;
using cli::ParsedArgs;
using Clock = std::chrono::steady_clock;

const std::vector<FlagSpec> kFlags = {
    {"model", true, "models (default v4-flash,v4-pro on cuda, tiny on cpu)", "LIST"},
    {"kind", true, "layer kinds: swa,c4a,c128a (default all; the first layer of each kind)", "LIST"},
    {"phase", true, "phases: prefill,decode,mtp (default all)", "LIST"},
    {"case", true, "keep cases whose name contains one of these (e.g. decode-128,4x4096)", "LIST"},
    {"list", false, "print the selected model / layer / case list and exit"},
    {"backend", true, "cuda | cpu | auto (default auto: cuda where a GPU is visible)", "B"},
    {"prefill-tokens", true, "new tokens of each prefill case (default 16384; cpu 64)", "N"},
    {"context", true, "context of the decode and MTP cases (default 4096; cpu 144)", "N"},
    {"decode-requests", true, "requests of the decode cases (default 1,32,128,256; cpu 1,4)", "LIST"},
    {"mtp-requests", true, "requests of the MTP case, 2 tokens each (default 128; cpu 4; 0 = none)", "N"},
    {"build-chunk", true, "token budget of the untimed steps that build contexts (default 16384)", "N"},
    {"warmup", true, "untimed steps before each case's timed ones (default 2; prefill 1)", "N"},
    {"reps", true, "timed decode / MTP steps per case (default 20; cpu 3)", "N"},
    {"prefill-reps", true, "timed prefill steps per case (default 5; cpu 2)", "N"},
    {"cooldown-ms", true, "GPU idle before each case's timed steps (default 1000; cpu 0)", "MS"},
    {"weights", true, "random weights as fp8 (as the checkpoint ships them) or bf16 (default fp8)", "DT"},
    {"wall", true, "how decode wall time is taken: eager | graph (default eager; graph needs the layer's "
                   "CUDA-graph decode, issue 14 item 2)", "MODE"},
    {"json", true, "write the report as JSON", "FILE"},
    {"plot", true, "draw the report with bench/plot_layer.py (matplotlib) into FILE.png", "FILE"},
    {"commit", true, "commit recorded in the report (default: git of the source tree, else $DSV4_COMMIT)", "SHA"},
    {"seed", true, "seed of weights and inputs (default 1)", "S"},
};

// How a decode case's wall time is taken. eager: forward() + stream sync, host planning and uploads
// included. graph: replay of a CUDA graph captured from the decode step (issue 14 item 2); the
// layer has no capturable decode yet, so asking for it is an error until it does. Hook: when the
// layer gains it, LayerRunner::timed_step captures once per case (fixed-address x / y and the
// layer's step metadata) and times cudaGraphLaunch + sync instead of forward().
enum class WallMode { eager, graph };

struct CaseSpec {
  std::string name;
  std::string phase;  // "prefill", "decode", "mtp"
  int64_t requests = 0, new_tokens = 0, context = 0;
  bool shares_pool() const { return phase != "prefill"; }
};

struct Settings {
  bool cuda = false;
  int64_t prefill_tokens = 16384, context = 4096, mtp_requests = 128, build_chunk = 16384;
  std::vector<int64_t> decode_requests{1, 32, 128, 256};
  int warmup = 2, reps = 20, prefill_reps = 5, cooldown_ms = 1000;
  bool fp8_weights = true;
  WallMode wall = WallMode::eager;
  uint64_t seed = 1;
};

std::vector<std::string> split_list(const std::string& s) {
  std::vector<std::string> out;
  size_t start = 0;
  while (start <= s.size()) {
    const size_t comma = s.find(',', start);
    const std::string item = s.substr(start, comma == std::string::npos ? std::string::npos : comma - start);
    if (!item.empty()) out.push_back(item);
    if (comma == std::string::npos) break;
    start = comma + 1;
  }
  return out;
}

std::string lower(std::string s) {
  for (char& c : s) c = static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
  return s;
}

std::vector<CaseSpec> all_cases(const Settings& s) {
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

// The first layer of each kind (for V4-Pro the only SWA layer is its MTP block's).
std::map<LayerKind, int> first_layer_of_each_kind(const ModelConfig& cfg) {
  std::map<LayerKind, int> out;
  for (int l = 0; l < cfg.n_layers(); ++l) out.emplace(cfg.layer_kind(l), l);
  return out;
}

LayerKind parse_kind(const std::string& s) {
  const std::string k = lower(s);
  if (k == "swa") return LayerKind::swa;
  if (k == "c4a") return LayerKind::c4a;
  if (k == "c128a") return LayerKind::c128a;
  fail_expected("bench layer", "--kind", "swa, c4a or c128a", "'" + s + "'");
}

std::string utc_now() {
  const std::time_t t = std::time(nullptr);
  char buf[32];
  std::strftime(buf, sizeof buf, "%Y-%m-%dT%H:%M:%SZ", std::gmtime(&t));
  return buf;
}

std::string shell_quote(const std::string& s) {
  std::string out = "'";
  for (char c : s) out += c == '\'' ? std::string("'\\''") : std::string(1, c);
  return out + "'";
}

// First line of a shell command's stdout ("" on failure).
std::string command_line(const std::string& cmd) {
  FILE* p = popen(cmd.c_str(), "r");
  if (!p) return "";
  char buf[256] = {0};
  std::string out = std::fgets(buf, sizeof buf, p) ? buf : "";
  if (pclose(p) != 0) return "";
  while (!out.empty() && (out.back() == '\n' || out.back() == '\r')) out.pop_back();
  return out;
}

std::string source_commit() {
  const std::string dir = shell_quote(DSV4_SOURCE_DIR);
  const std::string sha = command_line("git -C " + dir + " rev-parse --short HEAD 2>/dev/null");
  if (!sha.empty()) {
    const std::string dirty = command_line("git -C " + dir + " status --porcelain --untracked-files=no 2>/dev/null");
    return dirty.empty() ? sha : sha + "-dirty";
  }
  if (const char* env = std::getenv("DSV4_COMMIT"); env && *env) return env;
  return "unknown";
}

// Per-layer pool sizes: the largest set of requests resident at once, over the phases of the
// layer's cases (the decode pool; each prefill case's requests). Each request is sized for the
// largest chunk it holds (SWA blocks stay mapped until its next append recycles them) plus the
// next chunk it appends: the layer's capacity check counts no block that recycling would free.
LayerCacheOptions cache_options(const ModelConfig& cfg, LayerKind kind, const std::vector<CaseSpec>& cases,
                                const Settings& s) {
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
      pool_growth += (s.warmup + 2 * s.reps) * c.new_tokens;  // warm-up, op-timed and wall-clock steps
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

// ---- one layer under test ---------------------------------------------------------------------

struct StepTimes {
  double wall_us = 0;
  ForwardTimes ops;  // empty when timed without the op timer
};

// A layer with its own stream (CUDA), op timer, and an input x / output y large enough for any
// step of its cases (x random, on the layer's device: a serving engine's hidden states are there).
class LayerRunner {
 public:
  LayerRunner(const ModelConfig& cfg, int layer, const Settings& s, const LayerCacheOptions& caches,
              int64_t max_tokens)
      : cuda_(s.cuda), stream_(make_stream(s.cuda)), timer_(make_timer(s.cuda)),
        layer_(cfg, layer, random_attention_weights(cfg, layer, s.seed, s.fp8_weights),
               options(s, caches, stream_.get(), timer_.get())) {
    const std::vector<int64_t> dims{max_tokens, cfg.dim};
    if (cuda_) {
#if defined(DSV4_WITH_CUDA)
      x_dev_ = DeviceTensor(DType::bf16, dims);
      y_dev_ = DeviceTensor(DType::fp32, dims);
      cuda::fill_random_bf16(x_dev_.view().data, x_dev_.numel(), s.seed, -1.0f, 1.0f, stream_.get());
      sync();
#endif
    } else {
      x_host_ = HostTensor(DType::fp32, dims);
      y_host_ = HostTensor(DType::fp32, dims);
      std::mt19937_64 rng(s.seed);
      std::normal_distribution<float> n(0.0f, 1.0f);
      float* x = x_host_.data<float>();
      for (int64_t i = 0; i < x_host_.numel(); ++i) x[i] = n(rng);
    }
  }
  ~LayerRunner() = default;

  int64_t new_request() { return next_id_++; }
  void release(int64_t id) { layer_.release(id); }

  // One forward of `steps`. With op timing, the per-op times of this forward come back.
  StepTimes step(const std::vector<RequestStep>& steps, bool op_timing) {
    const BatchPlan plan = BatchPlan::make(steps);
    const int64_t T = plan.num_tokens();
    const TensorView x = (cuda_ ? x_dev_.view() : x_host_.view()).slice0(0, T);
    const TensorView y = (cuda_ ? y_dev_.view() : y_host_.view()).slice0(0, T);
    timer_->reset();
    timer_->set_enabled(op_timing);
    const auto t0 = Clock::now();
    layer_.forward(plan, x, y);
    sync();
    StepTimes out;
    out.wall_us = std::chrono::duration<double, std::micro>(Clock::now() - t0).count();
    if (op_timing) out.ops = timer_->collect();
    return out;
  }

  // Runs `requests` (ids) from their current context to `target` in untimed steps of at most
  // `budget` tokens (whole requests first, in order, as a chunked-prefill scheduler does).
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
  struct StreamDeleter {
    void operator()(CUstream_st* s) const {
#if defined(DSV4_WITH_CUDA)
      if (s) cudaStreamDestroy(s);
#else
      (void)s;
#endif
    }
  };
  using StreamPtr = std::unique_ptr<CUstream_st, StreamDeleter>;

  static StreamPtr make_stream(bool cuda) {
#if defined(DSV4_WITH_CUDA)
    if (cuda) {
      cudaStream_t s = nullptr;
      if (cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking) != cudaSuccess)
        fail("bench layer: cudaStreamCreate failed");
      return StreamPtr(s);
    }
#endif
    (void)cuda;
    return StreamPtr(nullptr);
  }
  static std::unique_ptr<TimingOpTimer> make_timer(bool cuda) {
    if (cuda) return std::make_unique<CudaEventOpTimer>();
    return std::make_unique<HostOpTimer>();
  }
  static AttentionOptions options(const Settings& s, const LayerCacheOptions& caches, Stream stream,
                                  OpTimer* timer) {
    AttentionOptions o;
    o.backend = s.cuda ? Backend::cuda : Backend::cpu;
    o.stream = stream;
    o.caches = caches;
    o.op_timer = timer;
    return o;
  }
  void sync() {
#if defined(DSV4_WITH_CUDA)
    if (cuda_ && cudaStreamSynchronize(stream_.get()) != cudaSuccess) fail("bench layer: cudaStreamSynchronize failed");
#endif
  }

  bool cuda_;
  // Destroyed in reverse: the layer (which uses the timer and the stream) goes first.
  StreamPtr stream_;
  std::unique_ptr<TimingOpTimer> timer_;
  Attention layer_;
  DeviceTensor x_dev_, y_dev_;
  HostTensor x_host_, y_host_;
  int64_t next_id_ = 0;
};

void cooldown(const Settings& s) {
  if (s.cooldown_ms > 0) std::this_thread::sleep_for(std::chrono::milliseconds(s.cooldown_ms));
}

// Folds a case's timed steps into its report (ops priced on the first timed step's plan).
CaseReport make_report(const ModelConfig& cfg, int layer, LayerKind kind, const CaseSpec& c, const Settings& s,
                       const Ceilings& ceil, const BatchPlan& first_plan, const std::vector<StepTimes>& timed,
                       const std::vector<double>& wall_us, int64_t ctx_min, int64_t ctx_max) {
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
  r.wall_us = median(wall_us);
  r.gpu_us = med.gpu_us;
  r.host_us = med.host_us;
  const StepShape shape = StepShape::make(cfg, kind, first_plan, s.fp8_weights);
  for (const OpTime& o : med.ops) {
    OpReport op{o.name, o.gpu_us, o.host_us, op_cost(o.name, shape), 0.0};
    if (op.cost) op.floor_us = op.cost->floor_us(ceil);
    r.ops.push_back(std::move(op));
  }
  return r;
}

// The decode / MTP cases of one layer over a shared pool of requests built to the context.
void run_pool_cases(LayerRunner& runner, const ModelConfig& cfg, int layer, LayerKind kind,
                    const std::vector<CaseSpec>& cases, const Settings& s, const Ceilings& ceil,
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
    std::vector<double> wall;
    int64_t ctx_min = INT64_MAX, ctx_max = 0;
    BatchPlan first_plan;
    for (int pass = 0; pass < 2; ++pass) {  // 0: op timing, 1: wall clock without the timer
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
        else wall.push_back(t.wall_us);
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
                      const Settings& s, const Ceilings& ceil, std::vector<CaseReport>& out) {
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
  std::vector<double> wall;
  BatchPlan first_plan;
  for (int i = 0; i < sets; ++i) {
    std::vector<RequestStep> steps;
    for (int64_t id : ids[i]) steps.push_back({id, context[id], c.new_tokens});
    StepTimes t = runner.step(steps, true);
    for (int64_t id : ids[i]) runner.release(id);
    if (i < warmup) continue;
    if (timed.empty()) first_plan = BatchPlan::make(steps);
    wall.push_back(t.wall_us);
    timed.push_back(std::move(t));
  }
  out.push_back(make_report(cfg, layer, kind, c, s, ceil, first_plan, timed, wall, c.context, c.context));
}

void usage() {
  std::puts(cli::format_help(
                "dsv4 bench layer [options]  — one layer of each kind against its floor (issue 14)\n"
                "  Cases: prefill-8x(P/8) from context 0, prefill-4x(P/4)@(P/2) continuing context P/2,\n"
                "  decode-N (N requests x 1 token at the context), mtp-Mx2; P = --prefill-tokens.\n"
                "  Ceilings (FP8 / bf16 GEMM, copy) are measured first; per op floor = max(FLOPs / tensor\n"
                "  ceiling, bytes / copy ceiling) (tools/dsv4/layer_cost_model.h).",
                kFlags)
                .c_str());
}

}  // namespace

int run_layer_bench_cli(const std::vector<std::string>& raw) {
  const ParsedArgs a = cli::parse_args("bench layer", raw, kFlags);
  if (a.has("help")) {
    usage();
    return 0;
  }
  Settings s;
  const std::string backend = a.get_string("backend", "auto");
  if (backend != "cpu" && backend != "cuda" && backend != "auto")
    fail_expected("bench layer", "--backend", "cpu, cuda or auto", backend);
  s.cuda = backend == "cuda" || (backend == "auto" && cuda_available());
  if (s.cuda && !cuda_available())
    fail("bench layer: --backend cuda: ", cuda_built() ? "no CUDA device is visible" : "this build has no CUDA backend",
         "; use --backend cpu");
  // CPU: sizes a reference backend runs in seconds (a plumbing check of the bench itself).
  s.prefill_tokens = a.get_int("prefill-tokens", s.cuda ? 16384 : 64);
  s.context = a.get_int("context", s.cuda ? 4096 : 144);
  s.decode_requests = a.get_int_list("decode-requests", s.cuda ? std::vector<int64_t>{1, 32, 128, 256}
                                                               : std::vector<int64_t>{1, 4});
  s.mtp_requests = a.get_int("mtp-requests", s.cuda ? 128 : 4);
  s.build_chunk = a.get_int("build-chunk", 16384);
  s.warmup = static_cast<int>(a.get_int("warmup", 2));
  s.reps = static_cast<int>(a.get_int("reps", s.cuda ? 20 : 3));
  s.prefill_reps = static_cast<int>(a.get_int("prefill-reps", s.cuda ? 5 : 2));
  s.cooldown_ms = static_cast<int>(a.get_int("cooldown-ms", s.cuda ? 1000 : 0));
  s.seed = static_cast<uint64_t>(a.get_int("seed", 1));
  const std::string weights = a.get_string("weights", "fp8");
  if (weights != "fp8" && weights != "bf16") fail_expected("bench layer", "--weights", "fp8 or bf16", weights);
  s.fp8_weights = weights == "fp8";
  const std::string wall = a.get_string("wall", "eager");
  if (wall != "eager" && wall != "graph") fail_expected("bench layer", "--wall", "eager or graph", wall);
  s.wall = wall == "graph" ? WallMode::graph : WallMode::eager;
  if (s.context < 1) fail_expected("bench layer", "--context", ">= 1", s.context);
  if (s.mtp_requests < 0) fail_expected("bench layer", "--mtp-requests", ">= 0", s.mtp_requests);
  if (s.build_chunk < 1) fail_expected("bench layer", "--build-chunk", ">= 1", s.build_chunk);
  if (s.warmup < 0) fail_expected("bench layer", "--warmup", ">= 0", s.warmup);
  if (s.reps < 1) fail_expected("bench layer", "--reps", ">= 1", s.reps);
  if (s.prefill_reps < 1) fail_expected("bench layer", "--prefill-reps", ">= 1", s.prefill_reps);
  if (s.cooldown_ms < 0) fail_expected("bench layer", "--cooldown-ms", ">= 0", s.cooldown_ms);

  // Selection: models x kinds x cases.
  const std::vector<std::string> models = split_list(a.get_string("model", s.cuda ? "v4-flash,v4-pro" : "tiny"));
  if (models.empty()) fail_expected("bench layer", "--model", "a model name", "''");
  std::set<LayerKind> kinds;
  for (const std::string& k : split_list(a.get_string("kind", "swa,c4a,c128a"))) kinds.insert(parse_kind(k));
  std::set<std::string> phases;
  for (const std::string& p : split_list(a.get_string("phase", "prefill,decode,mtp"))) {
    const std::string q = lower(p);
    if (q != "prefill" && q != "decode" && q != "mtp") fail_expected("bench layer", "--phase", "prefill, decode or mtp", p);
    phases.insert(q);
  }
  const std::vector<std::string> case_filters = split_list(a.get_string("case", ""));
  std::vector<CaseSpec> cases;
  for (const CaseSpec& c : all_cases(s)) {
    if (!phases.count(c.phase)) continue;
    bool keep = case_filters.empty();
    for (const std::string& f : case_filters) keep = keep || c.name.find(f) != std::string::npos;
    if (keep) cases.push_back(c);
  }
  std::vector<std::pair<ModelConfig, std::vector<std::pair<LayerKind, int>>>> plan;
  for (const std::string& m : models) {
    ModelConfig cfg = ModelConfig::builtin(m);
    if (cfg.family != "v4") fail_expected("bench layer", "--model", "a DeepSeek-V4 model", m + " (family " + cfg.family + ")");
    std::vector<std::pair<LayerKind, int>> layers;
    for (const auto& [kind, layer] : first_layer_of_each_kind(cfg))
      if (kinds.count(kind)) layers.emplace_back(kind, layer);
    plan.emplace_back(std::move(cfg), std::move(layers));
  }
  if (cases.empty()) fail("bench layer: no case matches --phase / --case");
  if (a.has("list")) {
    for (const auto& [cfg, layers] : plan)
      for (const auto& [kind, layer] : layers)
        for (const CaseSpec& c : cases)
          std::printf("%-9s layer %-3d %-6s %-22s %5lld requests x %-5lld context %lld\n", cfg.name.c_str(), layer,
                      std::string(layer_kind_name(kind)).c_str(), c.name.c_str(), static_cast<long long>(c.requests),
                      static_cast<long long>(c.new_tokens), static_cast<long long>(c.context));
    return 0;
  }
  if (s.wall == WallMode::graph)
    fail("bench layer: --wall graph: the layer has no CUDA-graph-capturable decode step yet (issue 14 item 2: "
         "fixed-address step metadata, no host sync in forward); run with --wall eager");

  const auto started = Clock::now();
  LayerBenchReport report;
  report.backend = s.cuda ? "cuda" : "cpu";
  report.device = s.cuda ? device_name() : detail::concat("cpu (", omp_get_max_threads(), " OpenMP threads)");
  report.commit = a.has("commit") ? a.get_string("commit") : source_commit();
  report.date = utc_now();
  std::fprintf(stderr, "dsv4 bench layer: %s, commit %s, measuring ceilings\n", report.device.c_str(), report.commit.c_str());
  report.ceilings = s.cuda ? measure_cuda_ceilings() : measure_cpu_ceilings();
  report.settings = {{"prefill_tokens", s.prefill_tokens}, {"context", s.context},
                     {"decode_requests", s.decode_requests}, {"mtp_requests", s.mtp_requests},
                     {"build_chunk", s.build_chunk}, {"warmup", s.warmup}, {"reps", s.reps},
                     {"prefill_reps", s.prefill_reps}, {"cooldown_ms", s.cooldown_ms},
                     {"weights", weights}, {"wall", wall}, {"seed", s.seed}};
  std::printf("dsv4 bench layer: %s, backend %s, commit %s, %s\n", report.device.c_str(), report.backend.c_str(),
              report.commit.c_str(), report.date.c_str());
  print_ceilings(stdout, report.ceilings);
  std::fflush(stdout);
  const Ceilings& ceil = report.ceilings.value;

  for (const auto& [cfg, layers] : plan) {
    for (const auto& [kind, layer] : layers) {
      int64_t max_tokens = 0;
      for (const CaseSpec& c : cases) max_tokens = std::max(max_tokens, c.requests * c.new_tokens);
      max_tokens = std::max(max_tokens, s.build_chunk);
      const auto t0 = Clock::now();
      std::fprintf(stderr, "%s layer %d (%s): building the layer\n", cfg.name.c_str(), layer,
                   std::string(layer_kind_name(kind)).c_str());
      // Scoped: the layer's weights, caches and workspaces are freed before the next one's.
      LayerRunner runner(cfg, layer, s, cache_options(cfg, kind, cases, s), max_tokens);
      std::fprintf(stderr, "  layer ready (%.1f s)\n", std::chrono::duration<double>(Clock::now() - t0).count());
      auto done = [&](const CaseReport& r) {
        print_case(stdout, r, ceil);
        std::fflush(stdout);
      };
      std::vector<CaseSpec> pool_cases;
      for (const CaseSpec& c : cases)
        if (c.shares_pool()) pool_cases.push_back(c);
      // Fewest requests first: the pool's shared requests drift the least in the small cases.
      std::stable_sort(pool_cases.begin(), pool_cases.end(), [](const CaseSpec& x, const CaseSpec& y) {
        return x.phase != y.phase ? x.phase == "decode" : x.requests < y.requests;
      });
      run_pool_cases(runner, cfg, layer, kind, pool_cases, s, ceil, report.cases, done);
      for (const CaseSpec& c : cases)
        if (!c.shares_pool()) {
          run_prefill_case(runner, cfg, layer, kind, c, s, ceil, report.cases);
          done(report.cases.back());
        }
    }
  }
  std::printf("\n%zu cases in %.1f s. GPU us: %s; wall us: %s; floor: tools/dsv4/layer_cost_model.h.\n",
              report.cases.size(), std::chrono::duration<double>(Clock::now() - started).count(),
              s.cuda ? "CUDA events at the layer's op marks (idle the host leaves inside a forward included)"
                     : "host clock at the layer's op marks",
              s.wall == WallMode::graph ? "graph replay + sync" : "eager forward + stream sync");
  bool unmodeled = false;
  for (const CaseReport& c : report.cases) unmodeled = unmodeled || !c.unmodeled_ops().empty();
  if (unmodeled)
    std::fprintf(stderr, "dsv4 bench layer: WARNING: some ops have no cost model entry (UNMODELED above); "
                         "their cases' floors leave them out\n");

  std::string json_path = a.get_string("json");
  const std::string plot_path = a.get_string("plot");
  if (json_path.empty() && !plot_path.empty()) json_path = plot_path + ".json";
  if (!json_path.empty()) {
    write_json(report, json_path);
    std::printf("wrote %s\n", json_path.c_str());
  }
  if (!plot_path.empty()) {
    std::fflush(stdout);
    const std::string script = std::string(DSV4_SOURCE_DIR) + "/bench/plot_layer.py";
    const std::string cmd = "python3 " + shell_quote(script) + " " + shell_quote(json_path) + " " + shell_quote(plot_path);
    if (std::system(cmd.c_str()) == 0) {
      std::printf("wrote %s\n", plot_path.c_str());
    } else {
      std::fprintf(stderr, "dsv4 bench layer: the plot was not drawn (python3 with matplotlib needed); the report is "
                           "in %s; draw it later with:\n  python3 bench/plot_layer.py %s %s\n",
                   json_path.c_str(), json_path.c_str(), plot_path.c_str());
    }
  }
  return 0;
}

}  // namespace dsv4::bench

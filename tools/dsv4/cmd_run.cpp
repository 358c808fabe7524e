// `dsv4 run`: the main job — a serving simulation through a model's attention stack.
#include <climits>
#include <cstdint>
#include <cstdio>
#include <fstream>
#include <iostream>
#include <nlohmann/json.hpp>
#include <unistd.h>

#include "args.h"
#include "commands.h"
#include "dsv4/checked_math.h"
#include "dsv4/communicator.h"
#include "dsv4/device_tensor.h"
#include "dsv4/model.h"
#include "dsv4/status.h"
#include "dsv4/tensor_parallel.h"
#include "runtime/device_runtime.h"
#include "kv_pools.h"
#include "serving_sim.h"

namespace dsv4::cli {

namespace {
const std::vector<FlagSpec> kFlags = {
    {"model", true, "built-in model config (v4-flash, v4-pro, v3.2, tiny, tiny-h64, tiny-v3.2)", "NAME"},
    {"config", true, "a DeepSeek-V4 or V3.2 config.json (file or checkpoint directory)", "PATH"},
    {"weights", true, "checkpoint directory to load the layers' weights from (else seeded random)", "DIR"},
    {"layers", true, "layers to run, e.g. 0,2,3 or 0-5 (default: all)", "LIST"},
    {"requests", true, "number of requests (default 4)", "N"},
    {"prompt-len", true, "prompt length, one value or one per request (default 256)", "N[,N...]"},
    {"decode-steps", true, "decode steps per request after its prompt (default 16)", "M"},
    {"chunk", true, "token budget per step for chunked prefill (default 256)", "C"},
    {"kv-memory", true, "KV cache budget: bytes (8G, 512M) or a % of free GPU / host memory (default 40% cuda, 25% cpu)", "SIZE"},
    {"max-running", true, "most requests running at once (default 0: as many as the cache holds)", "N"},
    {"seed", true, "seed for weights and inputs (default 1)", "S"},
    {"backend", true, "cpu | cuda | auto (default auto)", "B"},
    {"kv-layout", true, "layout of the SWA and compressed KV caches: model1 (MODEL1_FP8, default), bf16 "
                        "(full-width bf16 rows) or fp8-tensor (full-width e4m3 rows, one scale)", "L"},
    {"kv-scale", true, "the fp8-tensor caches' scale, value = fp8 * S (default 1)", "S"},
    {"q-scale", true, "with --kv-layout fp8-tensor the decodes read FP8 queries: their scale, "
                      "q = fp8 * S (default 1)", "S"},
    {"tp", true, "tensor-parallel ranks per layer, a divisor of the heads and wo_a groups: on cuda "
                 "rank r on GPU r (N GPUs, one NCCL group), on cpu threads summing y in process "
                 "(default 1)", "N"},
    {"check", false, "re-run a sample of requests through the float64 reference; exit 3 if off"},
    {"check-requests", true, "requests to check with --check (default 1)", "N"},
    {"tolerance", true, "--check tolerance, max|y-ref|/max|ref| per token (default 3e-2 cpu, 8e-2 cuda)", "T"},
    {"no-warmup", false, "cuda: skip the untimed warm-up (a prefill and a decode step of stand-in requests) "
                         "before the run, so the first steps' one-time costs are timed"},
    {"json", true, "write the report as JSON to FILE", "FILE"},
    {"quiet", false, "no progress lines"},
    {"help", false, "this help"},
};

void print_table(const SimReport& rep) {
  std::printf("\n%-8s %8s %9s %10s %12s %10s %10s %10s\n", "phase", "steps", "tokens", "time (s)", "tokens/s",
              "p50 (ms)", "p99 (ms)", "TFLOP/s");
  PhaseStats total{"total"};
  for (const PhaseStats& p : rep.phases) {
    total.steps += p.steps;
    total.tokens += p.tokens;
    total.seconds += p.seconds;
    total.flops += p.flops;
    total.step_seconds.insert(total.step_seconds.end(), p.step_seconds.begin(), p.step_seconds.end());
  }
  auto row = [](const PhaseStats& p) {
    const double tps = p.seconds > 0 ? p.tokens / p.seconds : 0.0;
    const double tf = p.seconds > 0 ? p.flops / p.seconds * 1e-12 : 0.0;
    std::printf("%-8s %8lld %9lld %10.3f %12.1f %10.3f %10.3f %10.4f\n", p.phase.c_str(),
                static_cast<long long>(p.steps), static_cast<long long>(p.tokens), p.seconds, tps,
                p.p50_ms(), p.p99_ms(), tf);
  };
  for (const PhaseStats& p : rep.phases) row(p);
  row(total);
  if (rep.warmup_requests > 0)
    std::printf("(before the run, untimed: a warm-up prefill of %d x %lld tokens and one decode step, %.1f ms)\n",
                rep.warmup_requests, static_cast<long long>(rep.warmup_prompt), 1e3 * rep.warmup_seconds);
  if (!rep.memory.empty()) {
    // The warm-up's reservation, per layer (all layers of a run hold the same sizes but for
    // their kind's caches): what a serving engine budgets for.
    auto mib = [](int64_t b) { return static_cast<double>(b) / (1 << 20); };
    std::printf("\nmemory per layer (reserved for steps of %lld tokens, %d requests, context %lld): "
                "weights / caches / workspace / step upload, MiB\n",
                static_cast<long long>(rep.reserved.max_tokens), rep.reserved.max_requests,
                static_cast<long long>(rep.reserved.max_context));
    for (size_t l = 0; l < rep.memory.size(); ++l) {
      const LayerMemory& m = rep.memory[l];
      std::printf("  layer %zu: %.1f / %.1f / %.1f (%.1f used) / %.2f\n", l, mib(m.weights), mib(m.caches),
                  mib(m.workspace), mib(m.workspace_used), mib(m.step_upload));
    }
    if (rep.reservation_outgrown) std::printf("  WARNING: a step outgrew the reservation (it allocated)\n");
  }
  const SchedulerStats& st = rep.scheduler;
  std::printf("\nscheduler: %lld request(s) waited for cache, %lld preemption(s) of %lld request(s), "
              "%lld token(s) recomputed, at most %d running\n",
              static_cast<long long>(st.waited_requests), static_cast<long long>(st.preemptions),
              static_cast<long long>(st.preempted_requests), static_cast<long long>(st.recomputed_tokens),
              st.peak_running);
  if (!rep.checks.empty()) {
    std::printf("\ncheck against the float64 reference (tolerance %.1e):\n", rep.check_tolerance);
    std::printf("%-6s %-6s %8s %14s  %s\n", "layer", "kind", "tokens", "max rel err", "");
    for (const LayerCheck& c : rep.checks)
      std::printf("%-6d %-6s %8lld %14.3e  %s\n", c.layer, c.kind_name.c_str(),
                  static_cast<long long>(c.tokens), c.max_rel_err,
                  c.max_rel_err <= rep.check_tolerance ? "ok" : "FAIL");
    std::printf("check: %s\n", rep.check_passed ? "passed" : "FAILED");
  }
}

nlohmann::json to_json(const SimReport& rep, const ModelConfig& cfg, const SimConfig& sc,
                       const KvPoolSizes& pools, int64_t kv_budget, const char* backend, int tp) {
  nlohmann::json j;
  j["model"] = cfg.name;
  j["backend"] = backend;
  j["tp"] = tp;
  j["requests"] = sc.requests;
  j["prompt_lens"] = sc.prompt_lens;
  j["decode_steps"] = sc.decode_steps;
  j["chunk"] = sc.chunk;
  j["max_running"] = sc.max_running;
  for (const PhaseStats& p : rep.phases)
    j["phases"].push_back({{"phase", p.phase}, {"steps", p.steps}, {"tokens", p.tokens},
                           {"seconds", p.seconds}, {"flops", p.flops},
                           {"tokens_per_s", p.seconds > 0 ? p.tokens / p.seconds : 0.0},
                           {"p50_ms", p.p50_ms()}, {"p99_ms", p.p99_ms()}});
  const SchedulerStats& st = rep.scheduler;
  j["scheduler"] = {{"waited_requests", st.waited_requests}, {"preemptions", st.preemptions},
                    {"preempted_requests", st.preempted_requests},
                    {"recomputed_tokens", st.recomputed_tokens}, {"peak_running", st.peak_running}};
  j["kv_cache"] = {{"budget_bytes", kv_budget}, {"bytes", pools.bytes},
                   {"all_resident_bytes", pools.all_resident_bytes},
                   {"resident_requests", pools.resident_requests}, {"swa_blocks", pools.swa_blocks},
                   {"compressed_blocks", pools.compressed_blocks}, {"state_blocks", pools.state_blocks}};
  j["warmup"] = {{"requests", rep.warmup_requests}, {"prompt", rep.warmup_prompt},
                 {"seconds", rep.warmup_seconds}};
  j["reserved"] = {{"max_tokens", rep.reserved.max_tokens}, {"max_requests", rep.reserved.max_requests},
                   {"max_context", rep.reserved.max_context}, {"outgrown", rep.reservation_outgrown}};
  for (const LayerMemory& m : rep.memory)
    j["memory"].push_back({{"weights_bytes", m.weights}, {"caches_bytes", m.caches},
                           {"workspace_bytes", m.workspace}, {"workspace_used_bytes", m.workspace_used},
                           {"step_upload_bytes", m.step_upload}});
  for (const LayerCheck& c : rep.checks)
    j["check"]["layers"].push_back({{"layer", c.layer}, {"kind", c.kind_name},
                                    {"tokens", c.tokens}, {"max_rel_err", c.max_rel_err}});
  if (!rep.checks.empty()) {
    j["check"]["tolerance"] = rep.check_tolerance;
    j["check"]["passed"] = rep.check_passed;
  }
  return j;
}
}  // namespace

int cmd_run(const Args& raw) {
  const ParsedArgs a = parse_args("run", raw, kFlags);
  if (a.has("help")) {
    std::puts(format_help("dsv4 run [options]  — serving simulation through the attention stack", kFlags).c_str());
    return 0;
  }
  if (a.has("model") && a.has("config")) fail("run: give --model or --config, not both");
  const ModelConfig cfg = a.has("config") ? ModelConfig::from_json_file(a.get_string("config"))
                                          : ModelConfig::builtin(a.get_string("model", "v4-flash"));
  StackOptions so;
  if (a.has("layers")) so.layers = parse_layer_list(a.get_string("layers"), cfg.n_layers());
  so.weights_dir = a.get_string("weights");
  so.seed = static_cast<uint64_t>(a.get_int("seed", 1, 0, INT64_MAX));
  const std::string backend = a.get_string("backend", "auto");
  if (backend != "cpu" && backend != "cuda" && backend != "auto")
    fail_expected("run", "--backend", "cpu, cuda or auto", backend);
  // auto: the GPU when the build has CUDA and a device is visible, else the CPU reference.
  const bool v32 = cfg.family == "v3.2";
  const bool use_cuda = backend == "cuda" || (backend == "auto" && cuda_available());
  if (use_cuda && !cuda_available())
    fail("run: --backend cuda: ", cuda_built() ? "no CUDA device is visible" : "this build has no CUDA backend",
         "; use --backend cpu (or auto)");
  so.attention.backend = use_cuda ? Backend::cuda : Backend::cpu;
  const std::string kv_layout = a.get_string("kv-layout", "model1");
  if (kv_layout == "model1") so.attention.caches.layout = KvLayout::model1_fp8;
  else if (kv_layout == "bf16") so.attention.caches.layout = KvLayout::bf16;
  else if (kv_layout == "fp8-tensor") so.attention.caches.layout = KvLayout::fp8_per_tensor;
  else fail_expected("run", "--kv-layout", "model1, bf16 or fp8-tensor", kv_layout);
  // The fp8-tensor caches' scale and their FP8 queries' (default 1, as vLLM's).
  const auto per_tensor_scale = [&](const char* flag) {
    if (a.has(flag) && kv_layout != "fp8-tensor")
      fail("run: --", flag, ": applies to --kv-layout fp8-tensor only, got --kv-layout ", kv_layout);
    return static_cast<float>(a.get_positive_double(flag, 1.0));
  };
  so.attention.caches.kv_scale = per_tensor_scale("kv-scale");
  so.attention.caches.q_scale = per_tensor_scale("q-scale");
  if (kv_layout != "model1" && v32)
    fail("run: --kv-layout ", kv_layout, ": the DeepSeek-V3.2 layer has its own 656-byte cache layout");
  so.tp = static_cast<int>(a.get_int("tp", 1, 1, 128));
  if (so.tp > 1 && v32) fail("run: --tp: the DeepSeek-V3.2 sparse-MLA layer has no tensor-parallel split");
  if (so.tp > 1) check_tensor_parallel(cfg, {0, so.tp, nullptr}, "run: --tp");
  if (so.tp > 1 && use_cuda) {
    // Refused here, before the pools are sized and the weights made, not by the stack.
    const size_t visible = rt::devices(nullptr).size();
    if (visible < static_cast<size_t>(so.tp))
      fail("run: --tp ", so.tp, " --backend cuda: expected ", so.tp, " visible GPUs (rank r runs on GPU r), got ",
           visible, "; use --backend cpu to emulate the ranks as threads");
    if (!nccl_built())
      fail("run: --tp ", so.tp, " --backend cuda: this build has no NCCL (configure with DSV4_NCCL=AUTO or ON and "
           "NCCL installed); use --backend cpu to emulate the ranks as threads");
  }

  // Every count is read exactly and bounded here, before it sizes anything: a sequence never
  // exceeds max_position (so prompt + steps below cannot overflow), a step's tokens fit int32.
  SimConfig sc;
  sc.requests = static_cast<int>(a.get_int("requests", 4, 1, INT_MAX));
  sc.prompt_lens = a.get_int_list("prompt-len", {256}, 1, cfg.max_position);
  sc.decode_steps = a.get_int("decode-steps", 16, 0, cfg.max_position - 1);
  sc.chunk = a.get_int("chunk", 256, 1, INT32_MAX);
  sc.warmup = !a.has("no-warmup");
  sc.seed = so.seed;
  sc.kv_layout = so.attention.caches.layout;
  sc.kv_scale = so.attention.caches.kv_scale;
  sc.q_scale = so.attention.caches.q_scale;
  sc.check_requests = a.has("check") ? static_cast<int>(a.get_int("check-requests", 1, 0, sc.requests)) : 0;
  // The CUDA kernels feed the softmax weights to the P·V MMA as bf16 (as FlashMLA does), and the
  // FP8 projections accumulate on FP8 tensor cores with a short accumulator (about 1e-2 of |y|
  // where the terms cancel); the FP8 quantizations of the GEMM inputs and of o amplify those
  // moves into whole-FP8-step flips of a share of the elements: measured up to 4.1e-2 per token
  // on v4-flash layers 0/2/3 (H100, 2026-11-25; 3.6e-2 before the FP8 GEMMs). Semantic errors
  // are O(1), so 8e-2 still separates them.
  sc.check_tolerance = a.get_positive_double("tolerance", use_cuda ? 8e-2 : 3e-2);
  const int64_t max_running = a.get_int("max-running", 0);
  if (max_running < 0 || max_running > INT32_MAX)
    fail_expected("run", "--max-running", "0..2147483647 (0: no limit)", max_running);
  sc.max_running = static_cast<int>(max_running);
  validate_sim_config(sc, cfg);  // before the (slow) stack is built

  // Pools sized from the workload within the budget; the scheduler queues or preempts whatever
  // does not fit at once. The default leaves room for weights and workspaces.
  const std::string kv_memory = a.get_string("kv-memory", use_cuda ? "40%" : "25%");
  const int64_t kv_budget = parse_memory_size(
      "kv-memory", kv_memory, !kv_memory.empty() && kv_memory.back() == '%' ? memory_for_kv_budget(use_cuda) : 0);
  std::vector<int> layer_ids = so.layers;
  if (layer_ids.empty())
    for (int l = 0; l < cfg.n_layers(); ++l) layer_ids.push_back(l);
  const KvPoolSizes pools =
      size_kv_pools(cfg, layer_ids, so.attention.caches, {request_prompts(sc), sc.decode_steps, sc.chunk}, kv_budget);
  so.attention.caches.swa_blocks = pools.swa_blocks;
  so.attention.caches.compressed_blocks = pools.compressed_blocks;
  so.attention.caches.state_blocks = pools.state_blocks;

  const bool quiet = a.has("quiet");
  const std::string tp_note = so.tp == 1 ? ""
                              : use_cuda ? ", tp " + std::to_string(so.tp) + " (rank r on GPU r, one thread each, NCCL)"
                                         : ", tp " + std::to_string(so.tp) + " (ranks as threads)";
  std::fprintf(stderr, "dsv4 run: model %s, %d layers, %d requests, backend %s%s\n", cfg.name.c_str(),
               so.layers.empty() ? cfg.n_layers() : static_cast<int>(so.layers.size()), sc.requests,
               use_cuda ? "cuda" : "cpu", tp_note.c_str());
  const std::string blocks =
      v32 ? std::to_string(pools.swa_blocks) + " blocks of latent rows and indexer keys per layer"
          : std::to_string(pools.swa_blocks) + " SWA, " + std::to_string(pools.compressed_blocks) +
                " compressed, " + std::to_string(pools.state_blocks) + " state blocks per layer";
  std::fprintf(stderr, "kv cache: %s of a %s budget (%s); %s\n", format_bytes(pools.bytes).c_str(),
               format_bytes(kv_budget).c_str(), blocks.c_str(),
               pools.resident_requests >= sc.requests
                   ? "every request fits at once"
                   : ("about " + std::to_string(pools.resident_requests) + " of " + std::to_string(sc.requests) +
                      " requests fit at once, the rest wait (all at once would take " +
                      format_bytes(pools.all_resident_bytes) + ")").c_str());
  AttentionStack stack(cfg, so);
  const SimReport rep = run_serving_sim(stack, sc, [&](const std::string& line) {
    if (!quiet) std::fprintf(stderr, "  %s\n", line.c_str());
  });
  std::printf("model %s, backend %s, layers:", cfg.name.c_str(), use_cuda ? "cuda" : "cpu");
  for (int l = 0; l < stack.num_layers(); ++l)
    std::printf(" %d(%s)", stack.layer_index(l), v32 ? "MLA" : std::string(layer_kind_name(stack.layer_kind(l))).c_str());
  std::printf("\n");
  print_table(rep);
  if (a.has("json")) {
    std::ofstream f(a.get_string("json"));
    if (!f) fail("run: --json: cannot write '", a.get_string("json"), "'");
    f << to_json(rep, cfg, sc, pools, kv_budget, use_cuda ? "cuda" : "cpu", so.tp).dump(2) << "\n";
  }
  return rep.check_passed ? 0 : 3;
}

}  // namespace dsv4::cli

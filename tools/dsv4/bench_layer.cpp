// `dsv4 bench layer`: one attention layer of each kind (SWA, C4A, C128A) of V4-Flash and V4-Pro,
// timed step by step against its floor (issue 14 item 7). This file is the command: flags, the
// selection of models / layers / cases, the ceilings, the report's output and the plot. The cases
// and how they run: layer_bench_runner.h; the floors: layer_cost_model.h; the report:
// layer_bench_report.h.
//
// The GPU idles --cooldown-ms before each case's timed steps: back to back, the tensor-heavy steps
// hold an H100 at its power cap and the next case would start throttled (docs/notes/history.md,
// "Sparse attention v9").
#include <cctype>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <ctime>
#include <map>
#include <set>
#include <string>
#include <vector>

#include <omp.h>

#include "args.h"
#include "bench_harness.h"
#include "dsv4/communicator.h"
#include "dsv4/device_tensor.h"
#include "dsv4/status.h"
#include "dsv4/tensor_parallel.h"
#include "hw_ceilings.h"
#include "layer_bench_report.h"
#include "layer_bench_runner.h"

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
    {"host-only", false, "time only the host planning of the decode / MTP steps (no GPU, no weights; "
                         "sizes default to the GPU cases')"},
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
    {"wall", true, "how decode wall time is taken: graph (default: the layer's CUDA-graph replay) | "
                   "eager (graphs off)", "MODE"},
    {"json", true, "write the report as JSON", "FILE"},
    {"plot", true, "draw the report with bench/plot_layer.py (matplotlib) into FILE.png", "FILE"},
    {"commit", true, "commit recorded in the report (default: git of the source tree, else $DSV4_COMMIT)", "SHA"},
    {"seed", true, "seed of weights and inputs (default 1)", "S"},
    {"tp", true, "N-way tensor-parallel split: with N GPUs visible (cuda, NCCL) every rank on its GPU, "
                 "the all-reduce of y timed; else rank 0's shard (heads/N, wo_a groups/N) on one device, "
                 "without the all-reduce (default 1)", "N"},
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

// The settings from the flags (CPU defaults: sizes the reference backend runs in seconds, a
// plumbing check of the bench itself).
LayerBenchSettings parse_settings(const ParsedArgs& a) {
  LayerBenchSettings s;
  const std::string backend = a.get_string("backend", "auto");
  if (backend != "cpu" && backend != "cuda" && backend != "auto")
    fail_expected("bench layer", "--backend", "cpu, cuda or auto", backend);
  s.cuda = !a.has("host-only") && (backend == "cuda" || (backend == "auto" && cuda_available()));
  // Host-only timing runs the GPU cases' sizes (it needs neither a GPU nor the compute).
  const bool gpu_sizes = s.cuda || a.has("host-only");
  if (s.cuda && !cuda_available())
    fail("bench layer: --backend cuda: ", cuda_built() ? "no CUDA device is visible" : "this build has no CUDA backend",
         "; use --backend cpu");
  s.prefill_tokens = a.get_int("prefill-tokens", gpu_sizes ? 16384 : 64);
  s.context = a.get_int("context", gpu_sizes ? 4096 : 144);
  s.decode_requests = a.get_int_list("decode-requests", gpu_sizes ? std::vector<int64_t>{1, 32, 128, 256}
                                                               : std::vector<int64_t>{1, 4});
  s.mtp_requests = a.get_int("mtp-requests", gpu_sizes ? 128 : 4);
  s.build_chunk = a.get_int("build-chunk", 16384);
  s.warmup = static_cast<int>(a.get_int("warmup", 2));
  s.reps = static_cast<int>(a.get_int("reps", gpu_sizes ? 20 : 3));
  s.prefill_reps = static_cast<int>(a.get_int("prefill-reps", gpu_sizes ? 5 : 2));
  s.cooldown_ms = static_cast<int>(a.get_int("cooldown-ms", s.cuda ? 1000 : 0));
  s.seed = static_cast<uint64_t>(a.get_int("seed", 1));
  s.tp = static_cast<int>(a.get_int("tp", 1, 1, 128));
  s.tp_mode = s.tp == 1 ? TpMode::none
              : s.cuda && device_count() >= s.tp && nccl_built() ? TpMode::gpus
                                                                  : TpMode::shard;
  const std::string weights = a.get_string("weights", "fp8");
  if (weights != "fp8" && weights != "bf16") fail_expected("bench layer", "--weights", "fp8 or bf16", weights);
  s.fp8_weights = weights == "fp8";
  const std::string wall = a.get_string("wall", s.cuda ? "graph" : "eager");
  if (wall != "eager" && wall != "graph") fail_expected("bench layer", "--wall", "eager or graph", wall);
  s.wall = wall == "graph" ? WallMode::graph : WallMode::eager;
  if (s.context < 1) fail_expected("bench layer", "--context", ">= 1", s.context);
  if (s.mtp_requests < 0) fail_expected("bench layer", "--mtp-requests", ">= 0", s.mtp_requests);
  if (s.build_chunk < 1) fail_expected("bench layer", "--build-chunk", ">= 1", s.build_chunk);
  if (s.warmup < 0) fail_expected("bench layer", "--warmup", ">= 0", s.warmup);
  if (s.reps < 1) fail_expected("bench layer", "--reps", ">= 1", s.reps);
  if (s.prefill_reps < 1) fail_expected("bench layer", "--prefill-reps", ">= 1", s.prefill_reps);
  if (s.cooldown_ms < 0) fail_expected("bench layer", "--cooldown-ms", ">= 0", s.cooldown_ms);
  return s;
}

nlohmann::json settings_json(const LayerBenchSettings& s) {
  return {{"prefill_tokens", s.prefill_tokens}, {"context", s.context}, {"decode_requests", s.decode_requests},
          {"mtp_requests", s.mtp_requests},     {"build_chunk", s.build_chunk}, {"warmup", s.warmup},
          {"reps", s.reps},                     {"prefill_reps", s.prefill_reps}, {"cooldown_ms", s.cooldown_ms},
          {"weights", s.fp8_weights ? "fp8" : "bf16"}, {"wall", s.wall == WallMode::graph ? "graph" : "eager"},
          {"seed", s.seed}, {"tp", s.tp}, {"tp_mode", tp_mode_name(s.tp_mode)}};
}

// What runs: each model's first layer of each selected kind, and the selected cases.
struct Selection {
  std::vector<std::pair<ModelConfig, std::vector<int>>> layers;
  std::vector<CaseSpec> cases;
};

Selection select(const ParsedArgs& a, const LayerBenchSettings& s) {
  Selection sel;
  std::set<LayerKind> kinds;
  for (const std::string& k : split_list(a.get_string("kind", "swa,c4a,c128a"))) kinds.insert(parse_kind(k));
  std::set<std::string> phases;
  for (const std::string& p : split_list(a.get_string("phase", "prefill,decode,mtp"))) {
    const std::string q = lower(p);
    if (q != "prefill" && q != "decode" && q != "mtp") fail_expected("bench layer", "--phase", "prefill, decode or mtp", p);
    phases.insert(q);
  }
  const std::vector<std::string> case_filters = split_list(a.get_string("case", ""));
  for (const CaseSpec& c : layer_bench_cases(s)) {
    if (!phases.count(c.phase)) continue;
    bool keep = case_filters.empty();
    for (const std::string& f : case_filters) keep = keep || c.name.find(f) != std::string::npos;
    if (keep) sel.cases.push_back(c);
  }
  if (sel.cases.empty()) fail("bench layer: no case matches --phase / --case");
  const std::vector<std::string> models = split_list(a.get_string("model", s.cuda || a.has("host-only") ? "v4-flash,v4-pro" : "tiny"));
  if (models.empty()) fail_expected("bench layer", "--model", "a model name", "''");
  for (const std::string& m : models) {
    ModelConfig cfg = ModelConfig::builtin(m);
    if (cfg.family != "v4") fail_expected("bench layer", "--model", "a DeepSeek-V4 model", m + " (family " + cfg.family + ")");
    std::vector<int> layers;
    for (const auto& [kind, layer] : first_layer_of_each_kind(cfg))
      if (kinds.count(kind)) layers.push_back(layer);
    sel.layers.emplace_back(std::move(cfg), std::move(layers));
  }
  return sel;
}

void print_list(const Selection& sel) {
  for (const auto& [cfg, layers] : sel.layers)
    for (int layer : layers)
      for (const CaseSpec& c : sel.cases)
        std::printf("%-9s layer %-3d %-6s %-22s %5lld requests x %-5lld context %lld\n", cfg.name.c_str(), layer,
                    std::string(layer_kind_name(cfg.layer_kind(layer))).c_str(), c.name.c_str(),
                    static_cast<long long>(c.requests), static_cast<long long>(c.new_tokens),
                    static_cast<long long>(c.context));
}

// Draws the report with bench/plot_layer.py; where python3 or matplotlib is missing, says how to
// draw it later (the GPU machine has no package registry).
void plot(const std::string& json_path, const std::string& plot_path) {
  std::fflush(stdout);
  const std::string script = std::string(DSV4_SOURCE_DIR) + "/bench/plot_layer.py";
  const std::string cmd = "python3 " + shell_quote(script) + " " + shell_quote(json_path) + " " + shell_quote(plot_path);
  if (std::system(cmd.c_str()) == 0) {
    std::printf("wrote %s\n", plot_path.c_str());
    return;
  }
  std::fprintf(stderr, "dsv4 bench layer: the plot was not drawn (python3 with matplotlib needed); the report is in "
                       "%s; draw it later with:\n  python3 bench/plot_layer.py %s %s\n",
               json_path.c_str(), json_path.c_str(), plot_path.c_str());
}

}  // namespace

int run_layer_bench_cli(const std::vector<std::string>& raw) {
  const ParsedArgs a = cli::parse_args("bench layer", raw, kFlags);
  if (a.has("help")) {
    usage();
    return 0;
  }
  const LayerBenchSettings s = parse_settings(a);
  const Selection sel = select(a, s);
  for (const auto& layers : sel.layers) check_tensor_parallel(layers.first, {0, s.tp, nullptr}, "bench layer: --tp");
  if (a.has("list")) {
    print_list(sel);
    return 0;
  }
  if (a.has("host-only")) {
    for (const auto& [cfg, layers] : sel.layers)
      for (int layer : layers) run_host_plan_cases(cfg, layer, sel.cases, s);
    return 0;
  }

  const auto started = Clock::now();
  LayerBenchReport report;
  report.backend = s.cuda ? "cuda" : "cpu";
  report.device = !s.cuda ? detail::concat("cpu (", omp_get_max_threads(), " OpenMP threads)")
                  : s.tp_mode == TpMode::gpus ? detail::concat(s.tp, " x ", device_name())
                                              : device_name();
  report.commit = a.has("commit") ? a.get_string("commit") : source_commit();
  report.date = utc_now();
  report.settings = settings_json(s);
  std::fprintf(stderr, "dsv4 bench layer: %s, commit %s, measuring ceilings\n", report.device.c_str(), report.commit.c_str());
  report.ceilings = s.cuda ? measure_cuda_ceilings() : measure_cpu_ceilings();
  std::printf("dsv4 bench layer: %s, backend %s, commit %s, %s\n", report.device.c_str(), report.backend.c_str(),
              report.commit.c_str(), report.date.c_str());
  if (s.tp_mode == TpMode::gpus)
    std::printf("tp %d (tp_mode gpus): rank r on GPU r (n_heads/%d heads, o_groups/%d wo_a groups each), one "
                "host thread each, y summed by NCCL; wall: all ranks; GPU and per-op times: rank 0's, its "
                "tp_allreduce included\n", s.tp, s.tp, s.tp);
  else if (s.tp_mode == TpMode::shard)
    std::printf("tp %d (tp_mode shard): rank 0's shard (n_heads/%d heads, o_groups/%d wo_a groups) on one "
                "device, the all-reduce of y not run (%s)\n", s.tp, s.tp, s.tp,
                !s.cuda ? "cpu backend"
                : !nccl_built() ? "this build has no NCCL"
                                : detail::concat(device_count(), " GPU(s) visible").c_str());
  print_ceilings(stdout, report.ceilings);
  std::fflush(stdout);
  const Ceilings& ceil = report.ceilings.value;
  std::string json_path = a.get_string("json");
  const std::string plot_path = a.get_string("plot");
  if (json_path.empty() && !plot_path.empty()) json_path = plot_path + ".json";

  // The JSON is rewritten after every case, and a layer that fails does not stop the others: a
  // long GPU run keeps everything it measured.
  BenchRanks ranks = make_bench_ranks(s);
  for (const auto& [cfg, layers] : sel.layers)
    for (int layer : layers) {
      try {
        run_layer_cases(cfg, layer, sel.cases, s, ceil, ranks, report.cases, [&](const CaseReport& r) {
          print_case(stdout, r, ceil);
          std::fflush(stdout);
          if (!json_path.empty()) write_json(report, json_path);
        });
      } catch (const Error& e) {
        const std::string what = detail::concat(cfg.name, " layer ", layer, ": ", e.what());
        std::fprintf(stderr, "dsv4 bench layer: error: %s\n", what.c_str());
        report.errors.push_back(what);
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
  if (!json_path.empty()) {
    write_json(report, json_path);
    std::printf("wrote %s\n", json_path.c_str());
  }
  if (!plot_path.empty() && !report.cases.empty()) plot(json_path, plot_path);
  return report.errors.empty() ? 0 : 1;
}

}  // namespace dsv4::bench

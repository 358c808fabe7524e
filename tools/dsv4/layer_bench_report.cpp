#include "layer_bench_report.h"

#include <fstream>

#include "dsv4/status.h"

namespace dsv4::bench {

double CaseReport::floor_us() const {
  double sum = 0;
  for (const OpReport& o : ops) sum += o.floor_us;
  return sum;
}

std::vector<std::string> CaseReport::unmodeled_ops() const {
  std::vector<std::string> names;
  for (const OpReport& o : ops)
    if (!o.cost) names.push_back(o.name);
  return names;
}

nlohmann::json to_json(const LayerBenchReport& r) {
  using nlohmann::json;
  const Ceilings& cv = r.ceilings.value;
  json doc = {{"device", r.device},
              {"commit", r.commit},
              {"date", r.date},
              {"backend", r.backend},
              {"ceilings",
               {{"fp8_tflops", cv.fp8_tflops},
                {"bf16_tflops", cv.bf16_tflops},
                {"copy_gbps", cv.copy_gbps},
                {"fp8_how", r.ceilings.fp8_how},
                {"bf16_how", r.ceilings.bf16_how},
                {"copy_how", r.ceilings.copy_how}}},
              {"settings", r.settings},
              {"errors", r.errors},
              {"cases", json::array()}};
  for (const CaseReport& c : r.cases) {
    json ops = json::array();
    for (const OpReport& o : c.ops) {
      json op = {{"name", o.name}, {"gpu_us", o.gpu_us}, {"host_us", o.host_us}, {"modeled", o.cost.has_value()}};
      if (o.cost) {
        op["floor_us"] = o.floor_us;
        op["flop"] = o.cost->flop();
        op["flop_fp8"] = o.cost->flop_fp8;
        op["flop_bf16"] = o.cost->flop_bf16;
        op["bytes"] = o.cost->bytes;
        op["bound"] = o.cost->bound(cv);
      } else {
        for (const char* k : {"floor_us", "flop", "flop_fp8", "flop_bf16", "bytes", "bound"}) op[k] = nullptr;
      }
      ops.push_back(std::move(op));
    }
    const double floor = c.floor_us();
    const std::vector<std::string> unmodeled = c.unmodeled_ops();
    nlohmann::json phases = nlohmann::json::object();
    for (const auto& [name, us] : c.host_phases_us) phases[name] = us;
    doc["cases"].push_back({{"model", c.model},
                            {"layer", c.layer},
                            {"kind", c.kind},
                            {"case", c.name},
                            {"phase", c.phase},
                            {"requests", c.requests},
                            {"tokens", c.tokens},
                            {"context", c.context},
                            {"context_range", {c.context_min, c.context_max}},
                            {"wall_us", c.wall_us},
                            {"wall_mode", c.wall_mode},
                            {"forward_us", c.forward_us},
                            {"graph_gpu_us", c.graph_gpu_us},
                            {"before_launch_us", c.before_launch_us},
                            {"launch_us", c.launch_us},
                            {"host_phases_us", phases},
                            {"graph_replays", c.graph_replays},
                            {"graph_gpu_over_floor", floor > 0 ? c.graph_gpu_us / floor : 0.0},
                            {"wall_over_graph_gpu", c.graph_gpu_us > 0 ? c.wall_us / c.graph_gpu_us : 0.0},
                            {"gpu_us", c.gpu_us},
                            {"host_us", c.host_us},
                            {"floor_us", floor},
                            {"gpu_over_floor", floor > 0 ? c.gpu_us / floor : 0.0},
                            {"wall_over_floor", floor > 0 ? c.wall_us / floor : 0.0},
                            {"floor_complete", unmodeled.empty()},
                            {"unmodeled_ops", unmodeled},
                            {"reps", c.reps},
                            {"ops", std::move(ops)}});
  }
  return doc;
}

void write_json(const LayerBenchReport& report, const std::string& path) {
  std::ofstream f(path);
  if (!f) fail("bench layer: --json: cannot write '", path, "'");
  f << to_json(report).dump(2) << "\n";
  if (!f) fail("bench layer: --json: writing '", path, "' failed");
}

void print_ceilings(std::FILE* f, const MeasuredCeilings& c) {
  std::fprintf(f, "ceilings (measured now): FP8  %.4g TFLOP/s [%s]\n", c.value.fp8_tflops, c.fp8_how.c_str());
  std::fprintf(f, "                         bf16 %.4g TFLOP/s [%s]\n", c.value.bf16_tflops, c.bf16_how.c_str());
  std::fprintf(f, "                         copy %.4g GB/s [%s]\n", c.value.copy_gbps, c.copy_how.c_str());
}

void print_case(std::FILE* f, const CaseReport& c, const Ceilings& ceil) {
  const double floor = c.floor_us();
  std::fprintf(f, "\n%s layer %d (%s) %s: %lld requests, %lld new tokens, context %lld",
               c.model.c_str(), c.layer, c.kind.c_str(), c.name.c_str(), static_cast<long long>(c.requests),
               static_cast<long long>(c.tokens), static_cast<long long>(c.context));
  if (c.context_max != c.context_min || c.context_min != c.context)
    std::fprintf(f, " (timed steps %lld..%lld)", static_cast<long long>(c.context_min),
                 static_cast<long long>(c.context_max));
  std::fprintf(f, "\n  wall %.1f us (%s; forward returned after %.1f us), GPU %.1f us, host %.1f us, floor %.1f us: "
               "GPU/floor %.2fx, wall/floor %.2fx\n",
               c.wall_us, c.wall_mode.c_str(), c.forward_us, c.gpu_us, c.host_us, floor,
               floor > 0 ? c.gpu_us / floor : 0.0, floor > 0 ? c.wall_us / floor : 0.0);
  if (c.graph_gpu_us > 0)
    std::fprintf(f, "  replayed graph: %.1f us on the GPU (%.2fx the floor), wall / graph GPU %.2fx; host: launch "
                 "called after %.1f us, took %.1f us\n", c.graph_gpu_us, floor > 0 ? c.graph_gpu_us / floor : 0.0,
                 c.wall_us / c.graph_gpu_us, c.before_launch_us, c.launch_us);
  if (!c.host_phases_us.empty()) {
    std::fprintf(f, "  host before the launch (us from the step's start):");
    for (const auto& [name, us] : c.host_phases_us) std::fprintf(f, " %s %.1f,", name.c_str(), us);
    std::fprintf(f, " launch %.1f\n", c.before_launch_us);
  }
  std::fprintf(f, "  %-22s %10s %10s %10s %7s %10s %10s %7s\n", "op", "GPU us", "host us", "floor us", "x floor",
               "GFLOP", "MB", "bound");
  for (const OpReport& o : c.ops) {
    if (o.cost) {
      std::fprintf(f, "  %-22s %10.1f %10.1f %10.1f %6.2fx %10.2f %10.2f %7s\n", o.name.c_str(), o.gpu_us,
                   o.host_us, o.floor_us, o.floor_us > 0 ? o.gpu_us / o.floor_us : 0.0, o.cost->flop() * 1e-9,
                   o.cost->bytes * 1e-6, o.cost->bound(ceil).c_str());
    } else {
      std::fprintf(f, "  %-22s %10.1f %10.1f %10s %7s %10s %10s %7s\n", o.name.c_str(), o.gpu_us, o.host_us,
                   "?", "?", "?", "?", "UNMODELED");
    }
  }
  const std::vector<std::string> unmodeled = c.unmodeled_ops();
  if (!unmodeled.empty()) {
    std::string names;
    for (const std::string& n : unmodeled) names += (names.empty() ? "" : ", ") + n;
    std::fprintf(f, "  WARNING: no cost model for %s: the floor above leaves them out "
                    "(add them to tools/dsv4/layer_cost_model.cpp)\n", names.c_str());
  }
}

}  // namespace dsv4::bench

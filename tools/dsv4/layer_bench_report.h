// What `dsv4 bench layer` reports: per case the wall and GPU time of a layer step, its ops' times
// beside their floors (layer_cost_model.h), and the whole run as a table and as JSON:
//   {"device", "commit", "date", "backend", "ceilings": {...}, "settings": {...}, "errors": [...],
//    "cases": [{"model", "layer", "kind", "case", "phase", "requests", "tokens", "context",
//               "context_range", "wall_us", "wall_mode", "forward_us", "graph_gpu_us",
//               "before_launch_us", "launch_us", "gpu_us", "host_us", "floor_us",
//               "graph_gpu_over_floor", "wall_over_graph_gpu", "graph_replays", "floor_complete",
//               "unmodeled_ops", "reps",
//               "ops": [{"name", "gpu_us", "host_us", "floor_us", "flop", "flop_fp8",
//                        "flop_bf16", "bytes", "bound", "modeled"}]}]}
// An op the cost model does not know has "modeled": false and null flop / bytes / floor_us; its
// case lists it in "unmodeled_ops" and has "floor_complete": false (the floor is then a sum over
// the modeled ops only). bench/plot_layer.py draws this file.
#pragma once

#include <cstdint>
#include <cstdio>
#include <optional>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "hw_ceilings.h"
#include "layer_cost_model.h"

namespace dsv4::bench {

struct OpReport {
  std::string name;
  double gpu_us = 0, host_us = 0;
  std::optional<OpCost> cost;  // nullopt: not in the cost model
  double floor_us = 0;         // 0 when unmodeled
};

struct CaseReport {
  std::string model, kind, name, phase;  // phase: "prefill", "decode" or "mtp"
  int layer = 0;
  int64_t requests = 0, tokens = 0;      // tokens: new tokens of the step (all requests)
  int64_t context = 0;                   // the case's nominal context per request
  int64_t context_min = 0, context_max = 0;  // contexts of the timed steps' requests
  double wall_us = 0, gpu_us = 0, host_us = 0;  // medians over the timed steps
  // Host time of the wall-clock steps' forward() until it returned (median): the step's planning
  // and enqueue (a decode graph's replay launch included), which the GPU waits for.
  double forward_us = 0;
  // GPU time of the wall-clock steps' replayed decode graph, between events recorded on the
  // layer's stream right before and after its launch (median over the steps that replayed,
  // reported when at least half did; else 0). It is the step as the GPU runs it, branches side by
  // side, from the launch call on; gpu_us is the op-timed serial pass.
  double graph_gpu_us = 0;
  // Host clock of those steps (medians; 0 when eager): from the step's start to the graph's launch
  // call (planning, the upload, x's copy in), and the launch call itself.
  double before_launch_us = 0, launch_us = 0;
  // Host clock of those steps at each stage the layer reports before the launch (OpTimer::host_phase:
  // "checked", "planned", "uploaded"), from the step's start (medians; empty when eager).
  std::vector<std::pair<std::string, double>> host_phases_us;
  int graph_replays = 0;  // wall-clock steps that replayed their graph (the medians are over these)
  std::string wall_mode = "eager";       // "eager" or "graph" (replay)
  int reps = 0;
  std::vector<OpReport> ops;

  double floor_us() const;  // Σ over modeled ops
  std::vector<std::string> unmodeled_ops() const;
};

struct LayerBenchReport {
  std::string device, commit, date, backend;
  MeasuredCeilings ceilings;
  nlohmann::json settings = nlohmann::json::object();
  std::vector<CaseReport> cases;
  std::vector<std::string> errors;  // layers that failed (the run goes on with the others)
};

nlohmann::json to_json(const LayerBenchReport& report);
void write_json(const LayerBenchReport& report, const std::string& path);

// The ceilings' lines, then per case a header and one row per op.
void print_ceilings(std::FILE* f, const MeasuredCeilings& c);
void print_case(std::FILE* f, const CaseReport& c, const Ceilings& ceil);

}  // namespace dsv4::bench

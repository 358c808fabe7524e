// `dsv4 bench layer --host-only`: the host cost of a layer step's planning, without a GPU.
//
// A replayed decode graph costs the host only what dsv4::Attention does before the replay: check
// the plan, book the step in the paged caches, pack positions / slots / block tables into the
// step upload and look up the graph. That is StepPlanner's work (plus one memcpy into pinned
// staging and the graph launch on CUDA), so it is timed here on the CPU, on caches of the real
// model's geometry, with every request built to the case's context first.
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <map>
#include <vector>

#include "dsv4/batch.h"
#include "dsv4/paged_cache.h"
#include "layer/decode_graphs.h"
#include "layer/step_planner.h"
#include "layer/step_upload.h"
#include "layer_bench_runner.h"

namespace dsv4::bench {

namespace {
using Clock = std::chrono::steady_clock;

double percentile(std::vector<double> v, double p) {
  std::sort(v.begin(), v.end());
  return v[static_cast<size_t>(p * static_cast<double>(v.size() - 1))];
}

// What Attention::forward does on the host for one step (CPU backend: the upload stays put).
struct HostStep {
  StepPlanner& planner;
  StepUpload& upload;
  int64_t key_sum = 0;  // keeps the graph key's construction observable

  // Returns the bytes the step's commit sends to a GPU that holds the last step's upload.
  int64_t run(const BatchPlan& plan, bool graph) {
    planner.check(plan);
    planner.add_requests(plan);
    const int64_t T = plan.num_tokens();
    const int64_t rows = graph ? DecodeGraphs::rows(T) : T;
    const StepPlan& sp = planner.plan(plan, rows, graph, upload);
    const int64_t sent = upload.pending_bytes();
    upload.commit(nullptr);
    key_sum += static_cast<int64_t>(sp.key.size());
    return sent;
  }
};
}  // namespace

void run_host_plan_cases(const ModelConfig& cfg, int layer, const std::vector<CaseSpec>& cases,
                         const LayerBenchSettings& settings) {
  // Contexts are built in small steps: the SWA blocks a long chunk holds until the request's next
  // append would only make the (host-allocated) pools larger.
  LayerBenchSettings s = settings;
  s.build_chunk = std::min<int64_t>(s.build_chunk, 512);
  const LayerKind kind = cfg.layer_kind(layer);
  std::vector<CaseSpec> pool_cases;
  for (const CaseSpec& c : cases)
    if (c.shares_pool()) pool_cases.push_back(c);
  if (pool_cases.empty()) return;
  LayerCaches caches = make_layer_caches(cfg, kind, cache_options(cfg, kind, pool_cases, s));
  StepPlanner planner(cfg, layer, caches, /*prefill_group_requests=*/4);
  StepUpload upload(Device::cpu);
  HostStep host{planner, upload};

  int64_t pool = 0;
  for (const CaseSpec& c : pool_cases) pool = std::max(pool, c.requests);
  std::map<int64_t, int64_t> context;
  // Build every request to the context in chunks of at most --build-chunk tokens.
  for (int64_t id = 0; id < pool; ++id) context[id] = 0;
  for (bool more = true; more;) {
    more = false;
    std::vector<RequestStep> steps;
    int64_t left = s.build_chunk;
    for (auto& [id, have] : context) {
      const int64_t n = std::min(left, s.context - have);
      if (n <= 0) continue;
      steps.push_back({id, have, n});
      left -= n;
      if (left == 0) break;
    }
    if (steps.empty()) break;
    host.run(BatchPlan::make(steps), false);
    for (const RequestStep& st : steps) context[st.req_id] += st.num_new;
    more = true;
  }

  for (const CaseSpec& c : pool_cases) {
    std::vector<double> us, sent;
    int64_t bytes = 0;
    for (int i = 0; i < s.warmup + s.reps; ++i) {
      std::vector<RequestStep> steps;
      for (int64_t id = 0; id < c.requests; ++id) steps.push_back({id, context[id], c.new_tokens});
      const BatchPlan plan = BatchPlan::make(steps);  // the caller's work, not the layer's
      const bool graph = true;  // decode and MTP steps are decode-like: graph steps on CUDA
      const auto t0 = Clock::now();
      const int64_t step_sent = host.run(plan, graph);
      const double t = std::chrono::duration<double, std::micro>(Clock::now() - t0).count();
      for (const RequestStep& st : steps) context[st.req_id] += st.num_new;
      if (i >= s.warmup) {
        us.push_back(t);
        sent.push_back(static_cast<double>(step_sent));
      }
      bytes = upload.size();
    }
    std::printf("%-9s layer %-3d %-6s %-12s host planning %8.1f us/step (p90 %8.1f), upload %7lld B "
                "(sent per step: median %lld B), context %lld\n",
                cfg.name.c_str(), layer, std::string(layer_kind_name(kind)).c_str(), c.name.c_str(),
                percentile(us, 0.5), percentile(us, 0.9), static_cast<long long>(bytes),
                static_cast<long long>(percentile(sent, 0.5)), static_cast<long long>(c.context));
    std::fflush(stdout);
  }
}

}  // namespace dsv4::bench

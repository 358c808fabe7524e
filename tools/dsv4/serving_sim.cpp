#include "serving_sim.h"

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstring>
#include <map>
#include <random>
#include <sstream>

#include "dsv4/reference.h"
#include "dsv4/sparse_mla_reference.h"
#include "dsv4/status.h"
#include "kv_pools.h"
#include "runtime/device_runtime.h"
#include "step_tensors.h"

namespace dsv4::cli {


// V3.2 sparse MLA: the projections (wkv_b's two halves absorbed per head), the indexer over every
// earlier token, attention over the top-k in the 576 / 512-wide absorbed form.
double sparse_mla_token_flops(const ModelConfig& c, int64_t p) {
  const double H = c.n_heads, dim = c.dim, n = c.qk_nope_head_dim, R = c.rope_head_dim;
  const double lat = c.nope_dim(), v = c.mla_v_head_dim, HI = c.index_n_heads, dI = c.index_head_dim;
  const double visible = static_cast<double>(p + 1);
  const double f = 2 * dim * c.q_lora_rank + 2.0 * c.q_lora_rank * H * (n + R) + 2 * dim * (lat + R)  // wq_a, wq_b, wkv_a
                   + 2 * H * n * lat + 2 * H * lat * v + 2 * H * v * dim                  // W_UK, W_UV, wo
                   + 2 * c.q_lora_rank * HI * dI + 2 * dim * dI + 2 * dim * HI            // indexer q, k, weights
                   + 2 * HI * dI * visible;                                               // scores
  return f + 2 * H * std::min<double>(c.index_topk, visible) * (c.head_dim + c.v_head_dim);
}

double layer_token_flops(const ModelConfig& c, LayerKind kind, int64_t p) {
  if (c.family == "v3.2") return sparse_mla_token_flops(c, p);
  const double H = c.n_heads, D = c.head_dim, dim = c.dim;
  double f = 2 * dim * c.q_lora_rank + 2.0 * c.q_lora_rank * H * D + 2 * dim * D  // wq_a, wq_b, wkv
             + 2 * H * D * c.o_lora_rank + 2.0 * c.o_groups * c.o_lora_rank * dim;  // wo_a, wo_b
  double rows = static_cast<double>(std::min<int64_t>(c.window_size, p + 1));
  if (kind != LayerKind::swa) {
    const int r = kind == LayerKind::c4a ? 4 : 128, coff = r == 4 ? 2 : 1;
    f += 2 * 2 * dim * coff * D;  // compressor wkv + wgate
    const double visible = static_cast<double>((p + 1) / r);
    if (kind == LayerKind::c4a) {
      const double HI = c.index_n_heads, dI = c.index_head_dim;
      f += 2 * 2 * dim * 2 * dI                          // indexer compressor
           + 2 * c.q_lora_rank * HI * dI + 2 * dim * HI  // indexer q, weights
           + 2 * HI * dI * visible;                      // scores
      rows += std::min<double>(c.index_topk, visible);
    } else {
      rows += visible;
    }
  }
  return f + 2 * H * rows * (D + c.v_head_dim);
}

void validate_sim_config(const SimConfig& sc, const ModelConfig& cfg) {
  if (sc.requests < 1) fail_expected("run", "--requests", ">= 1", sc.requests);
  if (sc.decode_steps < 0) fail_expected("run", "--decode-steps", ">= 0", sc.decode_steps);
  if (sc.chunk < 1) fail_expected("run", "--chunk", ">= 1", sc.chunk);
  if (sc.max_running < 0) fail_expected("run", "--max-running", ">= 0 (0: no limit)", sc.max_running);
  if (sc.prompt_lens.size() != 1 && static_cast<int>(sc.prompt_lens.size()) != sc.requests)
    fail_expected("run", "--prompt-len", "1 or --requests values", sc.prompt_lens.size());
  if (sc.check_requests < 0 || sc.check_requests > sc.requests)
    fail_expected("run", "--check-requests", "0.." + std::to_string(sc.requests), sc.check_requests);
  for (int64_t prompt : sc.prompt_lens) {
    if (prompt < 1) fail_expected("run", "--prompt-len", ">= 1", prompt);
    // Compared without forming the sum, which a huge --decode-steps would overflow.
    if (sc.decode_steps > cfg.max_position || prompt > cfg.max_position - sc.decode_steps)
      fail_expected("run", "prompt + decode length",
                    "<= max_position " + std::to_string(cfg.max_position),
                    std::to_string(prompt) + " + " + std::to_string(sc.decode_steps));
  }
}

std::vector<int64_t> request_prompts(const SimConfig& sc) {
  if (sc.prompt_lens.size() == 1) return std::vector<int64_t>(static_cast<size_t>(sc.requests), sc.prompt_lens[0]);
  return sc.prompt_lens;
}

namespace {
// The GPU warm-up: one prefill step as large as the reservation's and one decode step, of stand-in
// requests (ids from `first_id` on, after the workload's), released after. Each kernel's first
// launch (its module loading), cuBLASLt's plans and the first touch of every workspace happen
// here rather than in the first timed steps, as a serving engine warms up before it takes
// traffic. Untimed; its wall time goes to the report.
void warm_up(AttentionStack& stack, StepTensors& tensors, int first_id, SimReport& rep) {
  const auto w0 = std::chrono::steady_clock::now();
  const int64_t prompt = std::min(rep.reserved.max_tokens, rep.reserved.max_context - 1);
  if (prompt < 1) return;
  const int n = static_cast<int>(std::clamp<int64_t>(rep.reserved.max_tokens / prompt, 1, rep.reserved.max_requests));
  std::vector<RequestStep> prefill, decode;
  for (int i = 0; i < n; ++i) {
    prefill.push_back({int64_t{first_id} + i, 0, prompt});
    decode.push_back({int64_t{first_id} + i, prompt, 1});
  }
  for (const std::vector<RequestStep>* steps : {&prefill, &decode}) {
    const BatchPlan plan = BatchPlan::make(*steps);
    tensors.prepare(plan);
    stack.forward(plan, tensors.x(), tensors.y(), nullptr);
  }
  rt::synchronize_device("run: warm-up");
  for (int i = 0; i < n; ++i) stack.release(int64_t{first_id} + i);
  rep.warmup_requests = n;
  rep.warmup_prompt = prompt;
  rep.warmup_seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - w0).count();
}
}  // namespace

SimReport run_serving_sim(AttentionStack& stack, const SimConfig& sc,
                          const std::function<void(const std::string&)>& progress,
                          const OutputHook& on_output) {
  const ModelConfig& cfg = stack.config();
  validate_sim_config(sc, cfg);
  const std::vector<int64_t> prompts = request_prompts(sc);

  SchedulerOptions so;
  so.token_budget = sc.chunk;
  so.max_running = sc.max_running;
  Scheduler sched(so);
  int64_t total_tokens = 0;
  for (int i = 0; i < sc.requests; ++i) {
    sched.add_request(i, prompts[static_cast<size_t>(i)], sc.decode_steps);
    total_tokens += prompts[static_cast<size_t>(i)] + sc.decode_steps;
  }
  const StackKvCapacity kv(stack);

  // Per checked request and layer: every position's layer input and output rows (of the
  // request's last run: a preemption drops them, and the recompute records them again).
  const int L = stack.num_layers();
  std::map<std::pair<int64_t, int>, std::map<int64_t, std::pair<std::vector<float>, std::vector<float>>>> record;

  SimReport rep;
  rep.phases = {{"prefill"}, {"decode"}, {"mixed"}};
  // Warm-up: every workspace reserved for the largest step the scheduler can form (its token
  // budget, its running limit, the longest request), so no step allocates.
  int64_t longest = 0;
  for (int64_t p : prompts) longest = std::max(longest, p + sc.decode_steps);
  rep.reserved.max_context = longest;
  rep.reserved.max_requests = sc.max_running > 0 ? std::min(sc.max_running, sc.requests) : sc.requests;
  rep.reserved.max_tokens = std::min<int64_t>({sc.chunk, total_tokens, int64_t{rep.reserved.max_requests} * longest});
  rep.reserved.max_requests = static_cast<int>(std::min<int64_t>(rep.reserved.max_requests, rep.reserved.max_tokens));
  rep.memory = stack.reserve(rep.reserved.max_tokens, rep.reserved.max_requests, rep.reserved.max_context);
  const bool on_gpu = stack.num_layers() > 0 && stack.backend() == Backend::cuda;
  StepTensors tensors(on_gpu ? Device::cuda : Device::cpu, nullptr, sc.seed, cfg.dim);
  if (on_gpu && sc.warmup) warm_up(stack, tensors, sc.requests, rep);
  struct StepEvents {
    int phase;
    rt::Event start, end;
  };
  std::vector<StepEvents> step_events;
  int64_t steps_run = 0;
  auto last_report = std::chrono::steady_clock::now();

  while (!sched.done()) {
    const StepSchedule s = sched.schedule(kv);
    for (int64_t id : s.preempted) {
      stack.release(id);
      for (int l = 0; l < L; ++l) record.erase({id, l});
    }
    if (s.steps.empty()) continue;  // the step only preempted; plan again with the freed blocks

    const BatchPlan plan = BatchPlan::make(s.steps);
    const int64_t T = plan.num_tokens();
    tensors.prepare(plan);
    std::vector<AttentionStack::LayerIO> io;
    const bool all_decodes = plan.num_decodes == plan.num_requests();
    const int phase = all_decodes ? 1 : plan.num_decodes == 0 ? 0 : 2;
    // CPU: the host clock around the (synchronous) step. GPU: events around the step on the
    // stream, read after the run, so the host keeps planning ahead while the GPU works.
    if (on_gpu) {
      step_events.push_back({phase, rt::Event(true), rt::Event(true)});
      step_events.back().start.record(nullptr);
    }
    const auto t0 = std::chrono::steady_clock::now();
    stack.forward(plan, tensors.x(), tensors.y(), sc.check_requests > 0 ? &io : nullptr);
    const double secs = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    if (on_gpu) step_events.back().end.record(nullptr);
    ++steps_run;
    const HostTensor y = on_output ? tensors.y_on_host() : HostTensor();

    PhaseStats& ph = rep.phases[phase];
    ph.steps += 1;
    ph.tokens += T;
    if (!on_gpu) {
      ph.seconds += secs;
      ph.step_seconds.push_back(secs);
    }
    for (int64_t t = 0; t < T; ++t)
      for (int l = 0; l < L; ++l) ph.flops += layer_token_flops(cfg, stack.layer_kind(l), plan.positions[t]);

    for (int64_t t = 0; t < T; ++t) {
      const int64_t id = plan.requests[plan.token_to_req[t]].req_id;
      if (on_output) on_output(id, plan.positions[t], y.data<float>() + t * cfg.dim);
      if (id >= sc.check_requests) continue;
      for (int l = 0; l < L; ++l) {
        const float* in = io[l].in.data<float>() + t * cfg.dim;
        const float* out = io[l].out.data<float>() + t * cfg.dim;
        record[{id, l}][plan.positions[t]] = {std::vector<float>(in, in + cfg.dim),
                                               std::vector<float>(out, out + cfg.dim)};
      }
    }
    for (int64_t id : sched.complete(s)) stack.release(id);

    const auto now = std::chrono::steady_clock::now();
    if (progress && std::chrono::duration<double>(now - last_report).count() > 2.0) {
      last_report = now;
      std::ostringstream os;
      os << "step " << steps_run << ": " << sched.progress_tokens() << "/" << total_tokens << " tokens ("
         << static_cast<int>(100.0 * static_cast<double>(sched.progress_tokens()) / static_cast<double>(total_tokens))
         << "%), " << sched.num_running() << " running, " << sched.num_waiting() << " waiting, "
         << sched.num_finished() << " done, " << sched.stats().preemptions << " preemptions";
      progress(os.str());
    }
  }
  rep.scheduler = sched.stats();
  for (const StepEvents& e : step_events) {
    const double secs = 1e-3 * rt::Event::elapsed_ms(e.start, e.end);
    rep.phases[e.phase].seconds += secs;
    rep.phases[e.phase].step_seconds.push_back(secs);
  }

  // Check: each sampled request, each layer, against the float64 reference.
  rep.check_tolerance = sc.check_tolerance;
  for (int l = 0; l < L && sc.check_requests > 0; ++l) {
    LayerCheck lc;
    lc.layer = stack.layer_index(l);
    lc.kind = stack.layer_kind(l);
    lc.kind_name = stack.sparse_mla() ? "MLA" : std::string(layer_kind_name(lc.kind));
    for (int64_t id = 0; id < sc.check_requests; ++id) {
      const auto& rows = record.at({id, l});
      std::vector<double> xin;
      for (const auto& [pos, io_rows] : rows) xin.insert(xin.end(), io_rows.first.begin(), io_rows.first.end());
      ReferenceOptions ro;
      ro.kv_layout = sc.kv_layout;
      ro.kv_scale = sc.kv_scale;
      ro.q_scale = sc.q_scale;
      const std::vector<double> ref =
          stack.sparse_mla() ? reference_sparse_mla_layer(cfg, stack.sparse_mla_layer(l).weights(), xin, ro)
                             : reference_attention_layer(cfg, lc.layer, stack.layer_weights(l), xin, ro);
      for (const auto& [pos, io_rows] : rows) {
        double num = 0, den = 0;
        for (int i = 0; i < cfg.dim; ++i) {
          const double r = ref[pos * cfg.dim + i];
          num = std::max(num, std::fabs(io_rows.second[i] - r));
          den = std::max(den, std::fabs(r));
        }
        const double e = den > 0 ? num / den : num;
        lc.max_rel_err = std::isnan(e) ? INFINITY : std::max(lc.max_rel_err, e);
        ++lc.tokens;
      }
      if (progress) progress("checked layer " + std::to_string(lc.layer) + " request " + std::to_string(id));
    }
    if (!(lc.max_rel_err <= sc.check_tolerance)) rep.check_passed = false;
    rep.checks.push_back(lc);
  }
  // What the run used of the reservation: a workspace that outgrew it means some step allocated.
  for (int l = 0; l < L; ++l) {
    const LayerMemory after = stack.sparse_mla() ? stack.sparse_mla_layer(l).memory() : stack.layer(l).memory();
    LayerMemory& m = rep.memory[static_cast<size_t>(l)];
    m.workspace_used = after.workspace_used;
    if (after.workspace > m.workspace || after.step_upload > m.step_upload) rep.reservation_outgrown = true;
  }
  return rep;
}

}  // namespace dsv4::cli

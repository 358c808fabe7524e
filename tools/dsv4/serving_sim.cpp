#include "serving_sim.h"

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstring>
#include <map>
#include <random>
#include <sstream>

#include "dsv4/reference.h"
#include "dsv4/status.h"

namespace dsv4::cli {

namespace {

// Deterministic hidden state of (request, position): N(0, 1).
void fill_hidden(float* out, int dim, uint64_t seed, int64_t req, int64_t pos) {
  std::mt19937_64 rng(seed * 0x9E3779B97F4A7C15ull ^ (static_cast<uint64_t>(req) << 32) ^
                      static_cast<uint64_t>(pos));
  std::normal_distribution<float> n(0.0f, 1.0f);
  for (int i = 0; i < dim; ++i) out[i] = n(rng);
}

struct Request {
  int64_t id = 0, prompt = 0, done = 0, decoded = 0;
  bool finished = false;
};

}  // namespace

double layer_token_flops(const ModelConfig& c, LayerKind kind, int64_t p) {
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

SimReport run_serving_sim(AttentionStack& stack, const SimConfig& sc,
                          const std::function<void(const std::string&)>& progress) {
  const ModelConfig& cfg = stack.config();
  if (sc.requests < 1) fail_expected("run", "--requests", ">= 1", sc.requests);
  if (sc.decode_steps < 0) fail_expected("run", "--decode-steps", ">= 0", sc.decode_steps);
  if (sc.chunk < 1) fail_expected("run", "--chunk", ">= 1", sc.chunk);
  if (sc.prompt_lens.size() != 1 && static_cast<int>(sc.prompt_lens.size()) != sc.requests)
    fail_expected("run", "--prompt-len", "1 or --requests values", sc.prompt_lens.size());
  if (sc.check_requests < 0 || sc.check_requests > sc.requests)
    fail_expected("run", "--check-requests", "0.." + std::to_string(sc.requests), sc.check_requests);

  std::vector<Request> reqs(sc.requests);
  for (int i = 0; i < sc.requests; ++i) {
    reqs[i].id = i;
    reqs[i].prompt = sc.prompt_lens.size() == 1 ? sc.prompt_lens[0] : sc.prompt_lens[i];
    if (reqs[i].prompt < 1) fail_expected("run", "--prompt-len", ">= 1", reqs[i].prompt);
    if (reqs[i].prompt > cfg.max_position - sc.decode_steps)  // (prompt + steps could overflow)
      fail_expected("run", "prompt + decode length", "<= max_position " + std::to_string(cfg.max_position),
                    detail::concat(reqs[i].prompt, " + ", sc.decode_steps));
  }

  // Per checked request and layer: every position's layer input and output rows.
  const int L = stack.num_layers();
  std::map<std::pair<int64_t, int>, std::map<int64_t, std::pair<std::vector<float>, std::vector<float>>>> record;

  SimReport rep;
  rep.phases = {{"prefill"}, {"decode"}};
  const int64_t total_tokens = [&] {
    int64_t t = 0;
    for (const Request& r : reqs) t += r.prompt + sc.decode_steps;
    return t;
  }();
  int64_t processed = 0;
  auto last_report = std::chrono::steady_clock::now();

  while (true) {
    std::vector<RequestStep> steps;
    int64_t budget = sc.chunk;
    for (Request& r : reqs)  // decodes first: requests whose prompt is done
      if (!r.finished && r.done >= r.prompt && r.decoded < sc.decode_steps && budget > 0) {
        steps.push_back({r.id, r.done, 1});
        --budget;
      }
    bool has_prefill = false;
    for (Request& r : reqs)
      if (r.done < r.prompt && budget > 0) {
        const int64_t n = std::min(budget, r.prompt - r.done);
        steps.push_back({r.id, r.done, n});
        budget -= n;
        has_prefill = true;
      }
    if (steps.empty()) break;

    const BatchPlan plan = BatchPlan::make(steps);
    const int64_t T = plan.num_tokens();
    HostTensor x(DType::fp32, {T, cfg.dim}), y(DType::fp32, {T, cfg.dim});
    for (int64_t t = 0; t < T; ++t)
      fill_hidden(x.data<float>() + t * cfg.dim, cfg.dim, sc.seed,
                  plan.requests[plan.token_to_req[t]].req_id, plan.positions[t]);
    std::vector<AttentionStack::LayerIO> io;
    const auto t0 = std::chrono::steady_clock::now();
    stack.forward(plan, x, y, sc.check_requests > 0 ? &io : nullptr);
    const double secs = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();

    PhaseStats& ph = rep.phases[has_prefill ? 0 : 1];
    ph.steps += 1;
    ph.tokens += T;
    ph.seconds += secs;
    for (int64_t t = 0; t < T; ++t)
      for (int l = 0; l < L; ++l) ph.flops += layer_token_flops(cfg, stack.layer(l).kind(), plan.positions[t]);

    for (int64_t t = 0; t < T; ++t) {
      const int64_t id = plan.requests[plan.token_to_req[t]].req_id;
      if (id >= sc.check_requests) continue;
      for (int l = 0; l < L; ++l) {
        const float* in = io[l].in.data<float>() + t * cfg.dim;
        const float* out = io[l].out.data<float>() + t * cfg.dim;
        record[{id, l}][plan.positions[t]] = {std::vector<float>(in, in + cfg.dim),
                                               std::vector<float>(out, out + cfg.dim)};
      }
    }
    for (const RequestStep& s : plan.requests) {
      Request& r = reqs[s.req_id];
      if (s.is_decode()) ++r.decoded;
      r.done += s.num_new;
      if (r.done >= r.prompt && r.decoded >= sc.decode_steps && !r.finished) {
        r.finished = true;
        stack.release(r.id);
      }
    }
    processed += T;
    const auto now = std::chrono::steady_clock::now();
    if (progress && std::chrono::duration<double>(now - last_report).count() > 2.0) {
      last_report = now;
      std::ostringstream os;
      os << "step " << rep.phases[0].steps + rep.phases[1].steps << ": " << processed << "/"
         << total_tokens << " tokens (" << static_cast<int>(100.0 * processed / total_tokens) << "%)";
      progress(os.str());
    }
  }

  // Check: each sampled request, each layer, against the float64 reference.
  rep.check_tolerance = sc.check_tolerance;
  for (int l = 0; l < L && sc.check_requests > 0; ++l) {
    LayerCheck lc;
    lc.layer = stack.layer(l).layer_index();
    lc.kind = stack.layer(l).kind();
    for (int64_t id = 0; id < sc.check_requests; ++id) {
      const auto& rows = record.at({id, l});
      std::vector<double> xin;
      for (const auto& [pos, io_rows] : rows) xin.insert(xin.end(), io_rows.first.begin(), io_rows.first.end());
      ReferenceOptions ro;
      const std::vector<double> ref =
          reference_attention_layer(cfg, lc.layer, stack.layer(l).weights(), xin, ro);
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
  return rep;
}

}  // namespace dsv4::cli

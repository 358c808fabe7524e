#include "layer/step_planner.h"

#include <algorithm>

#include "dsv4/status.h"

namespace dsv4 {

namespace {
constexpr const char* kWhere = "Attention::forward";

// Block-table columns that cover every request's table in `cache` (at least 1).
int64_t table_width(const PagedCache& cache, const std::vector<int64_t>& reqs, bool round) {
  int64_t w = 1;
  for (int64_t req : reqs) w = std::max<int64_t>(w, static_cast<int64_t>(cache.block_table(req).size()));
  return round ? round_up_pow2(w) : w;
}
}  // namespace

int64_t round_up_pow2(int64_t v) {
  if (v <= 0) return v;
  int64_t p = 1;
  while (p < v) p *= 2;
  return p;
}

std::vector<int64_t> StepPlan::shape_key() const {
  std::vector<int64_t> key{T, R, nd, compressed.topk, compressed.score_cols};
  auto add = [&](const StepUpload::Array& a) {
    key.push_back(a.offset);
    key.insert(key.end(), a.shape.begin(), a.shape.end());
    key.push_back(-1);
  };
  for (const auto* a : {&positions, &slot_mapping, &token_to_req, &swa_table, &compressed.context,
                        &compressed.state_table, &compressed.out_table,
                        &compressed.index_state_table, &compressed.index_key_table})
    add(*a);
  for (const PrefillGroup& g : prefill_groups) {
    key.insert(key.end(), {g.r0, g.r1, g.t0, g.t1, g.compressed_rows, g.rows_per_request});
    for (const auto* a : {&g.query_start, &g.seq_lens, &g.gather_lens, &g.compressed_lens}) add(*a);
  }
  return key;
}

StepPlanner::StepPlanner(const ModelConfig& cfg, int layer, LayerCaches& caches,
                         int prefill_group_requests)
    : cfg_(cfg),
      caches_(caches),
      ratio_(cfg.layer_kind(layer) == LayerKind::swa ? 0 : cfg.compress_ratio(layer)),
      prefill_group_requests_(std::max(1, prefill_group_requests)) {
  DSV4_CHECK(ratio_ == 0 || ratio_ == 4 || ratio_ == 128, "StepPlanner: layer ", layer,
             " has ratio ", ratio_);
  if (ratio_) main_ = CompressorConfig::attention(cfg, ratio_);
  if (ratio_ == 4) indexer_ = CompressorConfig::indexer(cfg);
}

void StepPlanner::check(const BatchPlan& plan) const {
  for (const RequestStep& s : plan.requests) {
    auto it = cached_.find(s.req_id);
    const int64_t have = it == cached_.end() ? 0 : it->second;
    if (s.context != have)
      fail_expected(kWhere, "context of request " + std::to_string(s.req_id),
                    std::to_string(have) + " (tokens this layer has cached)", s.context);
    if (s.context + s.num_new > cfg_.max_position)
      fail_expected(kWhere, "sequence length of request " + std::to_string(s.req_id),
                    "<= max_position " + std::to_string(cfg_.max_position), s.context + s.num_new);
  }
  // Capacity: exhaustion is reported before any state changes.
  std::vector<std::pair<int64_t, int64_t>> growth;
  for (const RequestStep& s : plan.requests) growth.push_back({s.context, s.context + s.num_new});
  require_blocks_for_growth(kWhere, *caches_.swa, growth);
  if (ratio_) check_compressed_capacity(plan);
}

void StepPlanner::check_compressed_capacity(const BatchPlan& plan) const {
  std::vector<std::pair<int64_t, int64_t>> growth;  // emitted entries before / after the step
  for (const RequestStep& st : plan.requests)
    growth.push_back({st.context / ratio_, (st.context + st.num_new) / ratio_});
  require_blocks_for_growth(kWhere, *caches_.compressed, growth);
  if (caches_.indexer_keys) require_blocks_for_growth(kWhere, *caches_.indexer_keys, growth);
  auto need_state = [&](const PagedCache* c, int rows) {
    if (!c) return;
    int64_t blocks = 0;
    for (const RequestStep& s : plan.requests)
      if (!c->has_request(s.req_id)) blocks += (rows + c->spec().block_size - 1) / c->spec().block_size;
    if (blocks > c->pool().num_free())
      fail(kWhere, ": ", c->spec().name, " cache exhausted: new requests need ", blocks,
           " blocks, ", c->pool().num_free(), " are free");
  };
  need_state(caches_.compressor_state.get(), main_.ring_rows());
  if (ratio_ == 4) need_state(caches_.indexer_state.get(), indexer_.ring_rows());
}

void StepPlanner::add_requests(const BatchPlan& plan) {
  for (const RequestStep& s : plan.requests)
    if (!cached_.count(s.req_id)) {
      caches_.add_request(s.req_id);  // every cache of the layer
      if (ratio_) compressor_state_init(*caches_.compressor_state, main_, s.req_id);
      if (ratio_ == 4) compressor_state_init(*caches_.indexer_state, indexer_, s.req_id);
      cached_[s.req_id] = 0;
    }
}

void StepPlanner::release(int64_t req) {
  auto it = cached_.find(req);
  if (it == cached_.end()) fail("Attention::release: unknown request ", req);
  caches_.remove_request(req);
  cached_.erase(it);
}

StepPlan StepPlanner::plan(const BatchPlan& plan, int64_t rows, bool graph, StepUpload& upload) {
  const bool round = graph;
  const int R = plan.num_requests();
  const int64_t T = plan.num_tokens();
  StepPlan sp;
  sp.T = rows;
  const int64_t pad_requests = graph ? rows - T : 0;
  sp.R = static_cast<int>(R + pad_requests);
  sp.nd = static_cast<int>(plan.num_decodes + pad_requests);

  std::vector<int64_t> req_ids;
  for (const RequestStep& s : plan.requests) req_ids.push_back(s.req_id);
  // Padding rows: position 0 of an empty request (no blocks: nothing is read or written for it).
  std::vector<int64_t> positions(plan.positions), slots(static_cast<size_t>(rows), -1);
  std::vector<int32_t> token_to_req(plan.token_to_req);
  positions.resize(static_cast<size_t>(rows), 0);
  for (int64_t t = T; t < rows; ++t)
    token_to_req.push_back(graph ? static_cast<int32_t>(R + (t - T)) : -1);
  for (int r = 0; r < R; ++r) {
    const RequestStep& s = plan.requests[r];
    const std::vector<int64_t> new_slots = caches_.swa->append(s.req_id, s.num_new);
    std::copy(new_slots.begin(), new_slots.end(), slots.begin() + plan.query_start_loc[r]);
  }
  sp.positions = upload.put<int64_t>({rows}, positions);
  sp.slot_mapping = upload.put<int64_t>({rows}, slots);
  sp.token_to_req = upload.put<int32_t>({rows}, token_to_req);
  int64_t swa_width = 1;
  for (int64_t id : req_ids)
    swa_width = std::max<int64_t>(swa_width, static_cast<int64_t>(caches_.swa->block_table(id).size()));
  sp.swa_table = upload.tables(*caches_.swa, req_ids, sp.R, round ? round_up_pow2(swa_width) : swa_width);
  if (ratio_) sp.compressed = plan_compressed(plan, req_ids, sp.R, upload, round);

  // Prefill requests in groups of at most prefill_group_requests: the gather workspace holds one
  // group, so its size does not grow with the batch.
  const int W = cfg_.window_size;
  const int group = prefill_group_requests_;
  for (int g0 = plan.num_decodes; g0 < R; g0 += group) {
    PrefillGroup g;
    g.r0 = g0;
    g.r1 = std::min(R, g0 + group);
    g.t0 = plan.query_start_loc[g.r0];
    g.t1 = plan.query_start_loc[g.r1];
    std::vector<int32_t> qsl, seq, gather, cseq;
    int64_t max_gather = 0;
    for (int r = g.r0; r < g.r1; ++r) {
      const RequestStep& s = plan.requests[r];
      qsl.push_back(static_cast<int32_t>(plan.query_start_loc[r] - g.t0));
      seq.push_back(static_cast<int32_t>(plan.seq_len(r)));
      gather.push_back(static_cast<int32_t>(std::min<int64_t>(plan.seq_len(r), s.num_new + W - 1)));
      max_gather = std::max<int64_t>(max_gather, gather.back());
      if (ratio_) {
        cseq.push_back(static_cast<int32_t>(plan.seq_len(r) / ratio_));
        g.compressed_rows = std::max<int64_t>(g.compressed_rows, cseq.back());
      }
    }
    qsl.push_back(static_cast<int32_t>(g.t1 - g.t0));
    g.rows_per_request = g.compressed_rows + max_gather;
    const int64_t n = g.r1 - g.r0;
    g.query_start = upload.put<int32_t>({n + 1}, qsl);
    g.seq_lens = upload.put<int32_t>({n}, seq);
    g.gather_lens = upload.put<int32_t>({n}, gather);
    if (ratio_) g.compressed_lens = upload.put<int32_t>({n}, cseq);
    sp.prefill_groups.push_back(std::move(g));
  }
  for (const RequestStep& s : plan.requests) cached_[s.req_id] = s.context + s.num_new;
  return sp;
}

CompressedPlan StepPlanner::plan_compressed(const BatchPlan& plan,
                                            const std::vector<int64_t>& req_ids, int64_t rows,
                                            StepUpload& upload, bool round) {
  const int R = plan.num_requests();
  CompressedPlan out;
  std::vector<int64_t> context(static_cast<size_t>(rows), 0);
  int64_t max_visible = 0;
  for (int r = 0; r < R; ++r) {
    const RequestStep& s = plan.requests[r];
    context[r] = s.context;
    max_visible = std::max<int64_t>(max_visible, plan.seq_len(r) / ratio_);
    const int64_t n = compressor_entries_after(ratio_, s.context + s.num_new) -
                      compressor_entries_after(ratio_, s.context);
    if (n > 0) {
      caches_.compressed->append(s.req_id, n);
      if (ratio_ == 4) caches_.indexer_keys->append(s.req_id, n);
    }
  }
  out.context = upload.put<int64_t>({rows}, context);
  auto tables = [&](const PagedCache& c) {
    return upload.tables(c, req_ids, rows, table_width(c, req_ids, round));
  };
  out.state_table = tables(*caches_.compressor_state);
  out.out_table = tables(*caches_.compressed);
  if (ratio_ == 128) {
    out.topk = static_cast<int>(round ? round_up_pow2(max_visible) : max_visible);
  } else {
    out.index_state_table = tables(*caches_.indexer_state);
    out.index_key_table = tables(*caches_.indexer_keys);
    out.topk = cfg_.index_topk;
    const int64_t cols = std::max<int64_t>(max_visible, 1);
    out.score_cols = round ? round_up_pow2(cols) : cols;
  }
  return out;
}

}  // namespace dsv4

#include "layer/step_planner.h"

#include <algorithm>

#include "dsv4/status.h"

namespace dsv4 {

namespace {
constexpr const char* kWhere = "Attention::forward";
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
  bool new_requests = false;
  std::vector<std::pair<int64_t, int64_t>> growth;  // per request: entries before / after
  growth.reserve(plan.requests.size());
  for (const RequestStep& s : plan.requests) {
    auto it = cached_.find(s.req_id);
    const int64_t have = it == cached_.end() ? 0 : it->second;
    new_requests = new_requests || it == cached_.end();
    if (s.context != have)
      fail_expected(kWhere, "context of request " + std::to_string(s.req_id),
                    std::to_string(have) + " (tokens this layer has cached)", s.context);
    if (s.context + s.num_new > cfg_.max_position)
      fail_expected(kWhere, "sequence length of request " + std::to_string(s.req_id),
                    "<= max_position " + std::to_string(cfg_.max_position), s.context + s.num_new);
    growth.push_back({s.context, s.context + s.num_new});
  }
  // Capacity: exhaustion is reported before any state changes.
  require_blocks_for_growth(kWhere, *caches_.swa, growth);
  if (ratio_) check_compressed_capacity(plan, new_requests, growth);
}

void StepPlanner::check_compressed_capacity(const BatchPlan& plan, bool new_requests,
                                            std::vector<std::pair<int64_t, int64_t>>& growth) const {
  for (size_t r = 0; r < growth.size(); ++r) {  // emitted entries before / after the step
    const RequestStep& st = plan.requests[r];
    growth[r] = {st.context / ratio_, (st.context + st.num_new) / ratio_};
  }
  require_blocks_for_growth(kWhere, *caches_.compressed, growth);
  if (caches_.indexer_keys) require_blocks_for_growth(kWhere, *caches_.indexer_keys, growth);
  if (!new_requests) return;  // compressor rings are reserved once, for new requests
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

StepUpload::Array StepPlanner::put_tables(const PagedCache& cache, int64_t rows, bool round,
                                          StepUpload& upload) {
  tables_.clear();
  int64_t width = 1;
  for (int64_t id : req_ids_) {
    tables_.push_back(&cache.block_table(id));
    width = std::max<int64_t>(width, static_cast<int64_t>(tables_.back()->size()));
  }
  return upload.tables(tables_, rows, round ? round_up_pow2(width) : width, cache.spec().name.c_str());
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

  req_ids_.clear();
  for (const RequestStep& s : plan.requests) req_ids_.push_back(s.req_id);
  // Per token: position, SWA slot, request. Padding rows: position 0 of an empty request (no
  // blocks: nothing is read or written for it).
  sp.positions = upload.put_uninit(DType::int64, {rows});
  sp.slot_mapping = upload.put_uninit(DType::int64, {rows});
  sp.token_to_req = upload.put_uninit(DType::int32, {rows});
  int64_t* positions = upload.host_data<int64_t>(sp.positions);
  int64_t* slots = upload.host_data<int64_t>(sp.slot_mapping);
  int32_t* token_to_req = upload.host_data<int32_t>(sp.token_to_req);
  std::copy(plan.positions.begin(), plan.positions.end(), positions);
  std::fill(positions + T, positions + rows, 0);
  std::copy(plan.token_to_req.begin(), plan.token_to_req.end(), token_to_req);
  for (int64_t t = T; t < rows; ++t) token_to_req[t] = graph ? static_cast<int32_t>(R + (t - T)) : -1;
  std::fill(slots + T, slots + rows, -1);
  for (int r = 0; r < R; ++r) {
    const RequestStep& s = plan.requests[r];
    caches_.swa->append(s.req_id, s.num_new, slots + plan.query_start_loc[r]);
  }
  sp.swa_table = put_tables(*caches_.swa, sp.R, round, upload);
  if (ratio_) sp.compressed = plan_compressed(plan, sp.R, upload, round);

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

CompressedPlan StepPlanner::plan_compressed(const BatchPlan& plan, int64_t rows,
                                            StepUpload& upload, bool round) {
  const int R = plan.num_requests();
  CompressedPlan out;
  out.context = upload.put_uninit(DType::int64, {rows});
  int64_t* context = upload.host_data<int64_t>(out.context);
  std::fill(context + R, context + rows, 0);
  int64_t max_visible = 0;
  for (int r = 0; r < R; ++r) {
    const RequestStep& s = plan.requests[r];
    context[r] = s.context;
    max_visible = std::max<int64_t>(max_visible, plan.seq_len(r) / ratio_);
    const int64_t n = compressor_entries_after(ratio_, s.context + s.num_new) -
                      compressor_entries_after(ratio_, s.context);
    if (n > 0) {
      caches_.compressed->append(s.req_id, n, nullptr);
      if (ratio_ == 4) caches_.indexer_keys->append(s.req_id, n, nullptr);
    }
  }
  out.state_table = put_tables(*caches_.compressor_state, rows, round, upload);
  out.out_table = put_tables(*caches_.compressed, rows, round, upload);
  if (ratio_ == 128) {
    out.topk = static_cast<int>(round ? round_up_pow2(max_visible) : max_visible);
  } else {
    out.index_state_table = put_tables(*caches_.indexer_state, rows, round, upload);
    out.index_key_table = put_tables(*caches_.indexer_keys, rows, round, upload);
    out.topk = cfg_.index_topk;
    const int64_t cols = std::max<int64_t>(max_visible, 1);
    out.score_cols = round ? round_up_pow2(cols) : cols;
  }
  return out;
}

}  // namespace dsv4

#include "layer/step_planner.h"

#include <algorithm>
#include <tuple>

#include "core/nonneg_div.h"
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
  for (const auto* a : {&positions, &slot_mapping, &token_to_req, &swa_table, &compressed.context,
                        &compressed.state_table, &compressed.out_table,
                        &compressed.index_state_table, &compressed.index_key_table})
    a->append_to_key(key);
  for (const PrefillGroup& g : prefill_groups) {
    key.insert(key.end(), {g.r0, g.r1, g.t0, g.t1, g.compressed_rows, g.rows_per_request});
    for (const auto* a : {&g.query_start, &g.seq_lens, &g.gather_lens, &g.compressed_lens})
      a->append_to_key(key);
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
  std::vector<std::pair<int64_t, int64_t>>& growth = growth_;  // per request: entries before / after
  growth.clear();
  const bool same = same_batch(plan);  // then every request is known, its count at hand
  for (size_t r = 0; r < plan.requests.size(); ++r) {
    const RequestStep& s = plan.requests[r];
    int64_t have = 0;
    if (same) {
      have = *last_.cached[r];
    } else {
      auto it = cached_.find(s.req_id);
      have = it == cached_.end() ? 0 : it->second;
      new_requests = new_requests || it == cached_.end();
    }
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
    growth[r] = {entries_after(st.context), entries_after(st.context + st.num_new)};
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
  if (same_batch(plan)) return;  // nothing new
  for (const RequestStep& s : plan.requests)
    if (!cached_.count(s.req_id)) {
      last_.valid = false;
      caches_.add_request(s.req_id);  // every cache of the layer
      if (ratio_) compressor_state_init(*caches_.compressor_state, main_, s.req_id);
      if (ratio_ == 4) compressor_state_init(*caches_.indexer_state, indexer_, s.req_id);
      cached_[s.req_id] = 0;
    }
}

void StepPlanner::release(int64_t req) {
  auto it = cached_.find(req);
  if (it == cached_.end()) fail("Attention::release: unknown request ", req);
  last_.valid = false;
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

PagedCache& StepPlanner::cache(CacheRole role) const {
  switch (role) {
    case CacheRole::swa: return *caches_.swa;
    case CacheRole::compressed: return *caches_.compressed;
    case CacheRole::compressor_state: return *caches_.compressor_state;
    case CacheRole::indexer_keys: return *caches_.indexer_keys;
    case CacheRole::indexer_state: return *caches_.indexer_state;
  }
  fail("StepPlanner: unknown cache role");
}

namespace {
const TensorView& caller_table(const CallerStep& step, int role) {
  const TensorView* tables[] = {&step.swa_block_table, &step.compressed_block_table,
                                &step.compressor_state_block_table, &step.indexer_keys_block_table,
                                &step.indexer_state_block_table};
  return *tables[role];
}
constexpr const char* kCallerTableNames[] = {
    "step.swa_block_table", "step.compressed_block_table", "step.compressor_state_block_table",
    "step.indexer_keys_block_table", "step.indexer_state_block_table"};
int32_t table_at(const TensorView& t, int64_t r, int64_t k) {
  return t.ptr<int32_t>()[r * t.strides[0] + k * t.strides[1]];
}
}  // namespace

std::pair<int64_t, int64_t> StepPlanner::used_blocks(CacheRole role, int64_t context,
                                                     int64_t seq_len) const {
  const int64_t B = cache(role).spec().block_size;
  switch (role) {
    case CacheRole::swa: {
      // What the layer's own SWA cache keeps mapped (PagedCache's retain rule, entries before
      // the step): the window of the step's first token and everything after it.
      const int64_t W = cfg_.window_size;
      const int64_t first = W > 0 && context > W ? div_nonneg(context - W, B) : 0;
      return {first, ceil_div_nonneg(seq_len, B)};
    }
    case CacheRole::compressed:
    case CacheRole::indexer_keys:
      return {0, ceil_div_nonneg(entries_after(seq_len), B)};
    case CacheRole::compressor_state:
      return {0, ceil_div_nonneg(main_.ring_rows(), B)};
    case CacheRole::indexer_state:
      return {0, ceil_div_nonneg(indexer_.ring_rows(), B)};
  }
  return {0, 0};
}

StepUpload::Array StepPlanner::table(CacheRole role, const BatchPlan& plan, const CallerStep* step,
                                     int64_t rows, bool round, StepUpload& upload) {
  if (step == nullptr) return put_tables(cache(role), rows, round, upload);
  const TensorView& t = caller_table(*step, static_cast<int>(role));
  int64_t width = 1;
  for (int r = 0; r < plan.num_requests(); ++r)
    width = std::max(width, used_blocks(role, plan.requests[r].context, plan.seq_len(r)).second);
  if (round) width = round_up_pow2(width);
  const StepUpload::Array a = upload.put_uninit(DType::int32, {rows, width});
  int32_t* packed = upload.host_data<int32_t>(a);
  std::fill(packed, packed + rows * width, -1);
  for (int r = 0; r < plan.num_requests(); ++r) {
    const auto [first, end] = used_blocks(role, plan.requests[r].context, plan.seq_len(r));
    for (int64_t k = first; k < end; ++k) packed[r * width + k] = table_at(t, r, k);
  }
  return a;
}

BatchPlan StepPlanner::check_caller(const CallerStep& step, int64_t T) const {
  constexpr const char* where = "Attention::forward(CallerStep)";
  auto host_tensor = [&](const char* name, const TensorView& t, DType dtype, int ndim) {
    check_defined(where, name, t);
    check_device(where, name, t, Device::cpu);
    check_dtype(where, name, t, dtype);
    check_ndim(where, name, t, ndim);
  };
  host_tensor("step.query_start_loc", step.query_start_loc, DType::int32, 1);
  const int64_t R = step.query_start_loc.shape[0] - 1;
  if (R < 0) fail_expected(where, "step.query_start_loc.shape[0]", ">= 1 (R + 1)", R + 1);
  host_tensor("step.seq_lens", step.seq_lens, DType::int32, 1);
  check_shape(where, "step.seq_lens", step.seq_lens, {R});
  host_tensor("step.positions", step.positions, DType::int64, 1);
  check_shape(where, "step.positions", step.positions, {T});
  host_tensor("step.slot_mapping", step.slot_mapping, DType::int64, 1);
  check_shape(where, "step.slot_mapping", step.slot_mapping, {T});
  auto qsl = [&](int64_t r) {
    return int64_t{step.query_start_loc.ptr<int32_t>()[r * step.query_start_loc.strides[0]]};
  };
  auto seq_len = [&](int64_t r) {
    return int64_t{step.seq_lens.ptr<int32_t>()[r * step.seq_lens.strides[0]]};
  };
  if (qsl(0) != 0) fail_expected(where, "step.query_start_loc[0]", 0, qsl(0));
  if (qsl(R) != T)
    fail_expected(where, "step.query_start_loc[R] (the step's tokens, x.shape[0])", T, qsl(R));
  std::vector<RequestStep> steps;
  steps.reserve(static_cast<size_t>(R));
  bool prefill_seen = false;
  for (int64_t r = 0; r < R; ++r) {
    const std::string row = "[" + std::to_string(r) + "]";
    const int64_t n = qsl(r + 1) - qsl(r);
    if (n < 1)
      fail_expected(where, "step.query_start_loc" + row + ".." + std::to_string(r + 1),
                    "increasing (every request has >= 1 new token)", n);
    if (seq_len(r) < n || seq_len(r) > cfg_.max_position)
      fail_expected(where, "step.seq_lens" + row,
                    std::to_string(n) + " (its new tokens) .. max_position " +
                        std::to_string(cfg_.max_position),
                    seq_len(r));
    const RequestStep s{r, seq_len(r) - n, n};
    if (s.is_decode() && prefill_seen)
      fail(where, ": step.query_start_loc: request ", r, " is a decode after a prefill chunk; "
           "expected decodes first (vLLM's reordered batch)");
    prefill_seen = prefill_seen || !s.is_decode();
    steps.push_back(s);
  }
  const BatchPlan plan = BatchPlan::make(std::move(steps));

  // Block tables: defined exactly for the caches this kind has; the blocks each request uses in
  // range.
  for (int role = 0; role < 5; ++role) {
    const TensorView& t = caller_table(step, role);
    const char* name = kCallerTableNames[role];
    const bool has = (role == 0) || (role <= 2 && ratio_ != 0) || ratio_ == 4;
    if (!has) {
      if (t.defined()) fail(where, ": ", name, ": expected none (this layer kind has no such cache)");
      continue;
    }
    host_tensor(name, t, DType::int32, 2);
    check_dim(where, name, t, 0, R);
    const CacheRole cr = static_cast<CacheRole>(role);
    const int32_t num_blocks = cache(cr).spec().num_blocks;
    for (int r = 0; r < plan.num_requests(); ++r) {
      const auto [first, end] = used_blocks(cr, plan.requests[r].context, plan.seq_len(r));
      if (t.shape[1] < end)
        fail_expected(where, std::string(name) + ".shape[1]",
                      ">= " + std::to_string(end) + " (blocks of request " + std::to_string(r) + ")",
                      t.shape[1]);
      for (int64_t k = first; k < end; ++k) {
        const int32_t b = table_at(t, r, k);
        if (b < 0 || b >= num_blocks)
          fail_expected(where,
                        std::string(name) + "[" + std::to_string(r) + "][" + std::to_string(k) + "]",
                        "a block id in 0.." + std::to_string(num_blocks - 1) + " (used by this step)", b);
      }
    }
  }
  // Per token: consecutive positions after each request's context, slots where its table says.
  const TensorView& swa_table = step.swa_block_table;
  const int64_t B = caches_.swa->spec().block_size;
  for (int64_t t = 0; t < T; ++t) {
    const int r = plan.token_to_req[t];
    const int64_t pos = step.positions.ptr<int64_t>()[t * step.positions.strides[0]];
    if (pos != plan.positions[t])
      fail_expected(where, "step.positions[" + std::to_string(t) + "]",
                    std::to_string(plan.positions[t]) + " (request " + std::to_string(r) +
                        "'s next position: seq_lens - new tokens + i)",
                    pos);
    const int64_t want = int64_t{table_at(swa_table, r, div_nonneg(pos, B))} * B + mod_nonneg(pos, B);
    const int64_t slot = step.slot_mapping.ptr<int64_t>()[t * step.slot_mapping.strides[0]];
    if (slot != want)
      fail_expected(where, "step.slot_mapping[" + std::to_string(t) + "]",
                    std::to_string(want) + " (step.swa_block_table's slot of position " +
                        std::to_string(pos) + ")",
                    slot);
  }
  return plan;
}

const StepPlan& StepPlanner::plan(const BatchPlan& plan, int64_t rows, bool graph, StepUpload& upload) {
  const StepPlan& sp = plan_step(plan, nullptr, rows, graph, upload);
  if (same_batch(plan)) {  // (last_ is this step now, when it was decode-like)
    for (size_t r = 0; r < plan.requests.size(); ++r)
      *last_.cached[r] = plan.requests[r].context + plan.requests[r].num_new;
  } else {
    for (const RequestStep& s : plan.requests) cached_[s.req_id] = s.context + s.num_new;
  }
  return sp;
}

const StepPlan& StepPlanner::plan_caller(const BatchPlan& plan, const CallerStep& step, int64_t rows,
                                         bool graph, StepUpload& upload) {
  return plan_step(plan, &step, rows, graph, upload);
}

const StepPlan& StepPlanner::plan_step(const BatchPlan& plan, const CallerStep* step, int64_t rows,
                                       bool graph, StepUpload& upload) {
  const int R = plan.num_requests();
  const int64_t T = plan.num_tokens();
  req_ids_.clear();
  for (const RequestStep& s : plan.requests) req_ids_.push_back(s.req_id);
  // The step's SWA slots: booked in the layer's caches (with its compressed entries), or the
  // caller's.
  slots_.resize(static_cast<size_t>(T));
  if (step == nullptr) {
    book(plan);
  } else {
    for (int64_t t = 0; t < T; ++t) slots_[t] = step->slot_mapping.ptr<int64_t>()[t * step->slot_mapping.strides[0]];
  }
  if (step == nullptr && patchable(plan, rows, graph)) {
    patch(plan, upload);
    return current_;
  }
  last_.valid = false;  // pack() lays the upload out anew (and may throw halfway)
  current_ = pack(plan, step, rows, graph, upload);
  current_.key = current_.shape_key();
  // A decode-like step on the layer's caches may be followed by the same batch one step on.
  if (step == nullptr && plan.num_decode_like == R) remember(plan, rows, graph);
  return current_;
}

bool StepPlanner::same_batch(const BatchPlan& plan) const {
  if (!last_.valid || plan.requests.size() != last_.requests.size()) return false;
  for (size_t r = 0; r < plan.requests.size(); ++r)
    if (plan.requests[r].req_id != last_.requests[r].req_id) return false;
  return true;
}

void StepPlanner::remember(const BatchPlan& plan, int64_t rows, bool round) {
  last_.requests = plan.requests;
  last_.rows = rows;
  last_.round = round;
  last_.cached.clear();
  last_.swa.clear();
  last_.compressed.clear();
  last_.keys.clear();
  for (const RequestStep& s : plan.requests) {
    last_.cached.push_back(&cached_.at(s.req_id));  // (map nodes stay put until erased)
    last_.swa.push_back(caches_.swa->handle(s.req_id));
    if (ratio_) last_.compressed.push_back(caches_.compressed->handle(s.req_id));
    if (ratio_ == 4) last_.keys.push_back(caches_.indexer_keys->handle(s.req_id));
  }
  last_.valid = true;
}

void StepPlanner::book(const BatchPlan& plan) {
  const int R = plan.num_requests();
  swa_changed_.assign(static_cast<size_t>(R), 0);
  entries_changed_.assign(static_cast<size_t>(R), 0);
  keys_changed_.assign(static_cast<size_t>(R), 0);
  // The same requests as the last step: through its handles, with no lookup.
  const bool same = same_batch(plan);
  for (int r = 0; r < R; ++r) {
    const RequestStep& s = plan.requests[r];
    int64_t* slots = slots_.data() + plan.query_start_loc[r];
    swa_changed_[r] = same ? caches_.swa->append(last_.swa[r], s.num_new, slots)
                           : caches_.swa->append(s.req_id, s.num_new, slots);
    if (!ratio_) continue;
    const int64_t n = entries_after(s.context + s.num_new) - entries_after(s.context);
    if (n <= 0) continue;
    entries_changed_[r] = same ? caches_.compressed->append(last_.compressed[r], n, nullptr)
                               : caches_.compressed->append(s.req_id, n, nullptr);
    if (ratio_ == 4)
      keys_changed_[r] = same ? caches_.indexer_keys->append(last_.keys[r], n, nullptr)
                              : caches_.indexer_keys->append(s.req_id, n, nullptr);
  }
}

std::pair<int, int64_t> StepPlanner::compressed_widths(const BatchPlan& plan, bool round) const {
  int64_t max_visible = 0;
  for (int r = 0; r < plan.num_requests(); ++r)
    max_visible = std::max<int64_t>(max_visible, entries_after(plan.seq_len(r)));
  if (ratio_ == 128) return {static_cast<int>(round ? round_up_pow2(max_visible) : max_visible), 0};
  const int64_t cols = std::max<int64_t>(max_visible, 1);
  return {cfg_.index_topk, round ? round_up_pow2(cols) : cols};
}

bool StepPlanner::patchable(const BatchPlan& plan, int64_t rows, bool round) const {
  const int R = plan.num_requests();
  if (!last_.valid || rows != last_.rows || round != last_.round || plan.num_decode_like != R ||
      static_cast<size_t>(R) != last_.requests.size())
    return false;
  for (int r = 0; r < R; ++r) {
    const RequestStep& s = plan.requests[r];
    const RequestStep& was = last_.requests[r];
    if (s.req_id != was.req_id || s.num_new != was.num_new || s.context != was.context + was.num_new) return false;
  }
  // Every changed table still fits its array's width.
  // (The same requests in the same order: last_'s handles apply.)
  auto fits = [&](const PagedCache& cache, const std::vector<PagedCache::Handle>& handles,
                  const StepUpload::Array& a, const std::vector<uint8_t>& changed) {
    for (int r = 0; r < R; ++r)
      if (changed[r] && static_cast<int64_t>(cache.block_table(handles[r]).size()) > a.shape[1]) return false;
    return true;
  };
  if (!fits(*caches_.swa, last_.swa, current_.swa_table, swa_changed_)) return false;
  if (!ratio_) return true;
  const CompressedPlan& c = current_.compressed;
  if (compressed_widths(plan, round) != std::pair<int, int64_t>{c.topk, c.score_cols}) return false;
  return fits(*caches_.compressed, last_.compressed, c.out_table, entries_changed_) &&
         (ratio_ != 4 || fits(*caches_.indexer_keys, last_.keys, c.index_key_table, keys_changed_));
}

void StepPlanner::patch(const BatchPlan& plan, StepUpload& upload) {
  // The same requests, arrays and shapes as the last step: what moved is each token's position
  // and slot, each request's context, and the rows of the tables that changed. Token-to-request
  // rows, the compressors' ring tables and the padding rows stay as they were.
  const int R = plan.num_requests();
  const int64_t T = plan.num_tokens();
  const StepPlan& sp = current_;
  upload.resume();
  std::copy(plan.positions.begin(), plan.positions.end(), upload.host_data<int64_t>(sp.positions));
  upload.mark_dirty(sp.positions.offset, T * 8);
  std::copy(slots_.begin(), slots_.end(), upload.host_data<int64_t>(sp.slot_mapping));
  upload.mark_dirty(sp.slot_mapping.offset, T * 8);
  auto patch_rows = [&](const PagedCache& cache, const std::vector<PagedCache::Handle>& handles,
                        const StepUpload::Array& a, const std::vector<uint8_t>& changed) {
    const int64_t width = a.shape[1];
    int32_t* packed = upload.host_data<int32_t>(a);
    for (int r = 0; r < R; ++r) {
      if (!changed[r]) continue;
      const std::vector<int32_t>& t = cache.block_table(handles[r]);
      int32_t* row = packed + int64_t{r} * width;
      std::copy(t.begin(), t.end(), row);
      std::fill(row + t.size(), row + width, -1);
      upload.mark_dirty(a.offset + int64_t{r} * width * 4, width * 4);
    }
  };
  patch_rows(*caches_.swa, last_.swa, sp.swa_table, swa_changed_);
  if (ratio_) {
    int64_t* context = upload.host_data<int64_t>(sp.compressed.context);
    for (int r = 0; r < R; ++r) context[r] = plan.requests[r].context;
    upload.mark_dirty(sp.compressed.context.offset, int64_t{R} * 8);
    patch_rows(*caches_.compressed, last_.compressed, sp.compressed.out_table, entries_changed_);
    if (ratio_ == 4) patch_rows(*caches_.indexer_keys, last_.keys, sp.compressed.index_key_table, keys_changed_);
  }
  last_.requests = plan.requests;
  ++patched_steps_;
}

StepPlan StepPlanner::pack(const BatchPlan& plan, const CallerStep* step, int64_t rows, bool graph,
                           StepUpload& upload) {
  const bool round = graph;
  const int R = plan.num_requests();
  const int64_t T = plan.num_tokens();
  StepPlan sp;
  sp.T = rows;
  const int64_t pad_requests = graph ? rows - T : 0;
  sp.R = static_cast<int>(R + pad_requests);
  sp.nd = static_cast<int>(plan.num_decode_like_tokens() + pad_requests);

  upload.begin();
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
  std::copy(slots_.begin(), slots_.end(), slots);
  std::fill(slots + T, slots + rows, -1);
  // The arrays every step rewrites come first, then the block tables (those a step may change
  // first, the compressors' rings last): a patched step's dirty bytes stay at the front.
  if (ratio_) {
    sp.compressed.context = upload.put_uninit(DType::int64, {sp.R});
    int64_t* context = upload.host_data<int64_t>(sp.compressed.context);
    for (int r = 0; r < R; ++r) context[r] = plan.requests[r].context;
    std::fill(context + R, context + sp.R, 0);
  }
  sp.swa_table = table(CacheRole::swa, plan, step, sp.R, round, upload);
  if (ratio_) plan_compressed_tables(plan, step, sp.R, upload, round, sp.compressed);
  plan_prefill_groups(plan, sp, upload);
  return sp;
}

void StepPlanner::plan_prefill_groups(const BatchPlan& plan, StepPlan& sp, StepUpload& upload) const {
  // Prefill requests in groups of at most prefill_group_requests: the gather workspace holds one
  // group, so its size does not grow with the batch.
  const int R = plan.num_requests();
  const int W = cfg_.window_size;
  const int group = prefill_group_requests_;
  for (int g0 = plan.num_decode_like; g0 < R; g0 += group) {
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
        cseq.push_back(static_cast<int32_t>(entries_after(plan.seq_len(r))));
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
}

void StepPlanner::plan_compressed_tables(const BatchPlan& plan, const CallerStep* step, int64_t rows,
                                         StepUpload& upload, bool round, CompressedPlan& out) {
  std::tie(out.topk, out.score_cols) = compressed_widths(plan, round);
  out.out_table = table(CacheRole::compressed, plan, step, rows, round, upload);
  if (ratio_ == 4) out.index_key_table = table(CacheRole::indexer_keys, plan, step, rows, round, upload);
  out.state_table = table(CacheRole::compressor_state, plan, step, rows, round, upload);
  if (ratio_ == 4) out.index_state_table = table(CacheRole::indexer_state, plan, step, rows, round, upload);
}

}  // namespace dsv4

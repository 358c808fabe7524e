#include "layer/compressed_scope.h"

#include <algorithm>

#include "dsv4/indexer.h"
#include "dsv4/status.h"

namespace dsv4 {

namespace {
std::vector<int64_t> request_ids(const BatchPlan& plan) {
  std::vector<int64_t> ids;
  for (const RequestStep& s : plan.requests) ids.push_back(s.req_id);
  return ids;
}
}  // namespace

CompressedScope::CompressedScope(const ModelConfig& cfg, int layer, const LayerWeightViews& weights,
                                 LayerCaches& caches)
    : cfg_(cfg), w_(weights), caches_(caches), ratio_(cfg.compress_ratio(layer)) {
  DSV4_CHECK(ratio_ == 4 || ratio_ == 128, "CompressedScope: layer ", layer, " has ratio ", ratio_);
  DSV4_CHECK(w_.compressor.has_value(), "CompressedScope: layer ", layer, " has no compressor weights");
  main_ = CompressorConfig::attention(cfg, ratio_);
  if (ratio_ == 4) {
    DSV4_CHECK(w_.indexer.has_value(), "CompressedScope: C4A layer ", layer, " has no indexer weights");
    indexer_ = CompressorConfig::indexer(cfg);
  }
}

void CompressedScope::add_request(int64_t req) {
  compressor_state_init(*caches_.compressor_state, main_, req);
  if (ratio_ == 4) compressor_state_init(*caches_.indexer_state, indexer_, req);
}

void CompressedScope::check_capacity(const BatchPlan& plan) const {
  std::vector<std::pair<int64_t, int64_t>> growth;  // emitted entries before / after the step
  for (const RequestStep& st : plan.requests)
    growth.push_back({st.context / ratio_, (st.context + st.num_new) / ratio_});
  require_blocks_for_growth("Attention::forward", *caches_.compressed, growth);
  if (caches_.indexer_keys) require_blocks_for_growth("Attention::forward", *caches_.indexer_keys, growth);
  auto need_state = [&](const PagedCache* c, int rows) {
    if (!c) return;
    int64_t blocks = 0;
    for (const RequestStep& s : plan.requests)
      if (!c->has_request(s.req_id)) blocks += (rows + c->spec().block_size - 1) / c->spec().block_size;
    if (blocks > c->pool().num_free())
      fail("Attention::forward: ", c->spec().name, " cache exhausted: new requests need ", blocks,
           " blocks, ", c->pool().num_free(), " are free");
  };
  need_state(caches_.compressor_state.get(), main_.ring_rows());
  if (ratio_ == 4) need_state(caches_.indexer_state.get(), indexer_.ring_rows());
}

void CompressedScope::compress(const CompressorConfig& ccfg, const CompressorWeightViews& w,
                               PagedCache& state, PagedCache& out_cache, const BatchPlan& plan,
                               const TensorView& x, const TensorView& positions,
                               const TensorView& token_to_req, const TensorView& context_lens,
                               const TensorView& cos_sin, Scratch& scratch) {
  const int64_t T = plan.num_tokens();
  const Stream stream = scratch.stream();
  TensorView kv_rows = scratch.tensor(DType::fp32, {T, ccfg.proj_width()});
  TensorView score_rows = scratch.tensor(DType::fp32, {T, ccfg.proj_width()});
  compressor_project(ccfg, x, w.wkv.value, w.wgate.value, w.ape, positions, kv_rows, score_rows,
                     stream);
  for (const RequestStep& s : plan.requests) {
    const int64_t n = compressor_entries_after(ccfg.ratio, s.context + s.num_new) -
                      compressor_entries_after(ccfg.ratio, s.context);
    if (n > 0) out_cache.append(s.req_id, n);
  }
  const std::vector<int64_t> ids = request_ids(plan);
  const TensorView state_table = scratch.upload(pack_block_tables(state, ids));
  const TensorView out_table = scratch.upload(pack_block_tables(out_cache, ids));
  CompressorStateView sv{compressor_state_rows(state, ccfg), state_table, state.spec().block_size};
  CompressorOutputView ov;
  if (ccfg.target == CompressorTarget::kv_cache)
    ov.kv_cache = out_cache.kv_view();
  else
    ov.indexer_keys = IndexerKeyCacheView{out_cache.storage_view(), out_cache.spec().block_size};
  ov.block_table = out_table;
  CompressorBatch batch{positions, token_to_req, context_lens};
  compressor_update_and_emit(ccfg, kv_rows, score_rows, batch, w.norm, cos_sin, sv, ov, {}, stream);
}

CompressedIndices CompressedScope::step(const BatchPlan& plan, const TensorView& x,
                                        const GemmInput& qr_n, const TensorView& positions,
                                        const TensorView& token_to_req, const TensorView& cos_sin,
                                        Scratch& scratch) {
  const int64_t T = plan.num_tokens();
  const int R = plan.num_requests();
  const Stream stream = scratch.stream();
  HostTensor context_h(DType::int64, {R});
  for (int r = 0; r < R; ++r) context_h.data<int64_t>()[r] = plan.requests[r].context;
  const TensorView context = scratch.upload(context_h);

  compress(main_, *w_.compressor, *caches_.compressor_state, *caches_.compressed, plan, x,
           positions, token_to_req, context, cos_sin, scratch);

  int64_t max_visible = 0;
  for (int r = 0; r < R; ++r) max_visible = std::max<int64_t>(max_visible, plan.seq_len(r) / ratio_);

  CompressedIndices out;
  if (ratio_ == 128) {
    out.topk = static_cast<int>(max_visible);
    if (out.topk == 0) return out;
    out.local = scratch.tensor(DType::int32, {T, out.topk});
    out.lens = scratch.tensor(DType::int32, {T});
    compressed_prefix_indices(positions, ratio_, out.local, out.lens, stream);
    return out;
  }

  // C4A: the indexer's own compressor, then query, scores over the request's keys, top-k.
  const IndexerWeightViews& iw = *w_.indexer;
  compress(indexer_, iw.compressor, *caches_.indexer_state, *caches_.indexer_keys, plan, x,
           positions, token_to_req, context, cos_sin, scratch);
  out.topk = cfg_.index_topk;
  out.local = scratch.tensor(DType::int32, {T, out.topk});
  out.lens = scratch.tensor(DType::int32, {T});
  const int HI = cfg_.index_n_heads;
  TensorView q_fp8 = scratch.tensor(DType::fp8_e4m3, {T, HI, cfg_.index_head_dim});
  TensorView q_scale = scratch.tensor(DType::fp32, {T, HI});
  TensorView weights = scratch.tensor(DType::fp32, {T, HI});
  TensorView query_ws = scratch.tensor(
      DType::uint8, {std::max<int64_t>(indexer_query_workspace_bytes(T, HI, cfg_.index_head_dim), 1)});
  const auto [qr, qr_scale] = qr_n.for_weight(iw.wq_b);
  indexer_query(qr, qr_scale, iw.wq_b.value, iw.wq_b.scale, x, iw.weights_proj.value, positions,
                cos_sin, q_fp8, q_scale, weights, query_ws, stream);
  const int64_t N = std::max<int64_t>(max_visible, 1);
  TensorView scores = scratch.tensor(DType::fp32, {T, N});
  const TensorView key_table = scratch.upload(pack_block_tables(*caches_.indexer_keys, request_ids(plan)));
  indexer_scores(q_fp8, q_scale, weights, positions, token_to_req,
                 IndexerKeyCacheView{caches_.indexer_keys->storage_view(),
                                     caches_.indexer_keys->spec().block_size},
                 key_table, ratio_, scores, stream);
  indexer_topk(scores, positions, ratio_, out.local, out.lens, stream);
  return out;
}

}  // namespace dsv4

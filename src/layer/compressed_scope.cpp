#include "layer/compressed_scope.h"

#include <algorithm>

#include "dsv4/indexer.h"
#include "dsv4/status.h"

namespace dsv4 {

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

void CompressedScope::compress(const CompressorConfig& ccfg, const CompressorWeightViews& w,
                               PagedCache& state, PagedCache& out_cache,
                               const TensorView& state_table, const TensorView& out_table,
                               const TensorView& x, const TensorView& positions,
                               const TensorView& token_to_req, const TensorView& context_lens,
                               const TensorView& cos_sin, const TensorView& gemm_workspace,
                               Scratch& scratch, Stream stream) {
  const int64_t T = x.size(0);
  TensorView kv_rows = scratch.tensor(DType::fp32, {T, ccfg.proj_width()});
  TensorView score_rows = scratch.tensor(DType::fp32, {T, ccfg.proj_width()});
  compressor_project(ccfg, x, w.wkv.value, w.wgate.value, w.ape, positions, kv_rows, score_rows,
                     gemm_workspace, stream);
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

void CompressedScope::launch_compressors(const CompressedPlan& p, const StepUpload& upload,
                                         const TensorView& x, const TensorView& positions,
                                         const TensorView& token_to_req, const TensorView& cos_sin,
                                         Scratch& scratch, Stream side, bool overlap,
                                         const std::function<void(const char*)>& mark_op) {
  auto op = [&](const char* name) {
    if (mark_op) mark_op(name);
  };
  const bool cuda = x.device == Device::cuda;
  const TensorView context = upload.view(p.context);
  // One GEMM workspace per compressor: the two may run side by side.
  auto gemm_workspace = [&] {
    return cuda ? scratch.tensor(DType::uint8, {kBranchGemmWorkspaceBytes}) : TensorView{};
  };
  // C4A: the indexer's compressor (its keys) and the main one read only x, and at decode each is
  // a few small kernels that leave most SMs idle: with `overlap` the key branch runs on a stream
  // of its own.
  keys_forked_ = overlap && cuda && ratio_ == 4;
  const Stream key_stream = keys_forked_ ? key_branch_.fork(side) : side;
  op("compressor");
  compress(main_, *w_.compressor, *caches_.compressor_state, *caches_.compressed,
           upload.view(p.state_table), upload.view(p.out_table), x, positions, token_to_req,
           context, cos_sin, gemm_workspace(), scratch, side);
  if (ratio_ != 4) return;
  op("indexer_compressor");
  compress(indexer_, w_.indexer->compressor, *caches_.indexer_state, *caches_.indexer_keys,
           upload.view(p.index_state_table), upload.view(p.index_key_table), x, positions,
           token_to_req, context, cos_sin, gemm_workspace(), scratch, key_stream);
}

CompressedIndices CompressedScope::launch_indices(const CompressedPlan& p, const StepUpload& upload,
                                                  const TensorView& x, const GemmInput& qr_n,
                                                  const TensorView& positions,
                                                  const TensorView& token_to_req,
                                                  const TensorView& cos_sin, Scratch& scratch,
                                                  Stream main, Stream side, bool overlap,
                                                  const std::function<void(const char*)>& mark_op) {
  auto op = [&](const char* name) {
    if (mark_op) mark_op(name);
  };
  const int64_t T = x.size(0);
  overlap = overlap && x.device == Device::cuda;
  DSV4_CHECK(overlap || main == side, "CompressedScope::launch_indices: main and side streams differ without overlap");
  DSV4_CHECK(ratio_ != 4 || keys_forked_ == overlap,
             "CompressedScope::launch_indices: overlap differs from launch_compressors'");
  CompressedIndices out;
  out.topk = p.topk;
  if (ratio_ == 128) {
    if (out.topk == 0) return out;
    out.local = scratch.tensor(DType::int32, {T, out.topk});
    out.lens = scratch.tensor(DType::int32, {T});
    op("compressed_indices");
    compressed_prefix_indices(positions, ratio_, out.local, out.lens, side);
    return out;
  }

  // C4A: the query needs qr_n (on `main`), the scores need the query and the keys (the key
  // branch), the top-k the scores. With `overlap` the query runs on a stream of its own beside
  // `main`'s wq_b and the main compressor, and the scores and top-k follow on the key branch.
  const Stream key_stream = keys_forked_ ? key_branch_.get() : side;
  const Stream query_stream = overlap ? query_branch_.fork(main) : main;
  const IndexerWeightViews& iw = *w_.indexer;
  const int HI = cfg_.index_n_heads;
  out.local = scratch.tensor(DType::int32, {T, out.topk});
  out.lens = scratch.tensor(DType::int32, {T});
  TensorView q_fp8 = scratch.tensor(DType::fp8_e4m3, {T, HI, cfg_.index_head_dim});
  TensorView q_scale = scratch.tensor(DType::fp32, {T, HI});
  TensorView weights = scratch.tensor(DType::fp32, {T, HI});
  TensorView query_ws = scratch.tensor(
      DType::uint8, {std::max<int64_t>(indexer_query_workspace_bytes(T, HI, cfg_.index_head_dim), 1)});
  TensorView scores = scratch.tensor(DType::fp32, {T, p.score_cols});
  op("indexer_query");
  const auto [qr, qr_scale] = qr_n.for_weight(iw.wq_b);
  indexer_query(qr, qr_scale, iw.wq_b.value, iw.wq_b.scale, x, iw.weights_proj.value, positions,
                cos_sin, q_fp8, q_scale, weights, query_ws, query_stream);
  if (overlap) query_branch_.join_into(key_stream);
  op("indexer_scores");
  indexer_scores(q_fp8, q_scale, weights, positions, token_to_req,
                 IndexerKeyCacheView{caches_.indexer_keys->storage_view(),
                                     caches_.indexer_keys->spec().block_size},
                 upload.view(p.index_key_table), ratio_, scores, key_stream);
  op("indexer_topk");
  // Column order: the attention over the selected entries does not depend on their order (only
  // its fp32 rounding does), and on CUDA it spares the kernel its sort.
  indexer_topk(scores, positions, ratio_, out.local, out.lens, key_stream, TopkOrder::column);
  if (keys_forked_) key_branch_.join_into(side);
  return out;
}

}  // namespace dsv4

#include "layer/layer_weights.h"

namespace dsv4 {

LayerWeightStore::LayerWeightStore(const AttentionWeights& w, Device device) : placed_(device) {
  LayerWeightViews& v = views_;
  v.wq_a = placed_.gemm_weight(w.wq_a);
  v.wq_b = placed_.gemm_weight(w.wq_b);
  v.wkv = placed_.gemm_weight(w.wkv);
  v.wo_a = placed_.gemm_weight(w.wo_a);
  v.wo_b = placed_.gemm_weight(w.wo_b);
  v.q_norm = placed_.plain(w.q_norm);
  v.kv_norm = placed_.plain(w.kv_norm);
  v.attn_sink = placed_.plain(w.attn_sink);
  auto compressor = [&](const CompressorWeights& c) {
    return CompressorWeightViews{placed_.gemm_weight(c.wkv, false), placed_.gemm_weight(c.wgate, false),
                                 placed_.plain(c.ape), placed_.plain(c.norm)};
  };
  if (w.compressor) v.compressor = compressor(*w.compressor);
  if (w.indexer)
    v.indexer = IndexerWeightViews{placed_.gemm_weight(w.indexer->wq_b),
                                   placed_.gemm_weight(w.indexer->weights_proj, false),
                                   compressor(w.indexer->compressor)};
}

int64_t LayerWeightStore::bytes() const {
  int64_t total = 0;
  auto add_compressor = [&](const CompressorWeightViews& c) {
    total += weight_bytes(c.wkv) + weight_bytes(c.wgate) + weight_bytes(c.ape) + weight_bytes(c.norm);
  };
  const LayerWeightViews& v = views_;
  for (const WeightView* w : {&v.wq_a, &v.wq_b, &v.wkv, &v.wo_a, &v.wo_b}) total += weight_bytes(*w);
  for (const TensorView* t : {&v.q_norm, &v.kv_norm, &v.attn_sink}) total += weight_bytes(*t);
  if (v.compressor) add_compressor(*v.compressor);
  if (v.indexer) {
    total += weight_bytes(v.indexer->wq_b) + weight_bytes(v.indexer->weights_proj);
    add_compressor(v.indexer->compressor);
  }
  return total;
}

}  // namespace dsv4

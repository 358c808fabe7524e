#include "layer/sparse_mla/sparse_mla_weight_store.h"

#include <tuple>
#include <utility>

namespace dsv4 {

namespace {

// W_UK_T [H, c, n] and W_UV [H, v, c] from wkv_b [H*(n+v), c] (per head n rows of W_UK, then v
// rows of W_UV), in bf16.
std::pair<HostTensor, HostTensor> split_wkv_b(const ModelConfig& cfg, const Weight& wkv_b) {
  const int64_t H = cfg.n_heads, n = cfg.qk_nope_head_dim, v = cfg.mla_v_head_dim,
                c = cfg.nope_dim();
  const HostTensor w = dequantize_weight(wkv_b);
  const float* p = w.data<float>();
  HostTensor uk_t(DType::bf16, {H, c, n}), uv(DType::bf16, {H, v, c});
  for (int64_t h = 0; h < H; ++h) {
    const float* head = p + h * (n + v) * c;
    for (int64_t d = 0; d < n; ++d)
      for (int64_t cc = 0; cc < c; ++cc) uk_t.set((h * c + cc) * n + d, head[d * c + cc]);
    for (int64_t vv = 0; vv < v; ++vv)
      for (int64_t cc = 0; cc < c; ++cc) uv.set((h * v + vv) * c + cc, head[(n + vv) * c + cc]);
  }
  return {uk_t, uv};
}

}  // namespace

SparseMlaWeightStore::SparseMlaWeightStore(const ModelConfig& cfg, const SparseMlaWeights& w,
                                           Device device)
    : placed_(device) {
  std::tie(w_uk_t_, w_uv_) = split_wkv_b(cfg, w.wkv_b);
  SparseMlaWeightViews& v = views_;
  v.wq_a = placed_.gemm_weight(w.wq_a);
  v.wq_b = placed_.gemm_weight(w.wq_b);
  v.wkv_a = placed_.gemm_weight(w.wkv_a);
  v.wo = placed_.gemm_weight(w.wo);
  v.q_norm = placed_.plain(w.q_norm);
  v.kv_norm = placed_.plain(w.kv_norm);
  v.w_uk_t = placed_.plain(w_uk_t_);
  v.w_uv = placed_.plain(w_uv_);
  v.indexer.wq_b = placed_.gemm_weight(w.indexer.wq_b);
  v.indexer.wk = placed_.gemm_weight(w.indexer.wk);
  v.indexer.weights_proj = placed_.gemm_weight(w.indexer.weights_proj, /*keep_fp8=*/false);
  v.indexer.k_norm = placed_.plain(w.indexer.k_norm);
  v.indexer.k_norm_bias = placed_.plain(w.indexer.k_norm_bias);
}

int64_t SparseMlaWeightStore::bytes() const {
  const SparseMlaWeightViews& v = views_;
  int64_t total = 0;
  for (const WeightView* w : {&v.wq_a, &v.wq_b, &v.wkv_a, &v.wo, &v.indexer.wq_b, &v.indexer.wk,
                              &v.indexer.weights_proj})
    total += weight_bytes(*w);
  for (const TensorView* t : {&v.q_norm, &v.kv_norm, &v.w_uk_t, &v.w_uv, &v.indexer.k_norm,
                              &v.indexer.k_norm_bias})
    total += weight_bytes(*t);
  return total;
}

}  // namespace dsv4

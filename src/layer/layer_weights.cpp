#include "layer/layer_weights.h"

#include "dsv4/ops.h"

namespace dsv4 {

LayerWeightStore::LayerWeightStore(const AttentionWeights& w, Device device) : device_(device) {
  LayerWeightViews& v = views_;
  v.wq_a = gemm_weight(w.wq_a);
  v.wq_b = gemm_weight(w.wq_b);
  v.wkv = gemm_weight(w.wkv);
  v.wo_a = gemm_weight(w.wo_a);
  v.wo_b = gemm_weight(w.wo_b);
  v.q_norm = plain(w.q_norm);
  v.kv_norm = plain(w.kv_norm);
  v.attn_sink = plain(w.attn_sink);
  auto compressor = [&](const CompressorWeights& c) {
    return CompressorWeightViews{gemm_weight(c.wkv, false), gemm_weight(c.wgate, false), plain(c.ape),
                                 plain(c.norm)};
  };
  if (w.compressor) v.compressor = compressor(*w.compressor);
  if (w.indexer)
    v.indexer = IndexerWeightViews{gemm_weight(w.indexer->wq_b),
                                   gemm_weight(w.indexer->weights_proj, false),
                                   compressor(w.indexer->compressor)};
}

TensorView LayerWeightStore::own(const HostTensor& t) {
  owned_.push_back(DeviceTensor::from_host(t));
  return owned_.back().view();
}

TensorView LayerWeightStore::plain(const HostTensor& t) {
  if (device_ == Device::cpu || !t.view().defined()) return t.view();
  return own(t);
}

WeightView LayerWeightStore::gemm_weight(const Weight& w, bool keep_fp8) {
  if (device_ == Device::cpu) return WeightView{w.value.view(), w.scale.view()};
  if (w.quantized() && keep_fp8) {
    // The fp32 scales in cuBLASLt's layout; the view keeps the grid's shape over padded rows.
    TensorView scale = own(cuda_weight_scale(w));
    scale.shape[scale.ndim - 1] = w.scale.shape().back();
    return WeightView{own(w.value), scale};
  }
  HostTensor bf16;
  if (w.quantized()) {
    // 128×128 blocks over the last two dims (wo_a is [G, L, H·D/G] with per-group blocks).
    bf16 = HostTensor(DType::bf16, w.value.shape());
    dequantize_fp8_blocks(w.value, w.scale, kWeightScaleBlock, kWeightScaleBlock, bf16);
  } else {
    bf16 = HostTensor::copy_of(w.value, DType::bf16);
  }
  return WeightView{own(bf16), {}};
}

int64_t LayerWeightStore::bytes() const {
  int64_t total = 0;
  auto add = [&](const TensorView& t) {
    if (t.defined()) total += t.numel() * static_cast<int64_t>(dtype_size(t.dtype));
  };
  auto add_weight = [&](const WeightView& w) {
    add(w.value);
    add(w.scale);
  };
  auto add_compressor = [&](const CompressorWeightViews& c) {
    add_weight(c.wkv);
    add_weight(c.wgate);
    add(c.ape);
    add(c.norm);
  };
  const LayerWeightViews& v = views_;
  for (const WeightView* w : {&v.wq_a, &v.wq_b, &v.wkv, &v.wo_a, &v.wo_b}) add_weight(*w);
  for (const TensorView* t : {&v.q_norm, &v.kv_norm, &v.attn_sink}) add(*t);
  if (v.compressor) add_compressor(*v.compressor);
  if (v.indexer) {
    add_weight(v.indexer->wq_b);
    add_weight(v.indexer->weights_proj);
    add_compressor(v.indexer->compressor);
  }
  return total;
}

}  // namespace dsv4

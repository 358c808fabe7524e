// The weights of one V3.2 sparse-MLA layer as its ops take them, on the layer's device, by
// DeviceWeights' rules (device_weights.h): FP8 projections stay FP8 on CUDA, except the indexer's
// weights_proj (bf16 in the released checkpoint; CUDA multiplies it with the bf16 x), which an FP8
// copy turns into bf16 once. wkv_b is not kept as a GEMM weight: the layer reads it as the
// absorbed per-head matrices W_UK_T [H, c, n] and W_UV [H, v, c], split from it once, in bf16
// (dequantized: an FP8 value times a power-of-two scale is exact in bf16, so these are the
// checkpoint's values), which batched_linear multiplies per head.
#pragma once

#include "dsv4/config.h"
#include "dsv4/sparse_mla_weights.h"
#include "dsv4/tensor.h"
#include "layer/device_weights.h"

namespace dsv4 {

struct SparseMlaIndexerWeightViews {
  WeightView wq_b, wk, weights_proj;
  TensorView k_norm, k_norm_bias;
};

struct SparseMlaWeightViews {
  WeightView wq_a, wq_b, wkv_a, wo;
  TensorView q_norm, kv_norm;
  TensorView w_uk_t;  // [H, c, n] bf16: q_nope · W_UK_Tᵀ per head is the absorbed query's latent part
  TensorView w_uv;    // [H, v, c] bf16: o_latent · W_UVᵀ per head is the head's value output
  SparseMlaIndexerWeightViews indexer;
};

class SparseMlaWeightStore {
 public:
  // `w` must outlive the store on the CPU (the views point into it).
  SparseMlaWeightStore(const ModelConfig& cfg, const SparseMlaWeights& w, Device device);
  const SparseMlaWeightViews& views() const { return views_; }
  // Bytes of every weight the ops read (values, scales, norms, the split wkv_b) on the device.
  int64_t bytes() const;

 private:
  HostTensor w_uk_t_, w_uv_;  // the split wkv_b on the host (the CPU views point into them)
  DeviceWeights placed_;
  SparseMlaWeightViews views_;
};

}  // namespace dsv4

// The weights of one V4 layer as its ops take them, on the layer's device, by DeviceWeights'
// rules (device_weights.h): FP8 projections stay FP8 on CUDA, except the compressors' wkv / wgate
// and the indexer's weights_proj — bf16 in every released checkpoint, and their CUDA ops
// (compressor_project, indexer_query) multiply the bf16 x, so an FP8 copy of one of them is
// dequantized to bf16 once. Norms, ape and the sink keep their dtype.
#pragma once

#include <optional>

#include "dsv4/tensor.h"
#include "dsv4/weights.h"
#include "layer/device_weights.h"

namespace dsv4 {

struct CompressorWeightViews {
  WeightView wkv, wgate;
  TensorView ape, norm;
};

struct IndexerWeightViews {
  WeightView wq_b, weights_proj;
  CompressorWeightViews compressor;
};

struct LayerWeightViews {
  WeightView wq_a, wq_b, wkv, wo_a, wo_b;
  TensorView q_norm, kv_norm, attn_sink;
  std::optional<CompressorWeightViews> compressor;
  std::optional<IndexerWeightViews> indexer;
};

class LayerWeightStore {
 public:
  // `w` must outlive the store on the CPU (the views point into it).
  LayerWeightStore(const AttentionWeights& w, Device device);
  const LayerWeightViews& views() const { return views_; }
  // Bytes of every weight the ops read (values, scales, norms, ape, sink) on the store's device.
  int64_t bytes() const;

 private:
  DeviceWeights placed_;
  LayerWeightViews views_;
};

}  // namespace dsv4

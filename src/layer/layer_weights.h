// The weights of one layer as its ops take them, on the layer's device.
//
// CPU: views of the AttentionWeights' host tensors (FP8 weights stay FP8 with their 128×128
// scales; the CPU linear dequantizes per block). CUDA: device copies owned here, every GEMM
// weight as bf16 — FP8 e4m3 weights are dequantized once (fp8 · scale of their 128×128 block,
// exact in bf16 for the shipped UE8M0 / power-of-two scales), fp32 weights rounded to bf16 —
// because the CUDA GEMMs (cuBLASLt) take bf16 operands; norms, ape and the sink keep their dtype.
#pragma once

#include <optional>
#include <vector>

#include "dsv4/device_tensor.h"
#include "dsv4/tensor.h"
#include "dsv4/weights.h"

namespace dsv4 {

struct WeightView {
  TensorView value;
  TensorView scale;  // undefined unless value is fp8
};

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
  WeightView gemm_weight(const Weight& w);
  TensorView plain(const HostTensor& t);

  Device device_;
  std::vector<DeviceTensor> owned_;
  LayerWeightViews views_;
};

}  // namespace dsv4

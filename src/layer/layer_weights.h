// The weights of one layer as its ops take them, on the layer's device.
//
// CPU: views of the AttentionWeights' host tensors (FP8 weights stay FP8 with their 128×128
// scales; the CPU GEMM dequantizes per block). CUDA: device copies owned here —
//   FP8 e4m3 weights stay FP8 (no bf16 copy: the CUDA GEMMs run them on FP8 tensor cores), their
//     block scales converted once to fp32 in the cuBLASLt layout (cuda_weight_scale: rows padded
//     to 4 scales), so weight memory is the checkpoint's FP8 bytes plus ~1/4000 for scales;
//   bf16 weights as they are; fp16 / fp32 weights rounded to bf16 (the CUDA GEMMs take bf16);
//   except the compressors' wkv / wgate and the indexer's weights_proj: bf16 in every released
//     checkpoint, and their CUDA ops (compressor_project, indexer_query) multiply the bf16 x, so an
//     FP8 copy of one of them is dequantized to bf16 once (exact for UE8M0 / power-of-two scales).
// Norms, ape and the sink keep their dtype.
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

  bool fp8() const { return value.dtype == DType::fp8_e4m3; }
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
  // A GEMM weight; on CUDA an FP8 one stays FP8 unless `keep_fp8` is false (then bf16).
  WeightView gemm_weight(const Weight& w, bool keep_fp8 = true);
  TensorView plain(const HostTensor& t);
  TensorView own(const HostTensor& t);  // a device copy owned by the store

  Device device_;
  std::vector<DeviceTensor> owned_;
  LayerWeightViews views_;
};

}  // namespace dsv4

// DeviceWeights: a layer's weights as its ops take them, on the layer's device — the per-tensor
// rules that every layer's weight store applies (layer_weights.h for V4's Attention,
// sparse_mla/sparse_mla_weight_store.h for V3.2's SparseMlaAttention).
//
// CPU: views of the host tensors (FP8 weights stay FP8 with their 128×128 scales; the CPU GEMM
// dequantizes per block); the host tensors must outlive the views. CUDA: device copies owned here —
//   FP8 e4m3 GEMM weights stay FP8 (no bf16 copy: the CUDA GEMMs run them on FP8 tensor cores),
//     their block scales converted once to fp32 in the cuBLASLt layout (cuda_weight_scale: rows
//     padded to 4 scales), so weight memory is the checkpoint's FP8 bytes plus ~1/4000 for scales;
//   unless the op reading it multiplies a bf16 activation (keep_fp8 false): then an FP8 weight is
//     dequantized to bf16 once (exact for UE8M0 / power-of-two scales);
//   bf16 GEMM weights as they are; fp16 / fp32 ones rounded to bf16 (the CUDA GEMMs take bf16);
//   plain tensors (norms, biases, ape, sink) copied with their dtype.
#pragma once

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

class DeviceWeights {
 public:
  explicit DeviceWeights(Device device) : device_(device) {}
  Device device() const { return device_; }
  // A GEMM weight; on CUDA an FP8 one stays FP8 unless `keep_fp8` is false (then bf16).
  WeightView gemm_weight(const Weight& w, bool keep_fp8 = true);
  // A tensor the ops read as it is (undefined stays undefined).
  TensorView plain(const HostTensor& t);

 private:
  TensorView own(const HostTensor& t);  // a device copy owned here

  Device device_;
  std::vector<DeviceTensor> owned_;
};

// Bytes of a weight's values (and scales) on its device; 0 for undefined views.
int64_t weight_bytes(const TensorView& t);
int64_t weight_bytes(const WeightView& w);

}  // namespace dsv4

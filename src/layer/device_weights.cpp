#include "layer/device_weights.h"

#include "dsv4/ops.h"

namespace dsv4 {

TensorView DeviceWeights::own(const HostTensor& t) {
  owned_.push_back(DeviceTensor::from_host(t));
  return owned_.back().view();
}

TensorView DeviceWeights::plain(const HostTensor& t) {
  if (device_ == Device::cpu || !t.view().defined()) return t.view();
  return own(t);
}

WeightView DeviceWeights::gemm_weight(const Weight& w, bool keep_fp8) {
  if (device_ == Device::cpu) return WeightView{w.value.view(), w.scale.view()};
  if (w.quantized() && keep_fp8) {
    // The fp32 scales in cuBLASLt's layout; the view keeps the grid's shape over padded rows.
    TensorView scale = own(cuda_weight_scale(w));
    scale.shape[scale.ndim - 1] = w.scale.shape().back();
    return WeightView{own(w.value), scale};
  }
  HostTensor bf16;
  if (w.quantized()) {
    // 128×128 blocks over the last two dims (V4's wo_a is [G, L, H·D/G] with per-group blocks).
    bf16 = HostTensor(DType::bf16, w.value.shape());
    dequantize_fp8_blocks(w.value, w.scale, kWeightScaleBlock, kWeightScaleBlock, bf16);
  } else {
    bf16 = HostTensor::copy_of(w.value, DType::bf16);
  }
  return WeightView{own(bf16), {}};
}

int64_t weight_bytes(const TensorView& t) {
  return t.defined() ? t.numel() * static_cast<int64_t>(dtype_size(t.dtype)) : 0;
}

int64_t weight_bytes(const WeightView& w) { return weight_bytes(w.value) + weight_bytes(w.scale); }

}  // namespace dsv4

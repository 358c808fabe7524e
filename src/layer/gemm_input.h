// The activation of a projection in the form its weight takes: the bf16 / fp32 tensor for a
// bf16 / fp32 weight; for an FP8 weight, when the layer quantizes GEMM inputs (as DeepSeek's
// Linear and vLLM do: per token and 128 columns, UE8M0 scales), its FP8 codes and fp32 scales in
// the CUDA FP8 GEMMs' layout — quantized once however many projections read it (x feeds wq_a and
// wkv; the normed q feeds wq_b and the indexer's wq_b).
#pragma once

#include <utility>

#include "dsv4/ops.h"
#include "layer/device_weights.h"
#include "layer/scratch.h"

namespace dsv4 {

struct GemmInput {
  TensorView dense;       // bf16 / fp32 (undefined when no reader needs it)
  TensorView fp8, scale;  // fp8_e4m3 [T, K] + fp32 [T, K/128] (undefined: not quantized)

  // (x, x_scale) for linear / indexer_query with weight w: the FP8 form when w is FP8 and this
  // input was quantized, else the dense one.
  std::pair<TensorView, TensorView> for_weight(const WeightView& w) const {
    if (w.fp8() && fp8.defined()) return {fp8, scale};
    return {dense, {}};
  }
};

// A [rows, blocks] fp32 view of scratch memory in the CUDA FP8 GEMMs' activation-scale layout:
// the transpose of a contiguous [blocks, rows] tensor.
TensorView act_scale_tensor(Scratch& ws, int64_t rows, int64_t blocks);

// `dense` [T, K] and, when `quantize`, its FP8 quantization (quantize_act_fp8, block 128) into
// scratch tensors, on `stream` (the launch's: a captured graph's stream is not the layer's).
GemmInput make_gemm_input(const TensorView& dense, bool quantize, Scratch& ws, Stream stream);

}  // namespace dsv4

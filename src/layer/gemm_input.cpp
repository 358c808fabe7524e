#include "layer/gemm_input.h"

namespace dsv4 {

TensorView act_scale_tensor(Scratch& ws, int64_t rows, int64_t blocks) {
  TensorView t = ws.tensor(DType::fp32, {blocks, rows});
  std::swap(t.shape[0], t.shape[1]);
  std::swap(t.strides[0], t.strides[1]);
  return t;
}

GemmInput make_gemm_input(const TensorView& dense, bool quantize, Scratch& ws, Stream stream) {
  GemmInput in{dense, {}, {}};
  if (!quantize) return in;
  const int64_t T = dense.shape[0], K = dense.shape[1];
  in.fp8 = ws.tensor(DType::fp8_e4m3, {T, K});
  in.scale = act_scale_tensor(ws, T, K / 128);
  quantize_act_fp8(dense, 128, in.fp8, in.scale, stream);
  return in;
}

}  // namespace dsv4

// The split-KV combine: merges per-split partial (o, lse) of each query row into the final
// output, applying the attention sink and the no-valid-key convention (out 0, lse +inf).
#pragma once

#include <cuda_runtime.h>

#include <cstdint>

namespace dsv4::cuda::combine {

struct CombineParams {
  const float* partial_o = nullptr;    // [rows·H, splits, 512] contiguous
  const float* partial_lse = nullptr;  // [rows·H, splits] contiguous, −inf = empty split
  const float* sink = nullptr;         // optional [H]
  // bf16 [b, s_q, H, 512]: element strides of b, s_q and H (multiples of 4: 8-byte stores),
  // last dim dense.
  uint16_t* out = nullptr;
  int64_t out_b_stride = 0, out_s_stride = 0, out_h_stride = 0;
  // [b, s_q, H] natural log, without the sink; element strides of b, s_q and H.
  float* lse = nullptr;
  int64_t lse_b_stride = 0, lse_s_stride = 0, lse_h_stride = 0;
  int64_t num_rows = 0;                // query rows (b · s_q) × heads
  int s_q = 1, num_heads = 0, num_splits = 0;
};

void launch_combine(const CombineParams& params, cudaStream_t stream);

}  // namespace dsv4::cuda::combine

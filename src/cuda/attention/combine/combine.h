// The split-KV combine: merges per-split partial (o, lse) of each query row into the final
// output, applying the attention sink and the no-valid-key convention (out 0, lse +inf).
#pragma once

#include <cuda_runtime.h>

#include <cstdint>

namespace dsv4::cuda::combine {

struct CombineParams {
  const float* partial_o = nullptr;    // [rows·H, splits, 512]
  const float* partial_lse = nullptr;  // [rows·H, splits], −inf = empty split
  const float* sink = nullptr;         // optional [H]
  uint16_t* out = nullptr;             // bf16 [rows·H, 512]
  float* lse = nullptr;                // [rows·H], natural log, without the sink
  int64_t num_rows = 0;                // query rows × heads
  int num_heads = 0, num_splits = 0;
};

void launch_combine(const CombineParams& params, cudaStream_t stream);

}  // namespace dsv4::cuda::combine

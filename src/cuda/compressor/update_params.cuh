// Everything the two kernels of compressor_update_and_emit read, as plain pointers, strides and
// sizes (built by update_and_emit.cu from validated views).
#pragma once

#include <cstdint>

#include "cuda/common/rope_table.cuh"
#include "cuda/compressor/device_views.cuh"
#include "dsv4/compressor.h"

namespace dsv4::cuda::compressor {

struct UpdateParams {
  // Shape of the compressor.
  int D = 0, r = 0, K = 0, coff = 0, rope_dims = 0;  // K = coff·r ring rows per request
  int64_t W = 0;                                     // projection width coff·D
  float eps = 0.0f;
  // The batch.
  int64_t T = 0, R = 0;
  const float* kv_rows = nullptr;
  const float* score_rows = nullptr;
  int64_t kv_stride = 0, score_stride = 0;
  IndexVector positions, token_to_req, context_lens;
  const void* norm_weight = nullptr;  // [D], contiguous
  bool norm_bf16 = false;
  RopeTable rope;  // [max_pos, rope_dims]
  // The rings: row i of request q at state_table.slot(q, i), [kv (W) | score (W)].
  float* state_rows = nullptr;
  int64_t state_stride = 0;
  BlockTable state_table;
  // The output cache: entry j of request q at out_table.slot(q, j), in blocks of out_stride B.
  CompressorTarget target = CompressorTarget::kv_cache;
  uint8_t* out_data = nullptr;
  int64_t out_stride = 0;
  BlockTable out_table;
  KvGeometry geometry{};    // kv_cache
  float tensor_scale = 1.0f;  // kv_cache, FP8_PER_TENSOR
  float hadamard_scale = 0.0f;  // indexer_keys: D^-0.5
  float* entries = nullptr;     // optional [T, D]
  int64_t entries_stride = 0;
};

}  // namespace dsv4::cuda::compressor

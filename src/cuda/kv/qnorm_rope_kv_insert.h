// CUDA entry point of qnorm_rope_kv_insert (src/cuda/kv/qnorm_rope_kv_insert.cu). Called by the
// public op (src/ops/qnorm_rope_kv_insert.cpp) after it has validated every argument except the
// index values, so this trusts dtypes, shapes, strides and the cache geometry. Index values are
// data on the device; the kernel treats them as follows:
//   - a position outside [0, cos_sin.shape[0]): the token is skipped (its q, q_fp8, kv and cache
//     slot are left untouched);
//   - a slot outside [0, cache.num_slots()) (−1 included): nothing is stored, kv still gets the
//     quantize-dequantize;
//   - the same slot for two tokens: both encode, which token's bytes the slot ends up holding is
//     unspecified (each token's kv is still its own dequantized value).
// q, q_fp8, kv and the stored bytes are bit-identical to the CPU reference (shared DSV4_HD math).
#pragma once

#include "dsv4/ops.h"

namespace dsv4::cuda {

void qnorm_rope_kv_insert(const TensorView& q, const TensorView& kv, const TensorView& positions,
                          const TensorView& cos_sin, float eps, const KvCacheView& cache,
                          const TensorView& slot_mapping, const Fp8QueryOutput& fp8_query,
                          Stream stream);

}  // namespace dsv4::cuda

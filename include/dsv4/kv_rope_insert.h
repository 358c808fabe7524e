// The cache write of a layer whose queries need no head norm (DeepSeek-V3.2's MLA, vLLM's
// concat_and_cache_mla with the rope applied first): RoPE on the last R dims of each kv row, then
// the row quantized into the paged cache at its slot, and kv overwritten with what the cache now
// holds (dequantized), so the caller attends to exactly what later steps read back.
//
// It is qnorm_rope_kv_insert (ops.h) without queries, on both backends: same validation, same
// per-token encoding (kv_layout.h), CPU and CUDA bit-identical, CUDA-graph capturable, no
// allocation or synchronization. For V3.2: kv [T, 576] bf16 = latent (already RMS-normed) + k_pe,
// cache V32_FP8 (656 B per token). Errors name qnorm_rope_kv_insert's arguments.
#pragma once

#include "dsv4/kv_layout.h"
#include "dsv4/ops.h"
#include "dsv4/tensor.h"

namespace dsv4 {

//   kv [T, D] bf16 (row stride allowed), in place; D = the layout's dim.
//   positions [T] int32/int64 in [0, cos_sin.shape[0]); cos_sin fp32 [max_pos, R].
//   slot_mapping [T] int32/int64: -1 (not stored; kv still gets the cache's rounding) or a
//   distinct slot of the cache. Out-of-range values: as qnorm_rope_kv_insert (CPU: dsv4::Error
//   before anything is written; CUDA: the token is skipped / not stored).
//   An empty step (T = 0) is a no-op, even when kv has no memory behind it.
void kv_rope_insert(const TensorView& kv, const TensorView& positions, const TensorView& cos_sin,
                    const KvCacheView& cache, const TensorView& slot_mapping,
                    Stream stream = nullptr);

}  // namespace dsv4

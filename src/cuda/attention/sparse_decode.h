// CUDA entry points of the sparse decode (implemented in src/cuda/attention/ .cu files). Called by
// the host API (src/ops/sparse_decode.cpp, src/ops/sparse_combine.cpp) only after it has
// validated every argument, so these trust shapes, dtypes, strides and devices. Index values are
// not range-checked: a kernel must treat -1 and any slot outside a cache as invalid (never read).
#pragma once

#include "dsv4/ops.h"

namespace dsv4::cuda {

// Whole decode: partial attention per split of `schedule` into the workspace (partial_o fp32
// [b, s_q, H, num_splits, d_v] from byte 0, partial_lse fp32 [b, s_q, H, num_splits] right after,
// −inf for an empty split: the layout documented in ops.h), then the combine into args.out /
// args.lse. An implementation may skip the partials when num_splits == 1.
void sparse_decode(const SparseDecodeArgs& args, const DecodeSchedule& schedule,
                   const TensorView& workspace, Stream stream);

// The combine alone, same contract as dsv4::sparse_attention_combine.
void sparse_attention_combine(const TensorView& partial_o, const TensorView& partial_lse,
                              const TensorView& attn_sink, const TensorView& out,
                              const TensorView& lse, Stream stream);

}  // namespace dsv4::cuda

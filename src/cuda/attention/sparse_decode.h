#pragma once

#include "dsv4/ops.h"

namespace dsv4::cuda {

void sparse_decode(const SparseDecodeArgs& args, const DecodeSchedule& schedule,
                   const TensorView& workspace, Stream stream);

void sparse_attention_combine(const TensorView& partial_o, const TensorView& partial_lse,
                              const TensorView& attn_sink, const TensorView& out,
                              const TensorView& lse, Stream stream);

}  // namespace dsv4::cuda

// CPU combine of split-KV partials, for callers that already validated the views (the public
// dsv4::sparse_attention_combine and the CPU sparse_decode).
#pragma once

#include "dsv4/tensor.h"

namespace dsv4::cpu {

// partial_o fp32 [b, s_q, H, S, d_v] and partial_lse fp32 [b, s_q, H, S] contiguous,
// attn_sink nullptr or fp32 [H], out bf16 [b, s_q, H, d_v] and lse fp32 [b, s_q, H], both of
// any strides with the last dim dense. A split with lse −inf is empty: its partial_o is never read.
void combine_partials(const TensorView& partial_o, const TensorView& partial_lse,
                      const float* attn_sink, const TensorView& out, const TensorView& lse);

}  // namespace dsv4::cpu

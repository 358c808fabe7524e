// The host side of a cos/sin table lookup shared by the CPU kernels of apply_rope,
// inv_rope_fp8_quant and qnorm_rope_kv_insert: the table's argument checks and row access. The
// rotation itself is src/math/rope.h (shared with the CUDA kernels).
#pragma once

#include <cstdint>

#include "dsv4/tensor.h"
#include "math/rope.h"

namespace dsv4::cpu {

// cos_sin: fp32 [max_pos, R] with R even and 2 <= R <= head_dim, rows contiguous. Returns R.
int64_t check_rope_table(const char* where, const TensorView& cos_sin, int64_t head_dim);

// Every positions[t] lies in [0, cos_sin.shape[0]) (a CPU pass over the data).
void check_positions_in_table(const char* where, const TensorView& positions,
                              const TensorView& cos_sin);

// Pointer to the table row of position p.
inline const float* rope_table_row(const TensorView& cos_sin, int64_t p) {
  return static_cast<const float*>(cos_sin.data) + p * cos_sin.strides[0];
}

}  // namespace dsv4::cpu

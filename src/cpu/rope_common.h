// The host side of a cos/sin table lookup shared by the CPU kernels of apply_rope,
// inv_rope_fp8_quant and qnorm_rope_kv_insert: the positions' data check and row access. The
// rotation itself is src/math/rope.h (shared with the CUDA kernels).
#pragma once

#include <cstdint>

#include "dsv4/tensor.h"
#include "math/rope.h"

namespace dsv4::cpu {

// Every positions[t] lies in [0, cos_sin.shape[0]) (a CPU pass over the data).
void check_positions_in_table(const char* where, const TensorView& positions,
                              const TensorView& cos_sin);

// Pointer to the table row of position p.
inline const float* rope_table_row(const TensorView& cos_sin, int64_t p) {
  return static_cast<const float*>(cos_sin.data) + p * cos_sin.strides[0];
}

}  // namespace dsv4::cpu

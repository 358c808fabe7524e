// CUDA entry point of apply_rope (src/cuda/rope/apply_rope.cu). Called by the public op
// (src/ops/rope.cpp) after it has validated every argument except the position values, so this
// trusts dtypes, shapes and strides. A position outside [0, cos_sin.shape[0]) cannot be checked
// on the host: the kernel leaves that token's rows of y unwritten. Results are bit-identical to
// the CPU reference (shared DSV4_HD rotation, src/math/rope.h).
#pragma once

#include "dsv4/ops.h"

namespace dsv4::cuda {

void apply_rope(const TensorView& x, const TensorView& positions, const TensorView& cos_sin,
                bool inverse, const TensorView& y, Stream stream);

}  // namespace dsv4::cuda

// The argument checks of the dsv4::linear and dsv4::grouped_wo_a front doors (src/ops/linear.cpp,
// grouped_wo_a.cpp), for the entries that run those ops on a chosen kernel
// (src/runtime/gemm_path.h) and must refuse exactly what the ops refuse. Each throws dsv4::Error
// "<op>: <argument>: expected X, got Y" and writes nothing; neither checks devices or workspace.
#pragma once

#include "dsv4/tensor.h"

namespace dsv4::ops {

void validate_linear(const TensorView& x, const TensorView& x_scale, const TensorView& w,
                     const TensorView& w_scale, const TensorView& y);
void validate_grouped_wo_a(const TensorView& o, const TensorView& o_scale, const TensorView& wo_a,
                           const TensorView& wo_a_scale, const TensorView& z);

}  // namespace dsv4::ops

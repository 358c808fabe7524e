// CUDA entry point of dsv4::dequantize_fp8_blocks (src/cpu/dequantize_fp8_blocks.cpp validates
// every argument, then calls this for CUDA tensors). Every stride the validation allows is
// honoured (2-d views are a batch of one).
#pragma once

#include "dsv4/ops.h"

namespace dsv4::cuda {

void dequantize_fp8_blocks(const TensorView& x, const TensorView& scale, int block_rows,
                           int block_cols, const TensorView& y, Stream stream);

}  // namespace dsv4::cuda

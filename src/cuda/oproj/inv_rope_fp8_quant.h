// CUDA entry point of dsv4::inv_rope_fp8_quant (src/ops/inv_rope_fp8_quant.cpp validates every
// argument, then calls this for CUDA tensors): one pass over o — each lane loads 8 consecutive
// values of a head (one 16-byte load), rotates its rope pairs back (the CPU's rope_rotate_pair),
// rounds them to bf16, and the lanes of a quantization block reduce its amax and store 8 codes
// each (one 8-byte store). Bit-identical to the CPU. A token whose position is outside the table
// is left unwritten.
#pragma once

#include "dsv4/ops.h"

namespace dsv4::cuda {

void inv_rope_fp8_quant(const TensorView& o, const TensorView& positions, const TensorView& cos_sin,
                        int block, const TensorView& o_fp8, const TensorView& o_scale, Stream stream);

}  // namespace dsv4::cuda

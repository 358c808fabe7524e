// CUDA entry point of the sparse prefill (implemented in src/cuda/attention/ .cu files). Called
// by dsv4::sparse_prefill (src/ops/sparse_prefill.cpp) after it validated every argument; index
// values are not checked: -1 and indices >= s_kv are masked by the kernel, as in FlashMLA.
#pragma once

#include "dsv4/ops.h"

namespace dsv4::cuda {

void sparse_prefill(const SparsePrefillArgs& args, Stream stream);

}  // namespace dsv4::cuda

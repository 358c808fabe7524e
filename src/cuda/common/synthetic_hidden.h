// CUDA entry point of dsv4::synthetic_hidden (arguments validated by the op).
#pragma once

#include "dsv4/ops.h"

namespace dsv4::cuda {

void synthetic_hidden(const TensorView& req_ids, const TensorView& positions, uint64_t seed,
                      const TensorView& out, Stream stream);

}  // namespace dsv4::cuda

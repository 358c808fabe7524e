#pragma once

#include "dsv4/ops.h"

namespace dsv4::cuda {
void sparse_prefill(const SparsePrefillArgs& args, Stream stream);
}  // namespace dsv4::cuda

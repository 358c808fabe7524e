// Backend selection for the ops of include/dsv4/ops.h: every tensor argument of one call lives on
// one device, and that device picks the implementation (CPU reference here, CUDA kernels under
// src/cuda/). Mixing devices is an argument error.
#pragma once

#include <initializer_list>

#include "dsv4/tensor.h"

namespace dsv4::cpu {

struct NamedView {
  const char* name;
  const TensorView& view;
};

// The device shared by the defined views of `args`; undefined (optional) views are ignored.
// Throws "<where>: <name>.device: expected <device of the first>, got <other>" when they differ.
Device common_device(const char* where, std::initializer_list<NamedView> args);

// For ops whose CUDA kernel has not been written yet (or when the CUDA backend is not built):
// throws "<where>: CUDA backend not implemented" / "... not built".
[[noreturn]] void throw_cuda_unavailable(const char* where);

}  // namespace dsv4::cpu

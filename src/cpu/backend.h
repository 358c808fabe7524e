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

// The CUDA branch of an op entry point (a void function), as one statement:
// `DSV4_CUDA_DISPATCH(kOp, cuda::op(..., stream));` runs the call and returns when the CUDA backend
// is built, and throws "<kOp>: CUDA backend not built ..." otherwise. The call is variadic so that
// the commas of a braced argument need no extra parentheses. Without the backend the call is
// dropped unparsed (the cuda:: headers are not included), so a parameter that only the call reads,
// typically the Stream, is declared [[maybe_unused]] in the op's definition.
#if defined(DSV4_WITH_CUDA)
#define DSV4_CUDA_DISPATCH(where, ...) \
  do {                                 \
    __VA_ARGS__;                       \
    return;                            \
  } while (0)
#else
#define DSV4_CUDA_DISPATCH(where, ...) ::dsv4::cpu::throw_cuda_unavailable(where)
#endif

}  // namespace dsv4::cpu

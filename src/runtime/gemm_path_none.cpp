// src/runtime/gemm_path.h without CUDA (the build compiles this file instead of
// src/cuda/runtime/gemm_path.cpp): there is no kernel to choose between.
#include "runtime/gemm_path.h"

#include "runtime/not_built.h"

namespace dsv4::rt {

void linear_on_path(const GemmChoice&, const TensorView&, const TensorView&, const TensorView&,
                    const TensorView&, const TensorView&, const TensorView&, Stream) {
  fail_not_built("linear_on_path");
}
void grouped_wo_a_on_path(const GemmChoice&, const TensorView&, const TensorView&, const TensorView&,
                          const TensorView&, const TensorView&, const TensorView&, Stream) {
  fail_not_built("grouped_wo_a_on_path");
}

}  // namespace dsv4::rt

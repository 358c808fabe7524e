// src/runtime/ceiling_gemm.h without CUDA (the build compiles this file instead of
// src/cuda/runtime/ceiling_gemm.cpp): there are no tensor cores to plan for.
#include "runtime/ceiling_gemm.h"

#include "runtime/not_built.h"

namespace dsv4::rt {

struct CeilingGemm::Plan {};

CeilingGemm::CeilingGemm(const char* where, const TensorView&, const TensorView&,
                         const TensorView&, const TensorView&) {
  fail_not_built(where);
}
CeilingGemm::~CeilingGemm() = default;
// Unreachable: no CeilingGemm can be constructed without CUDA.
void CeilingGemm::run(Stream) const { fail_not_built("CeilingGemm::run"); }

}  // namespace dsv4::rt

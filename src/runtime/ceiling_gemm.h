// The tensor-core ceiling `dsv4 bench layer` judges a layer's GEMMs against (tools/dsv4/
// hw_ceilings.h): one square GEMM d [n, n] bf16 = b · aᵀ — row-major x · wᵀ as the layer's
// projections are laid out, cuBLASLt's "TN" — with a and b both bf16 or both fp8_e4m3 (unscaled:
// the plain tensor-core rate), fp32 accumulation, through the algorithm cuBLASLt's heuristic
// ranks first for the workspace given. Planned once (descriptors and the heuristic query), run as
// often as a timing loop needs. Not an op: the layer's GEMMs are dsv4::linear / grouped_wo_a.
// Implemented in src/cuda/runtime/ when CUDA is built; otherwise (ceiling_gemm_none.cpp, chosen
// by the build) constructing one throws dsv4::Error.
#pragma once

#include <memory>

#include "dsv4/ops.h"  // Stream
#include "dsv4/tensor.h"

namespace dsv4::rt {

class CeilingGemm {
 public:
  // a, b: [n, n] contiguous, one dtype (bf16 or fp8_e4m3); d: [n, n] bf16 contiguous; workspace:
  // 1-d uint8; every one on the CUDA device (the current one) and alive while the plan runs.
  // Throws dsv4::Error naming `where` and the argument for anything else, or when cuBLASLt has
  // no algorithm for the problem.
  CeilingGemm(const char* where, const TensorView& a, const TensorView& b, const TensorView& d,
              const TensorView& workspace);
  ~CeilingGemm();
  CeilingGemm(const CeilingGemm&) = delete;
  CeilingGemm& operator=(const CeilingGemm&) = delete;

  // Enqueues one GEMM on `stream`: no allocation, no synchronization.
  void run(Stream stream) const;

 private:
  struct Plan;  // the cuBLASLt descriptors, the algorithm and the operands
  std::unique_ptr<Plan> plan_;
};

}  // namespace dsv4::rt

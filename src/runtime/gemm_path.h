// Which kernel runs a CUDA linear / grouped_wo_a: the library's own choice, or one forced. The ops
// always take the automatic path (the skinny decode GEMM for the problems skinny_gemm_preferred()
// accepts, cuBLASLt otherwise; docs/notes/skinny-gemm.md); forcing one is for the benchmarks and
// tests that time or check both kernels at the same sizes (`dsv4 bench --filter gemm_fp8`), so the
// token limit of the automatic choice can be moved on measurements. Not an op option.
// Implemented in src/cuda/runtime/ when CUDA is built; otherwise (gemm_path_none.cpp, chosen by
// the build) every call throws dsv4::Error.
#pragma once

#include <cstdint>

#include "dsv4/ops.h"  // Stream
#include "dsv4/tensor.h"

namespace dsv4::rt {

enum class GemmPath : uint8_t {
  automatic,  // what dsv4::linear / grouped_wo_a run
  cublaslt,   // cuBLASLt (FP8: one block-scaled matmul per group, fanned out over streams)
  skinny,     // the skinny decode GEMM (fp8 / bf16 operands); a problem it does not take throws
};

inline const char* gemm_path_name(GemmPath path) {
  switch (path) {
    case GemmPath::automatic: return "automatic";
    case GemmPath::cublaslt: return "cublaslt";
    case GemmPath::skinny: return "skinny";
  }
  return "?";
}

// How a call runs: the path, and for the skinny kernel (0: its own choice, skinny_gemm.h) the
// number of K splits (fewer run where K has fewer blocks or the workspace holds fewer partial
// sums) and the token tile (16, 32, 64 or 128 tokens a CTA) — so a benchmark can show what another
// rule would give, and a test can compare tiles.
struct GemmChoice {
  GemmPath path = GemmPath::automatic;
  int64_t skinny_splits = 0;
  int skinny_token_tile = 0;
};

// dsv4::linear / grouped_wo_a (include/dsv4/ops.h: the same arguments, validated the same, every
// tensor on the CUDA device) on `choice`'s kernel. Throws dsv4::Error for what the op refuses, for
// a forced kernel that does not take the problem, and without CUDA.
void linear_on_path(const GemmChoice& choice, const TensorView& x, const TensorView& x_scale,
                    const TensorView& w, const TensorView& w_scale, const TensorView& y,
                    const TensorView& workspace, Stream stream);
void grouped_wo_a_on_path(const GemmChoice& choice, const TensorView& o, const TensorView& o_scale,
                          const TensorView& wo_a, const TensorView& wo_a_scale, const TensorView& z,
                          const TensorView& workspace, Stream stream);

}  // namespace dsv4::rt

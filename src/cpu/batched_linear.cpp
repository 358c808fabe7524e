// The CPU kernel of batched_linear: the B batches as independent problems of the shared CPU GEMM
// (one parallel region), each exactly what linear computes for (x[b], w[b]).
#include <vector>

#include "cpu/gemm.h"
#include "cpu/kernels.h"
#include "cpu/rows.h"

namespace dsv4::cpu {

void batched_linear(const TensorView& x, const TensorView& w, const TensorView& y,
                    const TensorView& /*workspace*/, Stream /*stream*/) {
  const int64_t B = x.shape[0];
  std::vector<GemmProblem> problems;
  problems.reserve(static_cast<size_t>(B));
  for (int64_t b = 0; b < B; ++b)
    problems.push_back({ScaledMatrix::from_views(select0(x, b), {}, 1, 0),
                        ScaledMatrix::from_views(select0(w, b), {}, kWeightBlock, kWeightBlock),
                        OutputMatrix::from_view(select0(y, b))});
  gemm_xwT(problems.data(), static_cast<int64_t>(problems.size()));
}

}  // namespace dsv4::cpu

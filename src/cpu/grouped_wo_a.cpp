// The CPU kernel of grouped_wo_a: the G group GEMMs as one batch of the shared CPU GEMM.
#include <vector>

#include "cpu/gemm.h"
#include "cpu/kernels.h"
#include "cpu/rows.h"

namespace dsv4::cpu {

void grouped_wo_a(const TensorView& o, const TensorView& o_scale, const TensorView& wo_a,
                  const TensorView& wo_a_scale, const TensorView& z, const TensorView& /*workspace*/,
                  Stream /*stream*/) {
  // The activation scale block of o (0 when o is not fp8).
  const int64_t block = activation_scale_block(o, o_scale);
  const int64_t G = wo_a.shape[0], L = wo_a.shape[1], Dg = wo_a.shape[2];
  std::vector<GemmProblem> groups;
  groups.reserve(static_cast<size_t>(G));
  for (int64_t g = 0; g < G; ++g) {
    const TensorView o_g = column_range(o, g * Dg, (g + 1) * Dg);
    const TensorView o_scale_g =
        block > 0 ? column_range(o_scale, g * Dg / block, (g + 1) * Dg / block) : TensorView{};
    const TensorView w_scale_g = wo_a_scale.defined() ? select0(wo_a_scale, g) : TensorView{};
    groups.push_back({ScaledMatrix::from_views(o_g, o_scale_g, 1, block),
                      ScaledMatrix::from_views(select0(wo_a, g), w_scale_g, kWeightBlock,
                                                    kWeightBlock),
                      OutputMatrix::from_view(column_range(z, g * L, (g + 1) * L))});
  }
  gemm_xwT(groups.data(), static_cast<int64_t>(groups.size()));
}

}  // namespace dsv4::cpu

// grouped_wo_a (docs/spec.md §2 step 6): the grouped low-rank output projection. o [T, H·D] is viewed as
// G groups of H·D/G columns; group g is projected by its own wo_a[g] [L, H·D/G] into columns
// [g·L, (g+1)·L) of z. All G GEMMs run as one batch of the shared CPU GEMM.
#include <string>
#include <vector>

#include "cpu/backend.h"
#include "cpu/gemm.h"
#include "cpu/rows.h"
#include "cpu/validate.h"
#include "dsv4/ops.h"
#ifdef DSV4_WITH_CUDA
#include "cuda/gemm/grouped_wo_a.h"
#endif

namespace dsv4 {

namespace {
constexpr const char* kOp = "grouped_wo_a";
constexpr int64_t kWeightBlock = 128;

// Returns the activation scale block of o (0 when o is not fp8).
int64_t validate_grouped_wo_a(const TensorView& o, const TensorView& o_scale,
                              const TensorView& wo_a, const TensorView& wo_a_scale,
                              const TensorView& z) {
  check_defined(kOp, "o", o);
  check_defined(kOp, "wo_a", wo_a);
  check_defined(kOp, "z", z);
  cpu::check_dtype_in(kOp, "o", o, {DType::bf16, DType::fp32, DType::fp8_e4m3});
  cpu::check_dtype_in(kOp, "wo_a", wo_a, {DType::bf16, DType::fp32, DType::fp8_e4m3});
  cpu::check_dtype_in(kOp, "z", z, {DType::bf16, DType::fp32});
  check_ndim(kOp, "o", o, 2);
  check_ndim(kOp, "wo_a", wo_a, 3);
  const int64_t T = o.shape[0], G = wo_a.shape[0], L = wo_a.shape[1], Dg = wo_a.shape[2];
  if (G < 1) fail_expected(kOp, "wo_a.shape[0] (groups G)", ">= 1", G);
  check_dim(kOp, "o", o, 1, G * Dg);
  check_shape(kOp, "z", z, {T, G * L});
  cpu::check_row_strided(kOp, "o", o);
  cpu::check_row_strided(kOp, "wo_a", wo_a);
  cpu::check_output_layout(kOp, "z", z);
  const int64_t block = cpu::check_activation_scale(kOp, "o", o, "o_scale", o_scale);
  if (block > 0 && Dg % block != 0)
    fail_expected(kOp, "o_scale.shape[1]",
                  "scale blocks that do not straddle groups (group width " + std::to_string(Dg) +
                      " a multiple of the block)",
                  o_scale.shape[1]);
  cpu::check_weight_scale(kOp, "wo_a", wo_a, "wo_a_scale", wo_a_scale,
                          {G, (L + kWeightBlock - 1) / kWeightBlock, (Dg + kWeightBlock - 1) / kWeightBlock});
  cpu::check_outputs_disjoint(
      kOp, {{"z", z}},
      {{"o", o}, {"wo_a", wo_a}, {"o_scale", o_scale}, {"wo_a_scale", wo_a_scale}});
  return block;
}
}  // namespace

void grouped_wo_a(const TensorView& o, const TensorView& o_scale, const TensorView& wo_a,
                  const TensorView& wo_a_scale, const TensorView& z, Stream stream) {
  grouped_wo_a(o, o_scale, wo_a, wo_a_scale, z, TensorView{}, stream);
}

void grouped_wo_a(const TensorView& o, const TensorView& o_scale, const TensorView& wo_a,
                  const TensorView& wo_a_scale, const TensorView& z,
                  [[maybe_unused]] const TensorView& workspace, [[maybe_unused]] Stream stream) {
  const int64_t block = validate_grouped_wo_a(o, o_scale, wo_a, wo_a_scale, z);
  if (cpu::common_device(kOp, {{"o", o}, {"o_scale", o_scale}, {"wo_a", wo_a},
                               {"wo_a_scale", wo_a_scale}, {"z", z}, {"workspace", workspace}}) ==
      Device::cuda) {
    DSV4_CUDA_DISPATCH(kOp, cuda::grouped_wo_a(o, o_scale, wo_a, wo_a_scale, z, workspace, stream));
  }

  const int64_t G = wo_a.shape[0], L = wo_a.shape[1], Dg = wo_a.shape[2];
  std::vector<cpu::GemmProblem> groups;
  groups.reserve(static_cast<size_t>(G));
  for (int64_t g = 0; g < G; ++g) {
    const TensorView o_g = cpu::column_range(o, g * Dg, (g + 1) * Dg);
    const TensorView o_scale_g =
        block > 0 ? cpu::column_range(o_scale, g * Dg / block, (g + 1) * Dg / block) : TensorView{};
    const TensorView w_scale_g = wo_a_scale.defined() ? cpu::select0(wo_a_scale, g) : TensorView{};
    groups.push_back({cpu::ScaledMatrix::from_views(o_g, o_scale_g, 1, block),
                      cpu::ScaledMatrix::from_views(cpu::select0(wo_a, g), w_scale_g, kWeightBlock,
                                                    kWeightBlock),
                      cpu::OutputMatrix::from_view(cpu::column_range(z, g * L, (g + 1) * L))});
  }
  cpu::gemm_xwT(groups.data(), static_cast<int64_t>(groups.size()));
}

}  // namespace dsv4

// grouped_wo_a (docs/spec.md §2 step 6): the grouped low-rank output projection. o [T, H·D] is viewed as
// G groups of H·D/G columns; group g is projected by its own wo_a[g] [L, H·D/G] into columns
// [g·L, (g+1)·L) of z. All G GEMMs run as one batch of the shared CPU GEMM.
// The front door: validation, then the backend.
#include <string>

#include "dsv4/ops.h"
#include "ops/backend.h"
#include "ops/gemm_checks.h"
#include "ops/validate.h"

namespace dsv4 {

namespace {
constexpr const char* kOp = "grouped_wo_a";
constexpr int64_t kWeightBlock = 128;
}  // namespace

void ops::validate_grouped_wo_a(const TensorView& o, const TensorView& o_scale,
                                const TensorView& wo_a, const TensorView& wo_a_scale,
                                const TensorView& z) {
  check_defined(kOp, "o", o);
  check_defined(kOp, "wo_a", wo_a);
  check_defined(kOp, "z", z);
  ops::check_dtype_in(kOp, "o", o, {DType::bf16, DType::fp32, DType::fp8_e4m3});
  ops::check_dtype_in(kOp, "wo_a", wo_a, {DType::bf16, DType::fp32, DType::fp8_e4m3});
  ops::check_dtype_in(kOp, "z", z, {DType::bf16, DType::fp32});
  check_ndim(kOp, "o", o, 2);
  check_ndim(kOp, "wo_a", wo_a, 3);
  const int64_t T = o.shape[0], G = wo_a.shape[0], L = wo_a.shape[1], Dg = wo_a.shape[2];
  if (G < 1) fail_expected(kOp, "wo_a.shape[0] (groups G)", ">= 1", G);
  check_dim(kOp, "o", o, 1, G * Dg);
  check_shape(kOp, "z", z, {T, G * L});
  ops::check_row_strided(kOp, "o", o);
  ops::check_row_strided(kOp, "wo_a", wo_a);
  ops::check_output_layout(kOp, "z", z);
  const int64_t block = ops::check_activation_scale(kOp, "o", o, "o_scale", o_scale);
  if (block > 0 && Dg % block != 0)
    fail_expected(kOp, "o_scale.shape[1]",
                  "scale blocks that do not straddle groups (group width " + std::to_string(Dg) +
                      " a multiple of the block)",
                  o_scale.shape[1]);
  ops::check_weight_scale(kOp, "wo_a", wo_a, "wo_a_scale", wo_a_scale,
                          {G, (L + kWeightBlock - 1) / kWeightBlock, (Dg + kWeightBlock - 1) / kWeightBlock});
  ops::check_outputs_disjoint(
      kOp, {{"z", z}},
      {{"o", o}, {"wo_a", wo_a}, {"o_scale", o_scale}, {"wo_a_scale", wo_a_scale}});
}

void grouped_wo_a(const TensorView& o, const TensorView& o_scale, const TensorView& wo_a,
                  const TensorView& wo_a_scale, const TensorView& z, Stream stream) {
  grouped_wo_a(o, o_scale, wo_a, wo_a_scale, z, TensorView{}, stream);
}

void grouped_wo_a(const TensorView& o, const TensorView& o_scale, const TensorView& wo_a,
                  const TensorView& wo_a_scale, const TensorView& z,
                  const TensorView& workspace, Stream stream) {
  ops::validate_grouped_wo_a(o, o_scale, wo_a, wo_a_scale, z);
  const Device device =
      ops::common_device(kOp, {{"o", o}, {"o_scale", o_scale}, {"wo_a", wo_a},
                               {"wo_a_scale", wo_a_scale}, {"z", z}, {"workspace", workspace}});
  ops::kernel(kOp, ops::kGroupedWoA, device)(o, o_scale, wo_a, wo_a_scale, z, workspace, stream);
}

}  // namespace dsv4

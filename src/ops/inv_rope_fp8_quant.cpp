// inv_rope_fp8_quant (docs/spec.md §2 steps 5–6, production numerics): inverse RoPE on the rope dims of
// each head of the attention output, rounded to bf16, then FP8 per 1×block of the flattened row —
// apply_rope(inverse) into a bf16 o followed by quantize_act_fp8, in one pass over o.
// The front door: validation, then the backend.
#include <string>

#include "dsv4/ops.h"
#include "ops/backend.h"
#include "ops/validate.h"

namespace dsv4 {

void inv_rope_fp8_quant(const TensorView& o, const TensorView& positions, const TensorView& cos_sin,
                        int block, const TensorView& o_fp8, const TensorView& o_scale,
                        Stream stream) {
  constexpr const char* kOp = "inv_rope_fp8_quant";
  check_defined(kOp, "o", o);
  check_dtype(kOp, "o", o, DType::bf16);
  check_ndim(kOp, "o", o, 3);
  ops::check_row_strided(kOp, "o", o);
  const int64_t T = o.shape[0], H = o.shape[1], D = o.shape[2];
  if ((block == 64 || block == 128) && D % block != 0)
    fail_expected(kOp, "o.shape[2] (head dim D)",
                  "a multiple of block = " + std::to_string(block) + " (a block never spans two heads)", D);
  ops::check_act_quant_outputs(kOp, "o_fp8", o_fp8, "o_scale", o_scale, T, H * D, block);
  ops::check_index_vector(kOp, "positions", positions, T);
  ops::check_rope_table(kOp, cos_sin, D);
  // Positions and the table are read while the outputs are written: none may lie inside them.
  ops::check_outputs_disjoint(kOp, {{"o_fp8", o_fp8}, {"o_scale", o_scale}},
                              {{"o", o}, {"positions", positions}, {"cos_sin", cos_sin}});
  const Device device = ops::common_device(kOp, {{"o", o}, {"positions", positions},
                                                 {"cos_sin", cos_sin}, {"o_fp8", o_fp8},
                                                 {"o_scale", o_scale}});
  // Position values are checked by the CPU kernel; on CUDA they live on the device and the kernel
  // leaves a token with an invalid one unwritten.
  ops::kernel(kOp, ops::kInvRopeFp8Quant, device)(o, positions, cos_sin, block, o_fp8, o_scale,
                                                  stream);
}

}  // namespace dsv4

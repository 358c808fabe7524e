// inv_rope_fp8_quant (SPEC §2 steps 5–6, production numerics): inverse RoPE on the rope dims of
// each head of the attention output, rounded to bf16, then FP8 per 1×block of the flattened row —
// apply_rope(inverse) into a bf16 o followed by quantize_act_fp8, in one pass over o.
#include <string>
#include <vector>

#include "cpu/act_quant.h"
#include "cpu/backend.h"
#include "cpu/rope_common.h"
#include "cpu/rows.h"
#include "cpu/validate.h"
#include "dsv4/ops.h"
#if defined(DSV4_WITH_CUDA)
#include "cuda/oproj/inv_rope_fp8_quant.h"
#endif

namespace dsv4 {

void inv_rope_fp8_quant(const TensorView& o, const TensorView& positions, const TensorView& cos_sin,
                        int block, const TensorView& o_fp8, const TensorView& o_scale,
                        [[maybe_unused]] Stream stream) {
  constexpr const char* kOp = "inv_rope_fp8_quant";
  check_defined(kOp, "o", o);
  check_dtype(kOp, "o", o, DType::bf16);
  check_ndim(kOp, "o", o, 3);
  cpu::check_row_strided(kOp, "o", o);
  const int64_t T = o.shape[0], H = o.shape[1], D = o.shape[2];
  if ((block == 64 || block == 128) && D % block != 0)
    fail_expected(kOp, "o.shape[2] (head dim D)",
                  "a multiple of block = " + std::to_string(block) + " (a block never spans two heads)", D);
  cpu::check_act_quant_outputs(kOp, "o_fp8", o_fp8, "o_scale", o_scale, T, H * D, block);
  cpu::check_disjoint(kOp, "o_fp8", o_fp8, "o", o);
  cpu::check_disjoint(kOp, "o_scale", o_scale, "o", o);
  cpu::check_index_vector(kOp, "positions", positions, T);
  const int64_t R = cpu::check_rope_table(kOp, cos_sin, D);
  if (cpu::common_device(kOp, {{"o", o}, {"positions", positions}, {"cos_sin", cos_sin},
                               {"o_fp8", o_fp8}, {"o_scale", o_scale}}) == Device::cuda) {
    // Position values live on the device: the kernel leaves a token with an invalid one unwritten.
    DSV4_CUDA_DISPATCH(kOp, cuda::inv_rope_fp8_quant(o, positions, cos_sin, block, o_fp8, o_scale, stream));
  }
  cpu::check_positions_in_table(kOp, positions, cos_sin);

  const int64_t blocks_per_head = D / block;
#pragma omp parallel if (T > 1)
  {
    std::vector<float> row(static_cast<size_t>(D));
#pragma omp for schedule(static)
    for (int64_t t = 0; t < T; ++t) {
      const float* table_row = cpu::rope_table_row(cos_sin, cpu::load_index(positions, t));
      uint8_t* q = static_cast<uint8_t*>(o_fp8.data) + t * o_fp8.strides[0];
      for (int64_t h = 0; h < H; ++h) {
        const char* src = static_cast<const char*>(o.data) + (t * o.strides[0] + h * o.strides[1]) * 2;
        cpu::load_row(src, DType::bf16, D, row.data());
        math::rope_rotate_pairs(row.data() + (D - R), table_row, R / 2, /*inverse=*/true);
        for (int64_t i = D - R; i < D; ++i) row[i] = round_bf16(row[i]);
        for (int64_t b = 0; b < blocks_per_head; ++b)
          cpu::quantize_act_block(row.data() + b * block, block, q + h * D + b * block, o_scale, t,
                                  h * blocks_per_head + b);
      }
    }
  }
}

}  // namespace dsv4

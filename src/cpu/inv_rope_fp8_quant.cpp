// The CPU kernel of inv_rope_fp8_quant: per token and head, inverse RoPE on the rope dims,
// rounded to bf16, then FP8 per 1 × block of the flattened row (cpu/act_quant.h's rule).
#include <vector>

#include "cpu/act_quant.h"
#include "cpu/kernels.h"
#include "cpu/rope_common.h"
#include "cpu/rows.h"

namespace dsv4::cpu {

void inv_rope_fp8_quant(const TensorView& o, const TensorView& positions, const TensorView& cos_sin,
                        int block, const TensorView& o_fp8, const TensorView& o_scale,
                        Stream /*stream*/) {
  const int64_t T = o.shape[0], H = o.shape[1], D = o.shape[2], R = cos_sin.shape[1];
  check_positions_in_table("inv_rope_fp8_quant", positions, cos_sin);

  const int64_t blocks_per_head = D / block;
#pragma omp parallel if (T > 1)
  {
    std::vector<float> row(static_cast<size_t>(D));
#pragma omp for schedule(static)
    for (int64_t t = 0; t < T; ++t) {
      const float* table_row = rope_table_row(cos_sin, load_index(positions, t));
      uint8_t* q = static_cast<uint8_t*>(o_fp8.data) + t * o_fp8.strides[0];
      for (int64_t h = 0; h < H; ++h) {
        const char* src = static_cast<const char*>(o.data) + (t * o.strides[0] + h * o.strides[1]) * 2;
        load_row(src, DType::bf16, D, row.data());
        math::rope_rotate_pairs(row.data() + (D - R), table_row, R / 2, /*inverse=*/true);
        for (int64_t i = D - R; i < D; ++i) row[i] = round_bf16(row[i]);
        for (int64_t b = 0; b < blocks_per_head; ++b)
          quantize_act_block(row.data() + b * block, block, q + h * D + b * block, o_scale, t,
                                  h * blocks_per_head + b);
      }
    }
  }
}

}  // namespace dsv4::cpu

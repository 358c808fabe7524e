// The CPU kernel of quantize_act_fp8: per row and block, the UE8M0 scale and FP8 codes of
// cpu/act_quant.h (the rule the CUDA kernel follows bit for bit).
#include <vector>

#include "cpu/act_quant.h"
#include "cpu/kernels.h"
#include "cpu/rows.h"

namespace dsv4::cpu {

void quantize_act_fp8(const TensorView& x, int block, const TensorView& xq, const TensorView& scale,
                      Stream /*stream*/) {
  const int64_t T = x.shape[0], K = x.shape[1], num_blocks = K / block;
  const size_t x_elem = dtype_size(x.dtype);
#pragma omp parallel
  {
    std::vector<float> row(static_cast<size_t>(K));
#pragma omp for schedule(static)
    for (int64_t t = 0; t < T; ++t) {
      load_row(static_cast<const char*>(x.data) + t * x.strides[0] * x_elem, x.dtype, K,
                    row.data());
      uint8_t* q = static_cast<uint8_t*>(xq.data) + t * xq.strides[0];
      for (int64_t b = 0; b < num_blocks; ++b)
        quantize_act_block(row.data() + b * block, block, q + b * block, scale, t, b);
    }
  }
}

}  // namespace dsv4::cpu

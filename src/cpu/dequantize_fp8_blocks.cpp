// The CPU kernel of dequantize_fp8_blocks: each row of each batch is decoded with the GEMM's
// scaled-row loader (one fp32 product per element, the scale looked up per block) and rounded
// once to y's dtype — the same two roundings the CUDA kernel does.
#include <vector>

#include "cpu/gemm.h"
#include "cpu/kernels.h"
#include "cpu/rows.h"

namespace dsv4::cpu {

namespace {

// A 3-d view of a 2-d or 3-d one (a batch of one).
TensorView as_batched(const TensorView& t) {
  if (t.ndim == 3) return t;
  TensorView v = t;
  v.ndim = 3;
  v.shape = {1, t.shape[0], t.shape[1]};
  v.strides = {0, t.strides[0], t.strides[1]};
  return v;
}

}  // namespace

void dequantize_fp8_blocks(const TensorView& x, const TensorView& scale, int block_rows,
                           int block_cols, const TensorView& y, Stream /*stream*/) {
  const TensorView xb = as_batched(x), sb = as_batched(scale), yb = as_batched(y);
  const int64_t G = xb.shape[0], R = xb.shape[1], C = xb.shape[2];
  const int64_t y_elem = static_cast<int64_t>(dtype_size(y.dtype));
#pragma omp parallel if (G * R * C > (int64_t{1} << 16))
  {
    std::vector<float> row(static_cast<size_t>(C));
#pragma omp for schedule(static)
    for (int64_t gr = 0; gr < G * R; ++gr) {
      const int64_t g = gr / R, r = gr % R;
      const ScaledMatrix m =
          ScaledMatrix::from_views(select0(xb, g), select0(sb, g), block_rows, block_cols);
      m.load_row_segment(r, 0, C, row.data());
      store_row(row.data(), y.dtype, C,
                     static_cast<char*>(y.data) + (g * yb.strides[0] + r * yb.strides[1]) * y_elem);
    }
  }
}

}  // namespace dsv4::cpu

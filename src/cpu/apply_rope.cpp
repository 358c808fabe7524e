// The CPU kernel of apply_rope: GPT-J pairs of the last R dims rotated with math/rope.h (the
// CUDA kernel's rotation too).
#include <algorithm>
#include <vector>

#include "cpu/kernels.h"
#include "cpu/rope_common.h"
#include "cpu/rows.h"

namespace dsv4::cpu {

void apply_rope(const TensorView& x, const TensorView& positions, const TensorView& cos_sin,
                bool inverse, const TensorView& y, Stream /*stream*/) {
  const int64_t T = x.shape[0], D = x.shape[x.ndim - 1], R = cos_sin.shape[1];
  check_positions_in_table("apply_rope", positions, cos_sin);

  const RowWalker x_rows(x), y_rows(y);
  const int64_t rows = x_rows.num_rows(), heads = rows / std::max<int64_t>(T, 1);
#pragma omp parallel if (rows > 1)
  {
    std::vector<float> row(static_cast<size_t>(D));
#pragma omp for schedule(static)
    for (int64_t r = 0; r < rows; ++r) {
      const int64_t p = load_index(positions, r / heads);
      load_row(x_rows.row_ptr(r), x.dtype, D, row.data());
      math::rope_rotate_pairs(row.data() + (D - R), rope_table_row(cos_sin, p), R / 2, inverse);
      store_row(row.data(), y.dtype, D, y_rows.row_ptr(r));
    }
  }
}

}  // namespace dsv4::cpu

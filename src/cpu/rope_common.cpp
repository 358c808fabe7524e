#include "cpu/rope_common.h"

#include <string>

#include "cpu/rows.h"
#include "cpu/validate.h"

namespace dsv4::cpu {

int64_t check_rope_table(const char* where, const TensorView& cos_sin, int64_t head_dim) {
  check_defined(where, "cos_sin", cos_sin);
  check_dtype(where, "cos_sin", cos_sin, DType::fp32);
  check_ndim(where, "cos_sin", cos_sin, 2);
  check_row_strided(where, "cos_sin", cos_sin);
  const int64_t R = cos_sin.shape[1];
  if (R < 2 || R % 2 != 0 || R > head_dim)
    fail_expected(where, "cos_sin.shape[1] (rope dims R)",
                  "an even value in [2, head dim = " + std::to_string(head_dim) + "]", R);
  return R;
}

void check_positions_in_table(const char* where, const TensorView& positions,
                              const TensorView& cos_sin) {
  const int64_t n = positions.shape[0], max_pos = cos_sin.shape[0];
  for (int64_t t = 0; t < n; ++t) {
    const int64_t p = load_index(positions, t);
    if (p < 0 || p >= max_pos)
      fail_expected(where, "positions[" + std::to_string(t) + "]",
                    "a position in [0, " + std::to_string(max_pos) + ") (rows of cos_sin)", p);
  }
}

}  // namespace dsv4::cpu

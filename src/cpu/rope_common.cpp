#include "cpu/rope_common.h"

#include <string>

#include "cpu/rows.h"

namespace dsv4::cpu {

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

// The CPU kernel of synthetic_hidden: the formula of math/synthetic_hidden.h per element.
#include <vector>

#include "cpu/kernels.h"
#include "cpu/rows.h"
#include "math/synthetic_hidden.h"

namespace dsv4::cpu {

void synthetic_hidden(const TensorView& req_ids, const TensorView& positions, uint64_t seed,
                      const TensorView& out, Stream /*stream*/) {
  const int64_t T = out.shape[0], dim = out.shape[1];
  const int64_t* req = req_ids.ptr<int64_t>();
  const int64_t* pos = positions.ptr<int64_t>();
  const RowWalker rows(out);
#pragma omp parallel for schedule(static) if (T > 1)
  for (int64_t t = 0; t < T; ++t) {
    std::vector<float> row(static_cast<size_t>(dim));
    for (int64_t i = 0; i < dim; ++i) row[i] = synthetic_math::value(seed, req[t], pos[t], i);
    store_row(row.data(), out.dtype, dim, rows.row_ptr(t));
  }
}

}  // namespace dsv4::cpu

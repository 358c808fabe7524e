#include "dsv4/synthetic.h"

#include <vector>

#include "cpu/backend.h"
#include "cpu/rows.h"
#include "math/synthetic_hidden.h"
#include "cpu/validate.h"
#if defined(DSV4_WITH_CUDA)
#include "cuda/common/synthetic_hidden.h"
#endif

namespace dsv4 {

float synthetic_hidden_value(uint64_t seed, int64_t req, int64_t pos, int64_t i) {
  return synthetic_math::value(seed, req, pos, i);
}

void synthetic_hidden(const TensorView& req_ids, const TensorView& positions, uint64_t seed,
                      const TensorView& out, [[maybe_unused]] Stream stream) {
  constexpr const char* kOp = "synthetic_hidden";
  check_defined(kOp, "req_ids", req_ids);
  check_defined(kOp, "positions", positions);
  check_defined(kOp, "out", out);
  check_dtype(kOp, "req_ids", req_ids, DType::int64);
  check_dtype(kOp, "positions", positions, DType::int64);
  check_ndim(kOp, "req_ids", req_ids, 1);
  check_contiguous(kOp, "req_ids", req_ids);
  check_shape(kOp, "positions", positions, {req_ids.shape[0]});
  check_contiguous(kOp, "positions", positions);
  cpu::check_dtype_in(kOp, "out", out, {DType::fp32, DType::bf16});
  check_ndim(kOp, "out", out, 2);
  check_dim(kOp, "out", out, 0, req_ids.shape[0]);
  cpu::check_output_layout(kOp, "out", out);
  cpu::check_disjoint(kOp, "out", out, "req_ids", req_ids);
  cpu::check_disjoint(kOp, "out", out, "positions", positions);
  if (cpu::common_device(kOp, {{"req_ids", req_ids}, {"positions", positions}, {"out", out}}) ==
      Device::cuda) {
    DSV4_CUDA_DISPATCH(kOp, cuda::synthetic_hidden(req_ids, positions, seed, out, stream));
  }
  const int64_t T = out.shape[0], dim = out.shape[1];
  const int64_t* req = req_ids.ptr<int64_t>();
  const int64_t* pos = positions.ptr<int64_t>();
  const cpu::RowWalker rows(out);
#pragma omp parallel for schedule(static) if (T > 1)
  for (int64_t t = 0; t < T; ++t) {
    std::vector<float> row(static_cast<size_t>(dim));
    for (int64_t i = 0; i < dim; ++i) row[i] = synthetic_math::value(seed, req[t], pos[t], i);
    cpu::store_row(row.data(), out.dtype, dim, rows.row_ptr(t));
  }
}

}  // namespace dsv4

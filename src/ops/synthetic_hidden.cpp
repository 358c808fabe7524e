// synthetic_hidden's front door: validation, then the backend.
#include "dsv4/synthetic.h"

#include "math/synthetic_hidden.h"
#include "ops/backend.h"
#include "ops/validate.h"

namespace dsv4 {

float synthetic_hidden_value(uint64_t seed, int64_t req, int64_t pos, int64_t i) {
  return synthetic_math::value(seed, req, pos, i);
}

void synthetic_hidden(const TensorView& req_ids, const TensorView& positions, uint64_t seed,
                      const TensorView& out, Stream stream) {
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
  ops::check_dtype_in(kOp, "out", out, {DType::fp32, DType::bf16});
  check_ndim(kOp, "out", out, 2);
  check_dim(kOp, "out", out, 0, req_ids.shape[0]);
  ops::check_output_layout(kOp, "out", out);
  ops::check_disjoint(kOp, "out", out, "req_ids", req_ids);
  ops::check_disjoint(kOp, "out", out, "positions", positions);
  const Device device =
      ops::common_device(kOp, {{"req_ids", req_ids}, {"positions", positions}, {"out", out}});
  ops::kernel(kOp, ops::kSyntheticHidden, device)(req_ids, positions, seed, out, stream);
}

}  // namespace dsv4

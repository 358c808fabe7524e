// Binding helpers shared by the layer bindings (bind_layer.cpp: V4's Attention and AttentionStack;
// bind_sparse_mla.cpp: V3.2's SparseMlaAttention): a torch state dict as a TensorSource, seeds,
// a step's request lists, and the forward of any layer with forward(plan, x, y) and config().
#pragma once

#include <nanobind/nanobind.h>

#include <cstdint>
#include <cstring>
#include <map>
#include <string>
#include <vector>

#include "dsv4/batch.h"
#include "dsv4/weights.h"
#include "tensor_args.h"

namespace dsv4::python {

using StateDict = std::map<std::string, AnyArray>;

// A torch state dict as the weight loader's TensorSource. Tensors are looked at lazily, so the
// dict may hold a whole model (other layers, experts in dtypes the layer never takes).
class StateDictSource final : public TensorSource {
 public:
  explicit StateDictSource(const StateDict& tensors) : tensors_(tensors) {}
  bool contains(const std::string& name) const override { return tensors_.count(name) != 0; }
  Info info(const std::string& name) const override {
    const TensorView v = view_of(tensors_.at(name), name.c_str());
    return {v.dtype, std::vector<int64_t>(v.shape.begin(), v.shape.begin() + v.ndim)};
  }
  HostTensor read(const std::string& name) const override {
    return host_copy(tensors_.at(name), name.c_str());
  }
  std::string description() const override { return "the state dict"; }

 private:
  const StateDict& tensors_;
};

// A seed: any integer in [0, 2**64) (negative or larger seeds are an error, not wrapped).
inline uint64_t seed_arg(const char* where, const IntArg& seed) {
  if (seed.type_name == nullptr && seed.overflow > 0)
    fail_expected(where, "seed", "an integer in [0, 2**63 - 1]", "an int above 2**63 - 1");
  return static_cast<uint64_t>(int64_arg(where, "seed", seed, 0, INT64_MAX));
}

// One step's requests (ids, contexts, num_new: one of each per request) as RequestSteps.
inline std::vector<RequestStep> request_steps(const char* where,
                                              const std::vector<IntArg>& req_ids,
                                              const std::vector<IntArg>& contexts,
                                              const std::vector<IntArg>& num_new) {
  DSV4_CHECK_EQ(where, "len(contexts) (one per request id)", req_ids.size(), contexts.size());
  DSV4_CHECK_EQ(where, "len(num_new) (one per request id)", req_ids.size(), num_new.size());
  std::vector<RequestStep> steps;
  for (size_t i = 0; i < req_ids.size(); ++i) {
    const auto item = [&](const char* list, const IntArg& v) {
      return int64_arg(where, detail::concat(list, "[", i, "]").c_str(), v);
    };
    steps.push_back({item("req_ids", req_ids[i]), item("contexts", contexts[i]),
                     item("num_new", num_new[i])});
  }
  return steps;
}

// Copies `rows` rows starting at row `from` of src to row `to` of dst (contiguous [T, dim]).
inline void copy_rows(const TensorView& src, int64_t from, const TensorView& dst, int64_t to,
                      int64_t rows) {
  const size_t row_bytes = static_cast<size_t>(src.shape[1]) * dtype_size(src.dtype);
  std::memcpy(static_cast<uint8_t*>(dst.data) + to * row_bytes,
              static_cast<const uint8_t*>(src.data) + from * row_bytes, rows * row_bytes);
}

// One forward step. Requests may come in any order; x's and y's rows follow that order (request
// i's tokens are rows [sum(num_new[:i]), sum(num_new[:i+1]))). The layer wants decodes first
// (BatchPlan::make): when the given order differs, x is gathered into plan order and the result
// scattered back, after the layer has accepted the batch (so a rejected batch leaves y alone).
// Layer: any class with forward(plan, x, y) and config(); Where: the name errors give the call.
template <class Layer, const char* Where>
void forward_op(Layer& layer, const std::vector<IntArg>& req_ids,
                const std::vector<IntArg>& contexts, const std::vector<IntArg>& num_new,
                const TensorArg& x_arg, const TensorArg& y_arg) {
  const char* where = Where;
  const std::vector<RequestStep> steps = request_steps(where, req_ids, contexts, num_new);
  const TensorView x = tensor_arg(where, "x", x_arg), y = tensor_arg(where, "y", y_arg);
  // x and y must match the batch before a plan of the batch's size is built (a batch claiming
  // 2**26 tokens against one row of x is an error, not gigabytes of metadata first).
  const int64_t T = BatchPlan::count_tokens(steps), dim = layer.config().dim;
  check_shape(where, "x", x, {T, dim});
  check_shape(where, "y", y, {T, dim});
  const BatchPlan plan = BatchPlan::make(steps);

  bool same_order = true;
  for (size_t i = 0; i < steps.size(); ++i) same_order &= plan.requests[i].req_id == steps[i].req_id;
  if (same_order) {
    layer.forward(plan, x, y);
    return;
  }
  // Both tensors are read row by row below: check what the copies rely on first.
  for (const auto& [name, t] : {std::pair{"x", x}, std::pair{"y", y}}) {
    check_device(where, name, t, Device::cpu);
    check_contiguous(where, name, t);
  }
  check_dtype(where, "y", y, DType::fp32);
  std::map<int64_t, int64_t> given_start;  // request id -> its first row in x / y
  int64_t row = 0;
  for (const RequestStep& s : steps) {
    given_start[s.req_id] = row;
    row += s.num_new;
  }
  HostTensor x_plan(x.dtype, {T, dim}), y_plan(DType::fp32, {T, dim});
  for (int r = 0; r < plan.num_requests(); ++r)
    copy_rows(x, given_start[plan.requests[r].req_id], x_plan, plan.query_start_loc[r],
              plan.requests[r].num_new);
  layer.forward(plan, x_plan, y_plan);
  for (int r = 0; r < plan.num_requests(); ++r)
    copy_rows(y_plan, plan.query_start_loc[r], y, given_start[plan.requests[r].req_id],
              plan.requests[r].num_new);
}

}  // namespace dsv4::python

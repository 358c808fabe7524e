// One layer step with x and y on the GPU (the serving path), as the graph tests of both layer
// families drive it: x from the plan's deterministic hidden rows (bf16-representable), y poisoned
// so that an unwritten row shows, the outputs recorded per (request, position).
#pragma once

#include <cstdint>
#include <vector>

#include "dsv4/batch.h"
#include "dsv4/device_tensor.h"
#include "layer_test_support.h"

namespace dsv4_test {

// Layer: dsv4::Attention or dsv4::SparseMlaAttention (forward(plan, x, y), config()).
template <class Layer>
void device_step(Layer& a, const std::vector<dsv4::RequestStep>& steps, uint64_t seed, LayerOutputs& out) {
  const dsv4::BatchPlan plan = dsv4::BatchPlan::make(steps);
  const int dim = a.config().dim;
  const StepIo io = step_io(plan, dim, seed, /*bf16_representable=*/true);
  const dsv4::DeviceTensor x = dsv4::DeviceTensor::from_host(dsv4::HostTensor::copy_of(io.x, dsv4::DType::bf16));
  dsv4::DeviceTensor y(dsv4::DType::fp32, {plan.num_tokens(), dim});
  y.fill_bytes(0xFF);
  a.forward(plan, x, y);
  record_outputs(plan, y.to_host(), dim, out);
}

// The same with x and y in the caller's persistent buffers (rows [0, T) of x_buf / y_buf, the
// same addresses every step), as a serving engine's fixed hidden-state buffers: a decode graph
// whose bucket the step fills then runs on them directly.
template <class Layer>
void device_step_in(Layer& a, const std::vector<dsv4::RequestStep>& steps, uint64_t seed, LayerOutputs& out,
                    dsv4::DeviceTensor& x_buf, dsv4::DeviceTensor& y_buf) {
  const dsv4::BatchPlan plan = dsv4::BatchPlan::make(steps);
  const int dim = a.config().dim;
  const int64_t T = plan.num_tokens();
  const StepIo io = step_io(plan, dim, seed, /*bf16_representable=*/true);
  const dsv4::TensorView x = x_buf.view().slice0(0, T), y = y_buf.view().slice0(0, T);
  dsv4::copy_to_device(dsv4::HostTensor::copy_of(io.x, dsv4::DType::bf16), x);
  y_buf.fill_bytes(0xFF);
  a.forward(plan, x, y);
  dsv4::HostTensor y_host(dsv4::DType::fp32, {T, dim});
  dsv4::copy_to_host(y, y_host);
  record_outputs(plan, y_host, dim, out);
}

}  // namespace dsv4_test

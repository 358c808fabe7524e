// The serving simulation's per-step tensors on the stack's device: x is generated where the stack
// runs (dsv4::synthetic_hidden, from each token's request id and position, uploaded from pinned
// memory), y stays there, and both buffers only grow. On the GPU a step then neither copies
// hidden states over PCIe nor synchronizes; host copies are made only when asked for (the check,
// an output hook).
#pragma once

#include <cstdint>

#include "dsv4/batch.h"
#include "dsv4/device_tensor.h"
#include "dsv4/tensor.h"
#include "runtime/device_runtime.h"

namespace dsv4::cli {

class StepTensors {
 public:
  StepTensors(Device device, Stream stream, uint64_t seed, int dim)
      : device_(device), stream_(stream), seed_(seed), dim_(dim) {}

  // x [T, dim] fp32 for the plan's tokens, and y [T, dim] fp32, on the device (valid until the
  // next call).
  void prepare(const BatchPlan& plan);
  TensorView x() const { return x_; }
  TensorView y() const { return y_; }
  // y on the host (waits for the step).
  HostTensor y_on_host() const;

 private:
  Device device_;
  Stream stream_;
  uint64_t seed_;
  int dim_;
  int64_t rows_ = 0;  // capacity
  HostTensor host_x_, host_y_, host_meta_;  // CPU backend
  DeviceTensor dev_meta_, dev_x_, dev_y_;   // CUDA backend: [2, rows] int64 ids / positions
  // Two staging buffers in turn: the host fills one while the copy of the other may still be
  // queued, so it runs up to two steps ahead of the GPU.
  rt::PinnedBuffer pinned_meta_[2];
  rt::Event meta_copied_[2];
  int turn_ = 0;
  TensorView x_, y_;
};

}  // namespace dsv4::cli

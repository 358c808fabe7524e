// DeviceTensor: an owning, contiguous buffer in CUDA device memory — what a caller of the ops
// (the CUDA layer, the CLI, tests) allocates for inputs, outputs and workspace. The ops themselves
// never allocate; they take views (TensorView, Device::cuda) of buffers like this one.
//
// Copies between host and device here are synchronous (they return when the bytes have arrived)
// and are meant for set-up, per-step metadata and results, never inside a kernel sequence that
// should be graph-capturable.
//
// Without a CUDA build, or without a CUDA device, constructing a non-empty DeviceTensor throws
// dsv4::Error (cuda_available() tells beforehand).
#pragma once

#include <cstdint>
#include <memory>
#include <vector>

#include "dsv4/tensor.h"

namespace dsv4 {

// The library was built with CUDA (DSV4_CUDA on a machine with nvcc).
bool cuda_built();
// The library was built with CUDA and at least one CUDA device is visible.
bool cuda_available();

class DeviceTensor : public OwnedTensor {
 public:
  DeviceTensor() = default;
  // Uninitialized device memory for a contiguous [dims] tensor of `t` (256-byte aligned).
  DeviceTensor(DType t, std::vector<int64_t> dims);
  // A device copy of a host view (any strides: the copy is contiguous).
  static DeviceTensor from_host(const TensorView& host);

  // A host copy (contiguous).
  HostTensor to_host() const;
  // Every byte set to `byte` (tests poison outputs so unwritten elements show).
  void fill_bytes(uint8_t byte);

 private:
  std::shared_ptr<void> buf_;
};

// Synchronous copies between a contiguous host view and a contiguous device view of the same
// dtype and element count. Throw dsv4::Error on mismatch or a CUDA error.
void copy_to_device(const TensorView& host, const TensorView& device);
void copy_to_host(const TensorView& device, const TensorView& host);

}  // namespace dsv4

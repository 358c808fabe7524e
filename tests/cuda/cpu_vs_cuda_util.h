// Helpers for the CPU-reference-vs-CUDA tests of the dense and KV ops: a host tensor with its
// device twin (same bytes), strided views of both, and a byte-exact comparison that reports the
// first differing elements.
#pragma once

#include <gtest/gtest.h>

#include <cstdint>
#include <cstring>
#include <vector>

#include "dsv4/device_tensor.h"
#include "dsv4/tensor.h"

namespace dsv4::test {

// A host tensor and a device copy of it: run the CPU op on `host`, the CUDA op on `dev`.
struct Twin {
  HostTensor host;
  DeviceTensor dev;

  static Twin of(const HostTensor& h) { return Twin{h, DeviceTensor::from_host(h)}; }
  // Both sides every byte `byte` (outputs are poisoned so unwritten elements show).
  static Twin poisoned(DType t, std::vector<int64_t> dims, uint8_t byte = 0xFF) {
    HostTensor h(t, std::move(dims));
    h.fill_bytes(byte);
    return of(h);
  }
  // The device bytes, back on the host.
  HostTensor dev_bytes() const { return dev.to_host(); }
};

// The same sub-view of the host and the device buffer: `host_view` (a view into twin.host, e.g.
// a column range) moved onto twin.dev at the same element offset and strides.
inline TensorView same_view_on_device(const Twin& twin, const TensorView& host_view) {
  TensorView v = host_view;
  const auto offset = static_cast<const uint8_t*>(host_view.data) - twin.host.data<uint8_t>();
  v.data = twin.dev.data<uint8_t>() + offset;
  v.device = Device::cuda;
  return v;
}

// Every byte of `cpu` equals `gpu` (same dtype and size); on a difference, reports the first few
// differing elements as float values.
inline void expect_bytes_equal(const char* what, const HostTensor& cpu, const HostTensor& gpu) {
  ASSERT_EQ(cpu.nbytes(), gpu.nbytes()) << what;
  if (std::memcmp(cpu.data<uint8_t>(), gpu.data<uint8_t>(), cpu.nbytes()) == 0) return;
  const size_t esize = dtype_size(cpu.dtype());
  int reported = 0;
  int64_t differing = 0;
  for (int64_t i = 0; i < cpu.numel(); ++i) {
    if (std::memcmp(cpu.data<uint8_t>() + i * esize, gpu.data<uint8_t>() + i * esize, esize) == 0)
      continue;
    ++differing;
    if (reported++ < 8)
      ADD_FAILURE() << what << "[" << i << "]: cpu " << cpu.get(i) << ", gpu " << gpu.get(i);
  }
  ADD_FAILURE() << what << ": " << differing << " of " << cpu.numel() << " elements differ";
}

}  // namespace dsv4::test

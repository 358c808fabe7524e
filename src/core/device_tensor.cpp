#include "dsv4/device_tensor.h"

#include "runtime/device_runtime.h"

namespace dsv4 {

namespace {

void check_copy_pair(const char* where, const TensorView& host, const TensorView& device) {
  check_device(where, "host", host, Device::cpu);
  check_device(where, "device", device, Device::cuda);
  check_contiguous(where, "host", host);
  check_contiguous(where, "device", device);
  DSV4_CHECK_EQ(where, "dtype", dtype_name(host.dtype), dtype_name(device.dtype));
  DSV4_CHECK_EQ(where, "numel", host.numel(), device.numel());
}

size_t nbytes_of(const TensorView& t) { return static_cast<size_t>(t.numel()) * dtype_size(t.dtype); }

}  // namespace

bool cuda_built() { return rt::built(); }

bool cuda_available() { return rt::device_available(); }

DeviceTensor::DeviceTensor(DType t, std::vector<int64_t> dims) : OwnedTensor(std::move(dims)) {
  int64_t n = 1;
  for (int64_t d : dims_) {
    DSV4_CHECK(d >= 0, "DeviceTensor: negative dimension ", d);
    n *= d;
  }
  void* ptr = rt::device_malloc(static_cast<size_t>(n) * dtype_size(t), "DeviceTensor");
  buf_ = std::shared_ptr<void>(ptr, [](void* p) { rt::device_free(p); });
  view_ = TensorView(ptr, t, dims_, Device::cuda);
}

DeviceTensor DeviceTensor::from_host(const TensorView& host) {
  check_device("DeviceTensor::from_host", "host", host, Device::cpu);
  std::vector<int64_t> dims(host.shape.begin(), host.shape.begin() + host.ndim);
  DeviceTensor d(host.dtype, dims);
  if (host.is_contiguous())
    copy_to_device(host, d);
  else
    copy_to_device(HostTensor::copy_of(host), d);
  return d;
}

HostTensor DeviceTensor::to_host() const {
  HostTensor h(view_.dtype, dims_);
  copy_to_host(view_, h);
  return h;
}

void DeviceTensor::fill_bytes(uint8_t byte) {
  rt::memset_device(view_.data, byte, nbytes(), "DeviceTensor::fill_bytes");
}

void copy_to_device(const TensorView& host, const TensorView& device) {
  check_copy_pair("copy_to_device", host, device);
  rt::copy_host_to_device(device.data, host.data, nbytes_of(host), "copy_to_device");
}

void copy_to_host(const TensorView& device, const TensorView& host) {
  check_copy_pair("copy_to_host", host, device);
  rt::copy_device_to_host(host.data, device.data, nbytes_of(host), "copy_to_host");
}

}  // namespace dsv4

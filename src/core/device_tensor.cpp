#include "dsv4/device_tensor.h"

#include "cpu/backend.h"

#if defined(DSV4_WITH_CUDA)
#include "cuda/common/check.h"
#endif

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

#if defined(DSV4_WITH_CUDA)
using cuda::check_cuda;
#else
[[noreturn]] void no_cuda(const char* where) { cpu::throw_cuda_unavailable(where); }
#endif

}  // namespace

bool cuda_built() {
#if defined(DSV4_WITH_CUDA)
  return true;
#else
  return false;
#endif
}

bool cuda_available() {
#if defined(DSV4_WITH_CUDA)
  int n = 0;
  return cudaGetDeviceCount(&n) == cudaSuccess && n > 0;
#else
  return false;
#endif
}

DeviceTensor::DeviceTensor(DType t, std::vector<int64_t> dims) : OwnedTensor(std::move(dims)) {
  int64_t n = 1;
  for (int64_t d : dims_) {
    DSV4_CHECK(d >= 0, "DeviceTensor: negative dimension ", d);
    n *= d;
  }
  const size_t bytes = static_cast<size_t>(n) * dtype_size(t);
  void* ptr = nullptr;
#if defined(DSV4_WITH_CUDA)
  // Zero-size tensors still get a (small) allocation so their view is "defined".
  check_cuda(cudaMalloc(&ptr, bytes > 0 ? bytes : 256), "DeviceTensor", "cudaMalloc");
  buf_ = std::shared_ptr<void>(ptr, [](void* p) { cudaFree(p); });
#else
  (void)bytes;
  no_cuda("DeviceTensor");
#endif
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
#if defined(DSV4_WITH_CUDA)
  if (nbytes() > 0) check_cuda(cudaMemset(view_.data, byte, nbytes()), "DeviceTensor::fill_bytes", "cudaMemset");
#else
  (void)byte;
  no_cuda("DeviceTensor::fill_bytes");
#endif
}

void copy_to_device(const TensorView& host, const TensorView& device) {
  check_copy_pair("copy_to_device", host, device);
  const size_t bytes = static_cast<size_t>(host.numel()) * dtype_size(host.dtype);
  if (bytes == 0) return;
#if defined(DSV4_WITH_CUDA)
  check_cuda(cudaMemcpy(device.data, host.data, bytes, cudaMemcpyHostToDevice), "copy_to_device",
        "cudaMemcpy");
#else
  no_cuda("copy_to_device");
#endif
}

void copy_to_host(const TensorView& device, const TensorView& host) {
  check_copy_pair("copy_to_host", host, device);
  const size_t bytes = static_cast<size_t>(host.numel()) * dtype_size(host.dtype);
  if (bytes == 0) return;
#if defined(DSV4_WITH_CUDA)
  check_cuda(cudaMemcpy(host.data, device.data, bytes, cudaMemcpyDeviceToHost), "copy_to_host",
        "cudaMemcpy");
#else
  no_cuda("copy_to_host");
#endif
}

}  // namespace dsv4

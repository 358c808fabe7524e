#include "layer/scratch.h"

#if defined(DSV4_WITH_CUDA)
#include "cuda/common/check.h"
#endif

namespace dsv4 {

namespace {
constexpr int64_t kAlign = 256;
int64_t aligned(int64_t bytes) { return (bytes + kAlign - 1) / kAlign * kAlign; }
}  // namespace

TensorView Scratch::tensor(DType t, std::vector<int64_t> dims) {
  if (device_ == Device::cpu) {
    host_.emplace_back(t, std::move(dims));
    return host_.back().view();
  }
  int64_t n = 1;
  for (int64_t d : dims) n *= d;
  const int64_t bytes = aligned(std::max<int64_t>(n * static_cast<int64_t>(dtype_size(t)), 1));
  if (arena_.numel() > 0 && used_ + bytes <= arena_.numel()) {
    TensorView v(arena_.data<uint8_t>() + used_, t, dims, Device::cuda);
    used_ += bytes;
    return v;
  }
  overflow_.emplace_back(t, dims);
  overflow_bytes_ += bytes;
  return overflow_.back().view();
}

TensorView Scratch::upload(const HostTensor& host) {
  if (device_ == Device::cpu) {
    host_.push_back(host);
    return host.view();
  }
  TensorView d = tensor(host.dtype(), host.shape());
  if (host.nbytes() == 0) return d;
#if defined(DSV4_WITH_CUDA)
  DSV4_CUDA_CHECK("Scratch::upload", cudaMemcpyAsync(d.data, host.view().data, host.nbytes(),
                                                     cudaMemcpyHostToDevice, stream_));
#endif
  return d;
}

void Scratch::download(const TensorView& device, const TensorView& host) {
  check_device("Scratch::download", "device", device, Device::cuda);
  check_device("Scratch::download", "host", host, Device::cpu);
  check_contiguous("Scratch::download", "device", device);
  check_contiguous("Scratch::download", "host", host);
  DSV4_CHECK(device.dtype == host.dtype && device.numel() == host.numel(),
             "Scratch::download: ", device.shape_str(), " ", dtype_name(device.dtype), " -> ",
             host.shape_str(), " ", dtype_name(host.dtype));
#if defined(DSV4_WITH_CUDA)
  const size_t bytes = static_cast<size_t>(host.numel()) * dtype_size(host.dtype);
  if (bytes > 0)
    DSV4_CUDA_CHECK("Scratch::download", cudaMemcpyAsync(host.data, device.data, bytes,
                                                         cudaMemcpyDeviceToHost, stream_));
  DSV4_CUDA_CHECK("Scratch::download", cudaStreamSynchronize(stream_));
#endif
}

void Scratch::set_stream(Stream stream) {
  if (stream == stream_) return;
#if defined(DSV4_WITH_CUDA)
  if (device_ == Device::cuda) DSV4_CUDA_CHECK("Scratch::set_stream", cudaStreamSynchronize(stream_));
#endif
  stream_ = stream;
}

void Scratch::reset() {
  host_.clear();
  if (!overflow_.empty()) {
    // Grow: one arena for everything the last forward needed (the old buffers are freed here,
    // after the forward that used them was enqueued; cudaFree waits for the device).
    const int64_t total = used_ + overflow_bytes_;
    overflow_.clear();
    arena_ = DeviceTensor();
    arena_ = DeviceTensor(DType::uint8, {total});
    overflow_bytes_ = 0;
  }
  used_ = 0;
}

}  // namespace dsv4

#include "layer/scratch.h"

#include <algorithm>

#include "dsv4/status.h"
#include "runtime/device_runtime.h"

namespace dsv4 {

namespace {
constexpr int64_t kAlign = 256;
int64_t aligned(int64_t bytes) { return (bytes + kAlign - 1) / kAlign * kAlign; }
}  // namespace

TensorView Scratch::tensor(DType t, std::vector<int64_t> dims) {
  int64_t n = 1;
  for (int64_t d : dims) n *= d;
  const int64_t bytes = aligned(std::max<int64_t>(n * static_cast<int64_t>(dtype_size(t)), 1));
  if (device_ == Device::cpu) {
    // Counted as the CUDA arena would carve it, so high_water() means the same on both.
    used_ += bytes;
    high_water_ = std::max(high_water_, used_);
    host_.emplace_back(t, std::move(dims));
    return host_.back().view();
  }
  if (arena_.numel() > 0 && used_ + bytes <= arena_.numel()) {
    TensorView v(arena_.data<uint8_t>() + used_, t, dims, Device::cuda);
    used_ += bytes;
    high_water_ = std::max(high_water_, used_);
    return v;
  }
  if (capturing_)
    fail("Attention::forward: the step's temporaries outgrow the workspace reserved before the "
         "graph capture (", used_ + overflow_bytes_ + bytes, " > ", arena_.numel(),
         " bytes); run one step of this shape eagerly (or reserve()) first");
  overflow_.emplace_back(t, dims);
  overflow_bytes_ += bytes;
  high_water_ = std::max(high_water_, used_ + overflow_bytes_);
  return overflow_.back().view();
}

TensorView Scratch::upload(const HostTensor& host) {
  if (device_ == Device::cpu) {
    used_ += aligned(std::max<int64_t>(static_cast<int64_t>(host.nbytes()), 1));
    high_water_ = std::max(high_water_, used_);
    host_.push_back(host);
    return host.view();
  }
  TensorView d = tensor(host.dtype(), host.shape());
  if (host.nbytes() == 0) return d;
  // A copy from pageable memory (the slow path for host inputs; see the header), ordered on the
  // stream after the work that last used this part of the arena.
  rt::copy_host_to_device_async(d.data, host.view().data, host.nbytes(), stream_);
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
  // After the step's work on our stream (copy_to_host synchronizes with the device).
  rt::Event done;
  done.record(stream_);
  done.wait_host();
  copy_to_host(device, host);
}

void Scratch::set_stream(Stream stream) {
  if (stream == stream_) return;
  // The new stream waits (on the device) for the work the old one enqueued on the arena. Inside
  // a caller's capture the caller has ordered its capture stream after the old one already (as
  // torch.cuda.graph does), and an outside event may not be waited on there.
  if (device_ == Device::cuda && !rt::is_capturing(stream)) {
    rt::Event done;
    done.record(stream_);
    done.make_wait(stream);
  }
  stream_ = stream;
}

void Scratch::reset() {
  host_.clear();
  if (!overflow_.empty()) {
    // Grow: one arena for everything the last forward needed (the old buffers are freed here,
    // after the forward that used them was enqueued; cudaFree waits for the device).
    const int64_t total = used_ + overflow_bytes_;
    overflow_.clear();
    overflow_bytes_ = 0;
    reserve(total);
  }
  used_ = 0;
}

void Scratch::reserve(int64_t bytes) {
  if (device_ == Device::cpu) {
    cpu_reserved_ = std::max(cpu_reserved_, bytes);  // accounting only: CPU tensors are separate
    return;
  }
  if (bytes <= arena_.numel()) return;
  arena_ = DeviceTensor();
  arena_ = DeviceTensor(DType::uint8, {aligned(bytes)});
  ++generation_;
}

void check_reserve_bounds(const char* where, int64_t max_tokens, int max_requests, int64_t max_context,
                          int64_t max_position) {
  if (max_tokens < 1) fail_expected(where, "max_tokens", ">= 1", max_tokens);
  if (max_requests < 1 || max_requests > max_tokens)
    fail_expected(where, "max_requests", "1..max_tokens", max_requests);
  if (max_context < (max_tokens + max_requests - 1) / max_requests || max_context > max_position)
    fail_expected(where, "max_context",
                  "max_tokens / max_requests (rounded up) .. max_position " + std::to_string(max_position),
                  max_context);
}

}  // namespace dsv4

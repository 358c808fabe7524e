#include "layer/step_upload.h"

#include <algorithm>

#include "dsv4/status.h"

namespace dsv4 {

void StepUpload::Array::append_to_key(std::vector<int64_t>& key) const {
  key.push_back(offset);
  key.insert(key.end(), shape.begin(), shape.end());
  key.push_back(-1);  // ends the shape: the next array's numbers cannot be read as part of it
}

namespace {
int64_t round_up(int64_t v, int64_t a) { return (v + a - 1) / a * a; }
}  // namespace

void StepUpload::begin() {
  host_size_ = 0;
  dirty_lo_ = 0;
  dirty_hi_ = INT64_MAX;
}

void StepUpload::resume() {
  DSV4_CHECK(committed_ != nullptr, "StepUpload::resume: no step was committed");
  // After a commit nothing is dirty yet; a step that was put but never committed (its forward
  // threw first) keeps its dirty bytes for this commit.
}

void StepUpload::grow_host(int64_t bytes) {
  if (bytes <= host_capacity_) return;
  // (A multiple of kAlign: a send rounded out to whole words stays inside the host bytes.)
  const int64_t capacity = round_up(std::max(bytes, 2 * host_capacity_), kAlign);
  std::unique_ptr<uint8_t[]> grown(new uint8_t[static_cast<size_t>(capacity)]);  // uninitialized
  if (host_size_ > 0) std::memcpy(grown.get(), host_.get(), static_cast<size_t>(host_size_));
  host_ = std::move(grown);
  host_capacity_ = capacity;
}

StepUpload::Array StepUpload::put_uninit(DType dtype, std::vector<int64_t> shape) {
  int64_t n = 1;
  for (int64_t d : shape) n *= d;
  const int64_t bytes = n * static_cast<int64_t>(dtype_size(dtype));
  Array a{round_up(host_size_, kAlign), dtype, std::move(shape)};
  grow_host(a.offset + bytes);
  host_size_ = a.offset + bytes;
  return a;
}

StepUpload::Array StepUpload::put(DType dtype, std::vector<int64_t> shape, const void* data) {
  Array a = put_uninit(dtype, std::move(shape));
  const int64_t bytes = host_size_ - a.offset;
  if (bytes > 0) std::memcpy(host_.get() + a.offset, data, static_cast<size_t>(bytes));
  return a;
}

StepUpload::Array StepUpload::tables(const std::vector<const std::vector<int32_t>*>& tables,
                                     int64_t rows, int64_t width, const char* name) {
  DSV4_CHECK(rows >= static_cast<int64_t>(tables.size()), "StepUpload::tables: ", rows,
             " rows for ", tables.size(), " requests");
  const Array a = put_uninit(DType::int32, {rows, width});
  int32_t* packed = host_data<int32_t>(a);
  std::fill(packed, packed + rows * width, -1);
  for (size_t i = 0; i < tables.size(); ++i) {
    const std::vector<int32_t>& t = *tables[i];
    DSV4_CHECK(static_cast<int64_t>(t.size()) <= width, "StepUpload::tables: ", name, " table of ",
               t.size(), " blocks exceeds the width ", width);
    std::copy(t.begin(), t.end(), packed + static_cast<int64_t>(i) * width);
  }
  return a;
}

void StepUpload::grow_device(int64_t bytes) {
  if (device_buffer_.numel() >= bytes) return;
  device_buffer_ = DeviceTensor();  // free first: the old buffer is dead once the stream drained
  device_buffer_ = DeviceTensor(DType::uint8, {round_up(std::max<int64_t>(bytes, 4096), 4096)});
  device_current_ = false;
  ++generation_;
}

void StepUpload::reserve(int64_t bytes) {
  if (device_ == Device::cpu) {
    grow_host(bytes);
    return;
  }
  grow_device(bytes);
  for (Staging& s : ring_)
    if (static_cast<int64_t>(s.buffer.size()) < bytes) {
      s.copied.wait_host();
      s.buffer = rt::PinnedBuffer(static_cast<size_t>(round_up(bytes, 4096)));
    }
  if (static_cast<int64_t>(capture_spare_.size()) < bytes)
    capture_spare_ = rt::PinnedBuffer(static_cast<size_t>(round_up(bytes, 4096)));
  if (!posted_) posted_ = std::make_unique<rt::PostedCopy>();
  if (posted_->reserve(round_up(bytes, kAlign), posted_stream_)) ++generation_;  // graphs' takes read it
}

void StepUpload::commit(Stream stream) {
  if (device_ == Device::cpu) {
    committed_ = host_.get();
    dirty_lo_ = INT64_MAX;
    dirty_hi_ = 0;
    return;
  }
  const int64_t bytes = host_size_;
  if (rt::is_capturing(stream)) {
    // A caller's capture: the copy node keeps reading this staging at every replay.
    if (device_buffer_.numel() < bytes || static_cast<int64_t>(capture_spare_.size()) < bytes)
      fail("Attention::forward: the step's plan (", bytes, " bytes) does not fit the buffers "
           "reserved before capture; run one step of this shape eagerly (or reserve()) first");
    std::memcpy(capture_spare_.data(), host_.get(), static_cast<size_t>(bytes));
    rt::copy_host_to_device_async(device_buffer_.data<uint8_t>(), capture_spare_.data(),
                                  static_cast<size_t>(bytes), stream);
    captured_.push_back(std::move(capture_spare_));
    capture_spare_ = rt::PinnedBuffer();
    sent();
    device_current_ = false;  // every replay of that capture re-sends its own snapshot
    return;
  }
  if (device_buffer_.numel() < bytes) reserve(bytes);
  if (capture_spare_.size() == 0)
    capture_spare_ = rt::PinnedBuffer(static_cast<size_t>(round_up(std::max<int64_t>(bytes, 4096), 4096)));
  // Only the marked bytes, when the device buffer holds the rest from the last send.
  const auto [lo, hi] = pending_span(1);
  if (hi > lo) {
    Staging& s = ring_[next_];
    next_ = (next_ + 1) % kRing;
    s.copied.wait_host();  // only waits if the host ran kRing steps ahead of the GPU
    if (static_cast<int64_t>(s.buffer.size()) < bytes)
      s.buffer = rt::PinnedBuffer(static_cast<size_t>(round_up(bytes, 4096)));
    std::memcpy(s.buffer.data() + lo, host_.get() + lo, static_cast<size_t>(hi - lo));
    rt::copy_host_to_device_async(device_buffer_.data<uint8_t>() + lo, s.buffer.data() + lo,
                                  static_cast<size_t>(hi - lo), stream);
    s.copied.record(stream);
  }
  sent();
}

std::pair<int64_t, int64_t> StepUpload::pending_span(int64_t align) const {
  const int64_t bytes = host_size_;
  const int64_t lo = device_current_ ? std::min(dirty_lo_, bytes) : 0;
  const int64_t hi = device_current_ ? std::min(dirty_hi_, bytes) : bytes;
  if (hi <= lo) return {0, 0};
  return {lo / align * align, round_up(hi, align)};
}

void StepUpload::sent() {
  device_current_ = true;
  dirty_lo_ = INT64_MAX;
  dirty_hi_ = 0;
  committed_ = device_buffer_.data<uint8_t>();
}

void StepUpload::post(Stream stream) {
  DSV4_CHECK(device_ == Device::cuda, "StepUpload::post: a CUDA upload only");
  posted_stream_ = stream;
  if (!posted_ || device_buffer_.numel() < host_size_ || posted_->capacity() < round_up(host_size_, kAlign))
    reserve(host_size_);
  // Whole words: the host bytes and the device buffer are both sized in multiples of kAlign.
  static_assert(kAlign % rt::PostedCopy::kAlign == 0);
  const auto [lo, hi] = pending_span(rt::PostedCopy::kAlign);
  posted_->post(host_.get(), lo, hi, stream);  // an empty range too: the graph's take runs anyway
  sent();
}

void StepUpload::receive(Stream stream) {
  DSV4_CHECK(posted_ != nullptr, "StepUpload::receive: nothing was posted");
  posted_->take(device_buffer_.data<uint8_t>(), stream);
}

void StepUpload::received() {
  if (posted_) posted_->taken_enqueued();
}

TensorView StepUpload::view(const Array& a) const {
  DSV4_CHECK(a.offset >= 0 && committed_ != nullptr, "StepUpload::view: array not committed");
  return TensorView(const_cast<uint8_t*>(committed_) + a.offset, a.dtype, a.shape, device_);
}

}  // namespace dsv4

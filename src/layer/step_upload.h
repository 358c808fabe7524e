// StepUpload: the host-built metadata of one forward step (positions, slot mappings, block
// tables, per-request lengths), packed into one buffer and sent to the layer's device with ONE
// asynchronous copy from page-locked memory — or, for a replayed decode graph, posted and taken
// by the graph's first kernel (post() / receive(): no CUDA call on the host).
//
// A step plans first and launches after: the planner put()s every array (an Array handle comes
// back), commit() sends them all, and view() then gives each array as a TensorView on the device.
// On the CPU backend nothing moves: views point into the packed host bytes.
//
// Why this shape (CUDA):
//   - one copy per step instead of one per array, and from pinned memory, so the stream never
//     waits for the host (a pageable copy makes CUDA stage it synchronously);
//   - the device buffer only grows, and keeps its address otherwise, so captured CUDA graphs that
//     read it stay valid (generation() changes whenever the address changes, or the posted
//     staging's);
//   - page-locked staging is a ring of kRing buffers, each reused only after the copy that last
//     read it completed (flow control: the host waits only if it runs kRing steps ahead);
//   - inside a caller's stream capture (torch.cuda.graph) the copy is captured reading staging
//     memory that is never reused (one spare buffer is kept ready, since allocating page-locked
//     memory while capturing is not allowed), so every replay re-sends the captured plan;
//   - a step that resume()s the last one's arrays sends only the bytes it changed: at decode most
//     of the upload is block tables, which change only when a request crosses a block.
//   - a replayed decode step posts instead of copying (post(); rt::PostedCopy): the bytes go to
//     page-locked memory and the step's first kernel, captured in its graph (receive()), copies
//     them over, so the host makes no CUDA call for its plan at all.
#pragma once

#include <algorithm>
#include <cstdint>
#include <cstring>
#include <memory>
#include <utility>
#include <vector>

#include "dsv4/device_tensor.h"
#include "dsv4/ops.h"
#include "dsv4/tensor.h"
#include "runtime/device_runtime.h"
#include "runtime/posted_copy.h"

namespace dsv4 {

class StepUpload {
 public:
  struct Array {
    int64_t offset = -1;  // bytes into the packed buffer; -1: not put
    DType dtype = DType::int32;
    std::vector<int64_t> shape;
    // Appends what a launch reading this array depends on — its offset and shape — to a decode
    // graph's key (DecodeGraphs): equal keys, the same view addresses and shapes.
    void append_to_key(std::vector<int64_t>& key) const;
  };

  explicit StepUpload(Device device) : device_(device) {}

  // Forgets the previous step's arrays (their device views stay valid until the next commit).
  void begin();
  // Keeps the previous step's arrays instead — their offsets, shapes and host bytes — for a step
  // that rewrites only some of them (StepPlanner's decode step of the same batch as the last):
  // the caller writes through host_data() and marks what it wrote with mark_dirty(); commit()
  // then sends the bytes marked since the last commit (a step put but never committed, its
  // forward having thrown, included) when the device buffer still holds the rest.
  void resume();
  // Bytes [offset, offset + bytes) of the packed arrays changed since the last commit.
  void mark_dirty(int64_t offset, int64_t bytes) {
    dirty_lo_ = std::min(dirty_lo_, offset);
    dirty_hi_ = std::max(dirty_hi_, offset + bytes);
  }
  // Bytes the next commit sends where the device buffer holds the last commit's (all of them
  // after begin()): the span of what was marked since the last commit.
  int64_t pending_bytes() const { return std::max<int64_t>(0, std::min(dirty_hi_, host_size_) - dirty_lo_); }
  // Appends a copy of `bytes` bytes laid out as dtype [shape] (the caller's element count).
  Array put(DType dtype, std::vector<int64_t> shape, const void* data);
  template <class T>
  Array put(std::vector<int64_t> shape, const std::vector<T>& values) {
    return put(dtype_of<T>(), std::move(shape), values.data());
  }
  // Appends room for dtype [shape], to be filled through host_data() (no staging vector).
  Array put_uninit(DType dtype, std::vector<int64_t> shape);
  // The host bytes of an array put since begin(), valid until the next put.
  template <class T>
  T* host_data(const Array& a) {
    return reinterpret_cast<T*>(host_.get() + a.offset);
  }
  // Block tables (in order) as int32 [rows, width], -1 padded: rows beyond tables.size()
  // (padding requests of a graph bucket) are all -1. width must cover every table.
  Array tables(const std::vector<const std::vector<int32_t>*>& tables, int64_t rows, int64_t width,
               const char* name);

  // Sends everything put since begin() on `stream` (CPU: nothing to do).
  void commit(Stream stream);
  // commit() for a step whose launch begins with receive(stream), as a replayed decode graph's
  // does (CUDA only): posts the same bytes, with no CUDA call (rt::PostedCopy). After the launch
  // that receives it (its graph's replay or capture, or the eager launch) was enqueued, the caller
  // calls received(); a post whose launch never came is settled by the next post.
  void post(Stream stream);
  // Enqueues on `stream` the kernel that copies the last post into the device buffer: the first
  // node of the step's launch (capturable).
  void receive(Stream stream);
  void received();
  // The device (CPU: host) view of an array, valid after commit() until the next commit().
  TensorView view(const Array& a) const;

  // Grows the device buffer and the staging to hold `bytes` (outside any capture).
  void reserve(int64_t bytes);
  // Changes whenever the device buffer or the posted staging moves (graphs that read them must be
  // captured again).
  uint64_t generation() const { return generation_; }
  int64_t size() const { return host_size_; }
  // Bytes of the device buffer (CPU: of the host staging).
  int64_t capacity() const {
    return device_ == Device::cpu ? host_capacity_ : device_buffer_.numel();
  }

 private:
  template <class T>
  static constexpr DType dtype_of() {
    if constexpr (std::is_same_v<T, int32_t>) return DType::int32;
    else return DType::int64;
  }
  void grow_device(int64_t bytes);
  // The bytes the next send covers, [lo, hi) rounded out to `align`: the marked span when the
  // device buffer holds the rest, else everything.
  std::pair<int64_t, int64_t> pending_span(int64_t align) const;
  // After a send: the device buffer holds the host bytes, nothing is marked, views point at it.
  void sent();
  // Makes the host bytes hold at least `bytes` (keeping those put so far).
  void grow_host(int64_t bytes);

  static constexpr int kRing = 3;
  static constexpr int64_t kAlign = 64;
  struct Staging {
    rt::PinnedBuffer buffer;
    rt::Event copied;  // the copy that last read `buffer`
  };

  Device device_;
  // The packed arrays of this step. Grown without zeroing: every put writes all of its bytes
  // (the padding between arrays is never read), and a step's planning is on the decode path.
  std::unique_ptr<uint8_t[]> host_;
  int64_t host_size_ = 0, host_capacity_ = 0;
  // The bytes changed since the last commit (begin(): all; commit() resets them to none), and
  // whether the device buffer holds the host bytes as of the last commit (not after it moved, nor
  // after a caller's capture, whose copy node re-sends its own snapshot at every replay).
  int64_t dirty_lo_ = 0, dirty_hi_ = INT64_MAX;
  bool device_current_ = false;
  const uint8_t* committed_ = nullptr;  // base of the views: the device buffer (CPU: host_)
  DeviceTensor device_buffer_;
  Staging ring_[kRing];
  int next_ = 0;
  std::unique_ptr<rt::PostedCopy> posted_;  // post() (created by the first one)
  Stream posted_stream_ = nullptr;            // the stream of the last post (reserve() waits on it)
  rt::PinnedBuffer capture_spare_;   // for a copy captured by a caller's graph
  std::vector<rt::PinnedBuffer> captured_;  // staging owned by captured copies: never reused
  uint64_t generation_ = 0;
};

}  // namespace dsv4

// The few CUDA runtime services the layer's orchestration needs beyond the ops — page-locked
// staging memory, events, private streams and graph capture — behind a header with no CUDA
// types, so src/layer/ stays backend-neutral. Implemented in src/cuda/runtime/ when CUDA is
// built; otherwise every constructor that needs a GPU throws dsv4::Error (runtime_none.cpp).
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>

#include "dsv4/ops.h"  // Stream

namespace dsv4::rt {

// Page-locked host memory (cudaHostAlloc): host-to-device copies from it are truly
// asynchronous, where copies from pageable memory make the stream wait for the host.
class PinnedBuffer {
 public:
  PinnedBuffer() = default;
  explicit PinnedBuffer(size_t bytes);
  uint8_t* data() const { return data_.get(); }
  size_t size() const { return size_; }

 private:
  std::shared_ptr<uint8_t> data_;
  size_t size_ = 0;
};

// A timing-free event: marks a point of a stream, so the host (or another stream) can wait for
// exactly the work before it.
class Event {
 public:
  // Created on first record(); a default Event is "already complete". `timing`: the event also
  // carries a time stamp (elapsed_ms).
  explicit Event(bool timing = false);
  ~Event();
  Event(Event&& other) noexcept;
  Event& operator=(Event&& other) noexcept;
  Event(const Event&) = delete;
  Event& operator=(const Event&) = delete;

  void record(Stream stream);
  // Blocks the calling host thread until the recorded work is done (no-op if never recorded).
  void wait_host() const;
  // Makes `stream` wait (on the device) for the recorded work.
  void make_wait(Stream stream) const;
  // Milliseconds between two recorded timing events (waits for `end`).
  static float elapsed_ms(const Event& start, const Event& end);

 private:
  void* event_ = nullptr;  // cudaEvent_t
  bool recorded_ = false;
  bool timing_ = false;
};

// A stream of our own (non-blocking with respect to the legacy default stream): graph capture
// needs one, since the default stream cannot be captured.
class OwnedStream {
 public:
  OwnedStream();
  ~OwnedStream();
  OwnedStream(const OwnedStream&) = delete;
  OwnedStream& operator=(const OwnedStream&) = delete;
  Stream get() const { return stream_; }

 private:
  Stream stream_ = nullptr;
};

// An instantiated CUDA graph, launched as one unit on any stream.
class Graph {
 public:
  Graph() = default;
  ~Graph();
  Graph(Graph&& other) noexcept;
  Graph& operator=(Graph&& other) noexcept;
  Graph(const Graph&) = delete;
  Graph& operator=(const Graph&) = delete;

  bool valid() const { return exec_ != nullptr; }
  void launch(Stream stream) const;

  // Captures what `body` enqueues on `capture_stream` (which must not be capturing already;
  // thread-local capture mode, so other threads' CUDA calls are unaffected) and instantiates it.
  // A throw from `body` ends the capture and rethrows.
  template <class Body>
  static Graph capture(Stream capture_stream, Body&& body) {
    begin_capture(capture_stream);
    try {
      body();
    } catch (...) {
      abort_capture(capture_stream);
      throw;
    }
    return end_capture(capture_stream);
  }

 private:
  static void begin_capture(Stream stream);
  static void abort_capture(Stream stream) noexcept;
  static Graph end_capture(Stream stream);
  void* exec_ = nullptr;  // cudaGraphExec_t
};

// Whether work enqueued on `stream` is being captured into a graph right now (a caller's
// torch.cuda.graph, say): then nothing may synchronize, allocate or copy from pageable memory.
bool is_capturing(Stream stream);

// Ordered on `stream`. From pinned memory the host does not wait; from pageable memory CUDA
// stages the bytes before returning (the host may reuse them right after, but it waits).
void copy_host_to_device_async(void* device_dst, const void* host_src, size_t bytes,
                               Stream stream);
void copy_device_to_device_async(void* dst, const void* src, size_t bytes, Stream stream);
void memset_device_async(void* dst, int byte, size_t bytes, Stream stream);

}  // namespace dsv4::rt

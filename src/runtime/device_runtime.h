// The few CUDA runtime services the layer's orchestration, DeviceTensor and the tools need beyond
// the ops — device memory, page-locked staging memory, events, private streams, synchronization
// and graph capture — behind a header with no CUDA types, so src/layer/, src/core/ and tools/
// stay backend-neutral and ask at run time (built(), device_available()) whether there is a GPU.
// Implemented in src/cuda/runtime/ when CUDA is built; otherwise (device_runtime_none.cpp, chosen
// by the build) whatever needs a GPU throws dsv4::Error. Siblings of this header in src/runtime/
// (random_fill.h, ceiling_gemm.h) follow the same split.
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "dsv4/ops.h"  // Stream

namespace dsv4::rt {

// Whether the library was built with the CUDA runtime, and whether a GPU is visible now.
bool built();
bool device_available();
// The CUDA runtime version the library was built against (e.g. 13000); 0 without CUDA.
int runtime_version();

struct DeviceInfo {
  std::string name;
  int sm_major = 0, sm_minor = 0;
  int sms = 0;
  size_t total_bytes = 0;
  size_t l2_bytes = 0;  // benchmarks rotate their inputs beyond it
};
// The visible GPUs; empty, with the reason in `why`, when there are none.
std::vector<DeviceInfo> devices(std::string* why);
// Free bytes of the current device's memory (throws dsv4::Error naming `where` without one).
size_t device_free_bytes(const char* where);

// The CUDA device current on the calling host thread, and making another one current (every
// allocation, stream and launch of that thread goes to it). Throws dsv4::Error naming `where`
// for a device that is not visible, or without CUDA.
int current_device(const char* where);
void set_device(int device, const char* where);

// Makes `device` current on this thread for the guard's lifetime, then the one before it again;
// device -1 changes nothing (a single-device or CPU caller). How a process that drives several
// GPUs (tensor-parallel ranks) builds and frees each rank's state on its own GPU.
class DeviceGuard {
 public:
  DeviceGuard(int device, const char* where);
  ~DeviceGuard();
  DeviceGuard(const DeviceGuard&) = delete;
  DeviceGuard& operator=(const DeviceGuard&) = delete;

 private:
  int previous_ = -1;  // -1: nothing to restore
};

// Synchronous device memory for DeviceTensor (test and tool setup; never inside a forward).
// `where` names the caller in errors. device_malloc never returns null (a zero-byte request gets
// a small allocation, so a view of it is "defined").
void* device_malloc(size_t bytes, const char* where);
void device_free(void* ptr) noexcept;
void copy_host_to_device(void* device_dst, const void* host_src, size_t bytes, const char* where);
void copy_device_to_host(void* host_dst, const void* device_src, size_t bytes, const char* where);
void memset_device(void* dst, int byte, size_t bytes, const char* where);

// Blocks the calling host thread until the work enqueued on `stream` (synchronize_stream), or on
// every stream of the current device (synchronize_device), is done; an asynchronous fault of that
// work throws dsv4::Error naming `where`. Tool and test setup only: a forward never waits.
// Without CUDA nothing can have been enqueued, so both return at once.
void synchronize_stream(Stream stream, const char* where);
void synchronize_device(const char* where);

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
// From GPU `src_device`'s memory to GPU `dst_device`'s (NVLink or PCIe), ordered on `stream`, a
// stream of either device (the other device's work is not waited for: order it with an Event).
void copy_peer_async(void* dst, int dst_device, const void* src, int src_device, size_t bytes,
                     Stream stream);
void memset_device_async(void* dst, int byte, size_t bytes, Stream stream);

}  // namespace dsv4::rt

// CUDA implementation of src/runtime/device_runtime.h.
#include "runtime/device_runtime.h"

#include <cuda_runtime.h>

#include <utility>

#include "cuda/common/capture_mode.h"
#include "cuda/common/check.h"

namespace dsv4::rt {

using cuda::check_cuda;

bool built() { return true; }

bool device_available() {
  int n = 0;
  return cudaGetDeviceCount(&n) == cudaSuccess && n > 0;
}

int runtime_version() { return CUDART_VERSION; }

std::vector<DeviceInfo> devices(std::string* why) {
  int count = 0;
  const cudaError_t err = cudaGetDeviceCount(&count);
  std::vector<DeviceInfo> out;
  if (err != cudaSuccess || count == 0) {
    if (why) *why = err != cudaSuccess ? cudaGetErrorString(err) : "no CUDA device";
    return out;
  }
  for (int d = 0; d < count; ++d) {
    cudaDeviceProp prop{};
    if (cudaGetDeviceProperties(&prop, d) != cudaSuccess) continue;
    out.push_back({prop.name, prop.major, prop.minor, prop.multiProcessorCount, prop.totalGlobalMem,
                   static_cast<size_t>(prop.l2CacheSize)});
  }
  return out;
}

size_t device_free_bytes(const char* where) {
  size_t free_bytes = 0, total_bytes = 0;
  check_cuda(cudaMemGetInfo(&free_bytes, &total_bytes), where, "cudaMemGetInfo");
  return free_bytes;
}

int current_device(const char* where) {
  int device = 0;
  check_cuda(cudaGetDevice(&device), where, "cudaGetDevice");
  return device;
}

void set_device(int device, const char* where) {
  check_cuda(cudaSetDevice(device), where, "cudaSetDevice");
}

DeviceGuard::DeviceGuard(int device, const char* where) {
  if (device < 0) return;
  const int previous = current_device(where);
  if (previous != device) {
    set_device(device, where);
    previous_ = previous;
  }
}

DeviceGuard::~DeviceGuard() {
  if (previous_ >= 0) cudaSetDevice(previous_);
}

void* device_malloc(size_t bytes, const char* where) {
  void* ptr = nullptr;
  check_cuda(cudaMalloc(&ptr, bytes > 0 ? bytes : 256), where, "cudaMalloc");
  return ptr;
}

void device_free(void* ptr) noexcept { cudaFree(ptr); }

void copy_host_to_device(void* device_dst, const void* host_src, size_t bytes, const char* where) {
  if (bytes == 0) return;
  check_cuda(cudaMemcpy(device_dst, host_src, bytes, cudaMemcpyHostToDevice), where, "cudaMemcpy");
}

void copy_device_to_host(void* host_dst, const void* device_src, size_t bytes, const char* where) {
  if (bytes == 0) return;
  check_cuda(cudaMemcpy(host_dst, device_src, bytes, cudaMemcpyDeviceToHost), where, "cudaMemcpy");
}

void memset_device(void* dst, int byte, size_t bytes, const char* where) {
  if (bytes == 0) return;
  check_cuda(cudaMemset(dst, byte, bytes), where, "cudaMemset");
}

void synchronize_stream(Stream stream, const char* where) {
  check_cuda(cudaStreamSynchronize(stream), where, "cudaStreamSynchronize");
}

void synchronize_device(const char* where) {
  check_cuda(cudaDeviceSynchronize(), where, "cudaDeviceSynchronize");
}

PinnedBuffer::PinnedBuffer(size_t bytes) : size_(bytes) {
  void* p = nullptr;
  check_cuda(cudaHostAlloc(&p, bytes > 0 ? bytes : 1, cudaHostAllocDefault), "PinnedBuffer",
             "cudaHostAlloc");
  data_ = std::shared_ptr<uint8_t>(static_cast<uint8_t*>(p), [](uint8_t* q) { cudaFreeHost(q); });
}

Event::Event(bool timing) : timing_(timing) {}
Event::~Event() {
  if (event_) cudaEventDestroy(static_cast<cudaEvent_t>(event_));
}
Event::Event(Event&& other) noexcept
    : event_(std::exchange(other.event_, nullptr)),
      recorded_(std::exchange(other.recorded_, false)),
      timing_(other.timing_) {}
Event& Event::operator=(Event&& other) noexcept {
  if (this != &other) {
    if (event_) cudaEventDestroy(static_cast<cudaEvent_t>(event_));
    event_ = std::exchange(other.event_, nullptr);
    recorded_ = std::exchange(other.recorded_, false);
    timing_ = other.timing_;
  }
  return *this;
}

void Event::record(Stream stream) {
  if (!event_) {
    const cuda::RelaxedCaptureMode relaxed("Event");
    cudaEvent_t e = nullptr;
    check_cuda(cudaEventCreateWithFlags(&e, timing_ ? cudaEventDefault : cudaEventDisableTiming),
               "Event", "cudaEventCreate");
    event_ = e;
  }
  check_cuda(cudaEventRecord(static_cast<cudaEvent_t>(event_), stream), "Event", "cudaEventRecord");
  recorded_ = true;
}

void Event::wait_host() const {
  if (recorded_)
    check_cuda(cudaEventSynchronize(static_cast<cudaEvent_t>(event_)), "Event", "cudaEventSynchronize");
}

void Event::make_wait(Stream stream) const {
  if (recorded_)
    check_cuda(cudaStreamWaitEvent(stream, static_cast<cudaEvent_t>(event_), 0), "Event",
               "cudaStreamWaitEvent");
}

float Event::elapsed_ms(const Event& start, const Event& end) {
  DSV4_CHECK(start.recorded_ && end.recorded_ && start.timing_ && end.timing_,
             "Event::elapsed_ms: both events must be recorded timing events");
  end.wait_host();
  float ms = 0.0f;
  check_cuda(cudaEventElapsedTime(&ms, static_cast<cudaEvent_t>(start.event_),
                                  static_cast<cudaEvent_t>(end.event_)),
             "Event::elapsed_ms", "cudaEventElapsedTime");
  return ms;
}

OwnedStream::OwnedStream() {
  const cuda::RelaxedCaptureMode relaxed("OwnedStream");
  cudaStream_t s = nullptr;
  check_cuda(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking), "OwnedStream",
             "cudaStreamCreate");
  stream_ = s;
}
OwnedStream::~OwnedStream() {
  if (stream_) cudaStreamDestroy(stream_);
}

Graph::~Graph() {
  if (exec_) cudaGraphExecDestroy(static_cast<cudaGraphExec_t>(exec_));
}
Graph::Graph(Graph&& other) noexcept : exec_(std::exchange(other.exec_, nullptr)) {}
Graph& Graph::operator=(Graph&& other) noexcept {
  if (this != &other) {
    if (exec_) cudaGraphExecDestroy(static_cast<cudaGraphExec_t>(exec_));
    exec_ = std::exchange(other.exec_, nullptr);
  }
  return *this;
}

void Graph::launch(Stream stream) const {
  check_cuda(cudaGraphLaunch(static_cast<cudaGraphExec_t>(exec_), stream), "Graph::launch",
             "cudaGraphLaunch");
}

void Graph::begin_capture(Stream stream) {
  check_cuda(cudaStreamBeginCapture(stream, cudaStreamCaptureModeThreadLocal), "Graph::capture",
             "cudaStreamBeginCapture");
}

void Graph::abort_capture(Stream stream) noexcept {
  cudaGraph_t g = nullptr;
  if (cudaStreamEndCapture(stream, &g) == cudaSuccess && g) cudaGraphDestroy(g);
  cudaGetLastError();  // the failed capture's sticky-free error, if any
}

Graph Graph::end_capture(Stream stream) {
  cudaGraph_t g = nullptr;
  check_cuda(cudaStreamEndCapture(stream, &g), "Graph::capture", "cudaStreamEndCapture");
  cudaGraphExec_t exec = nullptr;
  const cudaError_t err = cudaGraphInstantiate(&exec, g, 0);
  cudaGraphDestroy(g);
  check_cuda(err, "Graph::capture", "cudaGraphInstantiate");
  Graph out;
  out.exec_ = exec;
  return out;
}

bool is_capturing(Stream stream) {
  cudaStreamCaptureStatus status = cudaStreamCaptureStatusNone;
  check_cuda(cudaStreamIsCapturing(stream, &status), "is_capturing", "cudaStreamIsCapturing");
  return status != cudaStreamCaptureStatusNone;
}

void copy_host_to_device_async(void* device_dst, const void* pinned_src, size_t bytes,
                               Stream stream) {
  if (bytes == 0) return;
  check_cuda(cudaMemcpyAsync(device_dst, pinned_src, bytes, cudaMemcpyHostToDevice, stream),
             "copy_host_to_device_async", "cudaMemcpyAsync");
}

void copy_device_to_device_async(void* dst, const void* src, size_t bytes, Stream stream) {
  if (bytes == 0) return;
  check_cuda(cudaMemcpyAsync(dst, src, bytes, cudaMemcpyDeviceToDevice, stream),
             "copy_device_to_device_async", "cudaMemcpyAsync");
}

void copy_peer_async(void* dst, int dst_device, const void* src, int src_device, size_t bytes,
                     Stream stream) {
  if (bytes == 0) return;
  check_cuda(cudaMemcpyPeerAsync(dst, dst_device, src, src_device, bytes, stream), "copy_peer_async",
             "cudaMemcpyPeerAsync");
}

void memset_device_async(void* dst, int byte, size_t bytes, Stream stream) {
  if (bytes == 0) return;
  check_cuda(cudaMemsetAsync(dst, byte, bytes, stream), "memset_device_async", "cudaMemsetAsync");
}

}  // namespace dsv4::rt

// src/runtime/device_runtime.h without CUDA (the build compiles this file instead of
// src/cuda/runtime/ then): what needs a GPU throws dsv4::Error; what has a trivial host meaning
// (an event never recorded, a stream that is never capturing) works.
#include "dsv4/status.h"
#include "runtime/device_runtime.h"
#include "runtime/not_built.h"

namespace dsv4::rt {

void fail_not_built(const char* where) {
  fail(where, ": CUDA backend not built (configure with DSV4_CUDA=ON on a machine with nvcc)");
}

namespace {
[[noreturn]] void no_cuda(const char* what) {
  fail(what, ": the library was built without CUDA");
}
}  // namespace

bool built() { return false; }
bool device_available() { return false; }
int runtime_version() { return 0; }
std::vector<DeviceInfo> devices(std::string* why) {
  if (why) *why = "the library was built without CUDA";
  return {};
}
size_t device_free_bytes(const char* where) { fail_not_built(where); }
int current_device(const char* where) { fail_not_built(where); }
void set_device(int, const char* where) { fail_not_built(where); }
// Device -1 (a CPU caller) needs no runtime; a GPU does.
DeviceGuard::DeviceGuard(int device, const char* where) {
  if (device >= 0) fail_not_built(where);
}
DeviceGuard::~DeviceGuard() = default;
void* device_malloc(size_t, const char* where) { fail_not_built(where); }
void device_free(void*) noexcept {}
// Nothing to copy needs no device (as on CUDA, where an empty copy is a no-op).
void copy_host_to_device(void*, const void*, size_t bytes, const char* where) {
  if (bytes > 0) fail_not_built(where);
}
void copy_device_to_host(void*, const void*, size_t bytes, const char* where) {
  if (bytes > 0) fail_not_built(where);
}
void memset_device(void*, int, size_t, const char* where) { fail_not_built(where); }
void synchronize_stream(Stream, const char*) {}
void synchronize_device(const char*) {}

PinnedBuffer::PinnedBuffer(size_t) { no_cuda("PinnedBuffer"); }
Event::Event(bool timing) : timing_(timing) {}
float Event::elapsed_ms(const Event&, const Event&) { no_cuda("Event::elapsed_ms"); }
Event::~Event() = default;
Event::Event(Event&&) noexcept = default;
Event& Event::operator=(Event&&) noexcept = default;
void Event::record(Stream) { no_cuda("Event::record"); }
void Event::wait_host() const {}
void Event::make_wait(Stream) const {}
OwnedStream::OwnedStream() { no_cuda("OwnedStream"); }
OwnedStream::~OwnedStream() = default;
Graph::~Graph() = default;
Graph::Graph(Graph&&) noexcept = default;
Graph& Graph::operator=(Graph&&) noexcept = default;
void Graph::launch(Stream) const { no_cuda("Graph::launch"); }
void Graph::begin_capture(Stream) { no_cuda("Graph::capture"); }
void Graph::abort_capture(Stream) noexcept {}
Graph Graph::end_capture(Stream) { no_cuda("Graph::capture"); }
bool is_capturing(Stream) { return false; }
void copy_host_to_device_async(void*, const void*, size_t, Stream) {
  no_cuda("copy_host_to_device_async");
}
void copy_device_to_device_async(void*, const void*, size_t, Stream) {
  no_cuda("copy_device_to_device_async");
}
void copy_peer_async(void*, int, const void*, int, size_t, Stream) { no_cuda("copy_peer_async"); }
void memset_device_async(void*, int, size_t, Stream) { no_cuda("memset_device_async"); }

}  // namespace dsv4::rt

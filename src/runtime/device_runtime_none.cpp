// src/runtime/device_runtime.h without CUDA: what needs a GPU throws dsv4::Error; what has a
// trivial host meaning (an event never recorded, a stream that is never capturing) works.
#if !defined(DSV4_WITH_CUDA)
#include "dsv4/status.h"
#include "runtime/device_runtime.h"

namespace dsv4::rt {

namespace {
[[noreturn]] void no_cuda(const char* what) {
  fail(what, ": the library was built without CUDA");
}
}  // namespace

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
void memset_device_async(void*, int, size_t, Stream) { no_cuda("memset_device_async"); }

}  // namespace dsv4::rt
#endif

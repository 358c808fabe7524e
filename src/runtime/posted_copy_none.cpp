// src/runtime/posted_copy.h without CUDA (the build compiles this file instead of
// src/cuda/runtime/posted_copy.cu): there is no device to post to.
#include "runtime/posted_copy.h"

#include "runtime/not_built.h"

namespace dsv4::rt {

struct PostedCopy::State {};

PostedCopy::PostedCopy() { fail_not_built("PostedCopy"); }
PostedCopy::~PostedCopy() = default;
bool PostedCopy::reserve(int64_t, Stream) { fail_not_built("PostedCopy::reserve"); }
int64_t PostedCopy::capacity() const { return 0; }
void PostedCopy::post(const uint8_t*, int64_t, int64_t, Stream) { fail_not_built("PostedCopy::post"); }
void PostedCopy::take(uint8_t*, Stream) { fail_not_built("PostedCopy::take"); }
void PostedCopy::taken_enqueued() {}
uint64_t PostedCopy::taken() const { return 0; }
void PostedCopy::wait_taken(uint64_t, Stream) {}
void PostedCopy::settle(Stream) {}

}  // namespace dsv4::rt

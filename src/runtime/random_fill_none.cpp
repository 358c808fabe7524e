// src/runtime/random_fill.h without CUDA (the build compiles this file instead of
// src/cuda/runtime/random_fill.cu): there is no device buffer to fill.
#include "runtime/random_fill.h"

#include "runtime/not_built.h"

namespace dsv4::rt {

void fill_random_bf16(void*, size_t n, uint64_t, float, float, Stream) {
  if (n > 0) fail_not_built("fill_random_bf16");
}

void fill_random_int32(int32_t*, size_t n, uint64_t, int32_t, Stream) {
  if (n > 0) fail_not_built("fill_random_int32");
}

}  // namespace dsv4::rt

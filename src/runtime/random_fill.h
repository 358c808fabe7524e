// Deterministic random fills of device buffers (benchmarks: generating hundreds of MB on the host
// and uploading them would dominate their set-up time). Value i depends only on (seed, i), never
// on the launch shape. Enqueued on `stream`; a fill of n = 0 elements does nothing. Implemented
// by a kernel in src/cuda/runtime/ when CUDA is built; otherwise (random_fill_none.cpp, chosen by
// the build) a non-empty fill throws dsv4::Error.
#pragma once

#include <cstddef>
#include <cstdint>

#include "dsv4/ops.h"  // Stream

namespace dsv4::rt {

// n bf16 values uniform in [lo, hi) (never exactly zero: benchmarks must not time zeros).
void fill_random_bf16(void* dst, size_t n, uint64_t seed, float lo, float hi, Stream stream);
// n int32 values uniform in [0, bound) (bound > 0).
void fill_random_int32(int32_t* dst, size_t n, uint64_t seed, int32_t bound, Stream stream);

}  // namespace dsv4::rt

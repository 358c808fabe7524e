// Deterministic random fills on the device (benchmarks and large tests: generating hundreds of
// MB on the host would dominate their run time). Value i depends only on (seed, i).
#pragma once

#include <cstddef>
#include <cstdint>

struct CUstream_st;

namespace dsv4::cuda {

// n bf16 values uniform in [lo, hi) (never exactly zero: benchmarks must not time zeros).
void fill_random_bf16(void* dst, size_t n, uint64_t seed, float lo, float hi, CUstream_st* stream);
// n int32 values uniform in [0, bound).
void fill_random_int32(int32_t* dst, size_t n, uint64_t seed, int32_t bound, CUstream_st* stream);

}  // namespace dsv4::cuda

// CUDA implementation of src/runtime/random_fill.h.
#include "runtime/random_fill.h"

#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include "cuda/common/check.h"
#include "cuda/common/launch.cuh"

namespace dsv4::rt {
namespace {

using cuda::grid_dependency_entry;
using cuda::launch_kernel;

// splitmix64: a counter-based generator, so every element is independent of the launch shape.
__device__ __forceinline__ uint64_t splitmix64(uint64_t x) {
  x += 0x9E3779B97F4A7C15ull;
  x = (x ^ (x >> 30)) * 0xBF58476D1CE4E5B9ull;
  x = (x ^ (x >> 27)) * 0x94D049BB133111EBull;
  return x ^ (x >> 31);
}

__global__ void fill_bf16_kernel(__nv_bfloat16* dst, size_t n, uint64_t seed, float lo, float span) {
  grid_dependency_entry();
  for (size_t i = blockIdx.x * size_t{blockDim.x} + threadIdx.x; i < n; i += size_t{gridDim.x} * blockDim.x) {
    const float u = static_cast<float>(splitmix64(seed * 0x100000001B3ull + i) >> 40) * 0x1.0p-24f;
    float v = lo + span * u;
    if (v == 0.f) v = 1e-3f;
    dst[i] = __float2bfloat16_rn(v);
  }
}

__global__ void fill_int32_kernel(int32_t* dst, size_t n, uint64_t seed, uint32_t bound) {
  grid_dependency_entry();
  for (size_t i = blockIdx.x * size_t{blockDim.x} + threadIdx.x; i < n; i += size_t{gridDim.x} * blockDim.x) {
    dst[i] = static_cast<int32_t>(splitmix64(seed * 0x100000001B3ull + i) % bound);
  }
}

unsigned grid_for(size_t n) { return static_cast<unsigned>(n / 256 + 1 < 4096 ? n / 256 + 1 : 4096); }

}  // namespace

void fill_random_bf16(void* dst, size_t n, uint64_t seed, float lo, float hi, Stream stream) {
  if (n == 0) return;
  launch_kernel("fill_random_bf16", fill_bf16_kernel, {grid_for(n), 256, 0}, stream,
                static_cast<__nv_bfloat16*>(dst), n, seed, lo, hi - lo);
}

void fill_random_int32(int32_t* dst, size_t n, uint64_t seed, int32_t bound, Stream stream) {
  if (n == 0) return;
  DSV4_CHECK(bound > 0, "fill_random_int32: bound: expected > 0, got ", bound);
  launch_kernel("fill_random_int32", fill_int32_kernel, {grid_for(n), 256, 0}, stream, dst, n, seed,
                static_cast<uint32_t>(bound));
}

}  // namespace dsv4::rt

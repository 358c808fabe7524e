// CUDA C128A plan (docs/spec.md §5): indices[t, k] = k for k < count, then −1, count = (p+1) div r
// clamped to [0, K]. One thread per output element.
#include "cuda/common/check.h"
#include "cuda/common/index_vector.cuh"
#include "cuda/common/launch.cuh"
#include "cuda/indexer/indexer.h"
#include "dsv4/indexer_math.h"

namespace dsv4::cuda {
namespace {

constexpr int kThreads = 256;

// Grid size of a 1-d launch covering `n` items with `threads` per block, capped (kernels loop
// with a grid stride beyond it).
inline unsigned grid_1d(int64_t n, int threads, int64_t cap = int64_t{1} << 20) {
  const int64_t blocks = (n + threads - 1) / threads;
  return static_cast<unsigned>(blocks < cap ? blocks : cap);
}

__global__ void __launch_bounds__(kThreads)
    prefix_indices_kernel(IndexVector positions, int ratio, int64_t T, int64_t K, int32_t* indices,
                          int64_t indices_stride0, int32_t* lens, int64_t lens_stride) {
  grid_dependency_entry();
  const int64_t total = T * K;
  for (int64_t e = static_cast<int64_t>(blockIdx.x) * kThreads + threadIdx.x; e < total;
       e += static_cast<int64_t>(gridDim.x) * kThreads) {
    const int64_t t = e / K, k = e % K;
    const int64_t seen = indexer_math::visible_entries(positions[t], ratio);
    const int64_t count = seen < K ? seen : K;
    indices[t * indices_stride0 + k] = k < count ? static_cast<int32_t>(k) : -1;
    if (k == 0 && lens != nullptr) lens[t * lens_stride] = static_cast<int32_t>(count);
  }
}

// K == 0: only the lengths (all 0).
__global__ void __launch_bounds__(kThreads)
    zero_lens_kernel(int64_t T, int32_t* lens, int64_t lens_stride) {
  grid_dependency_entry();
  for (int64_t t = static_cast<int64_t>(blockIdx.x) * kThreads + threadIdx.x; t < T;
       t += static_cast<int64_t>(gridDim.x) * kThreads)
    lens[t * lens_stride] = 0;
}

}  // namespace

void compressed_prefix_indices(const TensorView& positions, int ratio, const TensorView& indices,
                               const TensorView& lens, Stream stream) {
  constexpr const char* kOp = "compressed_prefix_indices";
  const int64_t T = indices.size(0), K = indices.size(1);
  int32_t* lens_ptr = lens.defined() ? lens.ptr<int32_t>() : nullptr;
  const int64_t lens_stride = lens.defined() ? lens.stride(0) : 0;
  if (T == 0) return;
  if (K == 0) {
    if (lens_ptr == nullptr) return;
    launch_kernel(kOp, zero_lens_kernel, {grid_1d(T, kThreads), kThreads, 0}, stream, T, lens_ptr,
                  lens_stride);
  } else {
    launch_kernel(kOp, prefix_indices_kernel, {grid_1d(T * K, kThreads), kThreads, 0}, stream,
                  IndexVector::of(positions), ratio, T, K, indices.ptr<int32_t>(), indices.stride(0),
                  lens_ptr, lens_stride);
  }
}

}  // namespace dsv4::cuda

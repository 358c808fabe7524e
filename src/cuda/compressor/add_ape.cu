// compressor_project on CUDA, after its two GEMMs (dsv4::linear): the learned positional bias of
// the score, score_rows[t] += ape[positions[t] mod r], one block per token.
#include <cstdint>

#include "cuda/common/check.h"
#include "cuda/common/launch.cuh"
#include "cuda/compressor/compressor.h"
#include "cuda/compressor/device_views.cuh"

namespace dsv4::cuda {
namespace {

constexpr int kThreads = 256;

__global__ void __launch_bounds__(kThreads)
    add_ape_kernel(const float* ape, int64_t ape_stride, int ratio,
                   IndexVector positions, float* score, int64_t score_stride,
                   int64_t width) {
  grid_dependency_entry();
  const int64_t t = blockIdx.x;
  const int64_t pos = positions[t];
  float* s = score + t * score_stride;
  if (pos < 0) {  // not a position (the host does not read them on CUDA): make the row unusable
    for (int64_t c = threadIdx.x; c < width; c += blockDim.x) s[c] = __int_as_float(0x7fc00000);
    return;
  }
  const float* bias = ape + (pos % ratio) * ape_stride;
  // The CPU op's `s[c] += bias[c]`: one rounded add.
  for (int64_t c = threadIdx.x; c < width; c += blockDim.x)
    s[c] = ieee_add(s[c], bias[c]);
}

}  // namespace

void compressor_add_ape(const CompressorConfig& cfg, const TensorView& ape,
                        const TensorView& positions, const TensorView& score_rows, Stream stream) {
  constexpr const char* kOp = "compressor_project";
  const int64_t T = score_rows.size(0);
  if (T == 0) return;
  DSV4_CHECK(T <= INT32_MAX, kOp, ": T: expected <= 2^31 - 1 rows on CUDA, got ", T);
  launch_kernel(kOp, add_ape_kernel, {static_cast<unsigned>(T), kThreads, 0}, stream, ape.ptr<const float>(),
                ape.stride(0), cfg.ratio, IndexVector::of(positions), score_rows.ptr<float>(),
                score_rows.stride(0), cfg.proj_width());
}

}  // namespace dsv4::cuda

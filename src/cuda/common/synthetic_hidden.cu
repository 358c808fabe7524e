// synthetic_hidden on the GPU: one thread per element (grid-stride), the shared formula.
#include "cuda/common/synthetic_hidden.h"

#include <cuda_bf16.h>

#include <algorithm>

#include "cuda/common/check.h"
#include "cuda/common/launch.cuh"
#include "math/synthetic_hidden.h"

namespace dsv4::cuda {
namespace {

template <class Out>
__global__ void synthetic_hidden_kernel(const int64_t* req, const int64_t* pos, uint64_t seed,
                                        Out* out, int64_t T, int64_t dim, int64_t row_stride) {
  grid_dependency_entry();
  const int64_t n = T * dim;
  for (int64_t k = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; k < n;
       k += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    const int64_t t = k / dim, i = k % dim;
    const float v = synthetic_math::value(seed, req[t], pos[t], i);
    if constexpr (sizeof(Out) == 4) out[t * row_stride + i] = v;
    else out[t * row_stride + i] = __float2bfloat16_rn(v);
  }
}

}  // namespace

void synthetic_hidden(const TensorView& req_ids, const TensorView& positions, uint64_t seed,
                      const TensorView& out, Stream stream) {
  const int64_t T = out.shape[0], dim = out.shape[1];
  if (T == 0 || dim == 0) return;
  const LaunchShape shape{dim3(static_cast<unsigned>(std::min<int64_t>((T * dim + 255) / 256, 132 * 16))),
                          dim3(256)};
  if (out.dtype == DType::fp32)
    launch_kernel("synthetic_hidden", synthetic_hidden_kernel<float>, shape, stream, req_ids.ptr<int64_t>(),
                  positions.ptr<int64_t>(), seed, out.ptr<float>(), T, dim, out.strides[0]);
  else
    launch_kernel("synthetic_hidden", synthetic_hidden_kernel<__nv_bfloat16>, shape, stream,
                  req_ids.ptr<int64_t>(), positions.ptr<int64_t>(), seed, out.ptr<__nv_bfloat16>(), T, dim,
                  out.strides[0]);
}

}  // namespace dsv4::cuda

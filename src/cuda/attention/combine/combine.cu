// Split-KV combine kernel: one warp per (query row, head); each lane owns 16 of the 512 value
// dims (four float4 columns 128 apart, so every load instruction is coalesced). Splits are
// merged in index order by every lane alike: no atomics, bit-identical run to run.
#include "cuda/attention/combine/combine.h"

#include <cmath>

#include "cuda/common/check.h"
#include "cuda/common/fp8_convert.cuh"
#include "cuda/common/launch.cuh"

namespace dsv4::cuda::combine {
namespace {

constexpr int kDv = 512;
constexpr int kWarpsPerBlock = 4;

__global__ void __launch_bounds__(32 * kWarpsPerBlock) combine_kernel(const CombineParams p) {
  grid_dependency_entry();
  const int64_t row = static_cast<int64_t>(blockIdx.x) * kWarpsPerBlock + threadIdx.x / 32;
  if (row >= p.num_rows) return;
  const int lane = threadIdx.x % 32;
  const float* lse_in = p.partial_lse + row * p.num_splits;

  // (batch, seq, head) of this row, once per warp: out and lse may be strided views.
  const int64_t query_row = row / p.num_heads;
  const int64_t head = row - query_row * p.num_heads;
  const int64_t batch = query_row / p.s_q, seq = query_row - batch * p.s_q;
  uint16_t* out = p.out + batch * p.out_b_stride + seq * p.out_s_stride + head * p.out_h_stride;
  float* lse_out = p.lse + batch * p.lse_b_stride + seq * p.lse_s_stride + head * p.lse_h_stride;

  float m = -INFINITY;
  for (int s = 0; s < p.num_splits; ++s) m = fmaxf(m, lse_in[s]);
  if (m == -INFINITY) {  // no valid key in any split
#pragma unroll
    for (int i = 0; i < 4; ++i) {
      *reinterpret_cast<uint2*>(out + i * 128 + lane * 4) = make_uint2(0u, 0u);
    }
    if (lane == 0) *lse_out = INFINITY;
    return;
  }
  float sum = 0.0f;
  for (int s = 0; s < p.num_splits; ++s) sum += expf(lse_in[s] - m);
  const float lse = m + logf(sum);

  float4 acc[4];
#pragma unroll
  for (int i = 0; i < 4; ++i) acc[i] = make_float4(0.0f, 0.0f, 0.0f, 0.0f);
  for (int s = 0; s < p.num_splits; ++s) {
    const float w = expf(lse_in[s] - lse);  // empty split: exp(−inf) = 0
    if (w == 0.0f) continue;                // also skips an empty split's (zero) o
    const float* po = p.partial_o + (row * p.num_splits + s) * kDv + lane * 4;
#pragma unroll
    for (int i = 0; i < 4; ++i) {
      const float4 v = *reinterpret_cast<const float4*>(po + i * 128);
      acc[i].x += w * v.x;
      acc[i].y += w * v.y;
      acc[i].z += w * v.z;
      acc[i].w += w * v.w;
    }
  }
  // Sink σ: out · e^lse / (e^lse + e^σ) = out / (1 + e^(σ − lse)); σ = +inf → 0, −inf → 1.
  const float factor = p.sink != nullptr ? 1.0f / (1.0f + expf(p.sink[head] - lse)) : 1.0f;
#pragma unroll
  for (int i = 0; i < 4; ++i) {
    *reinterpret_cast<uint2*>(out + i * 128 + lane * 4) =
        make_uint2(pack_bf16x2(acc[i].x * factor, acc[i].y * factor),
                   pack_bf16x2(acc[i].z * factor, acc[i].w * factor));
  }
  if (lane == 0) *lse_out = lse;
}

}  // namespace

void launch_combine(const CombineParams& params, cudaStream_t stream) {
  if (params.num_rows == 0) return;
  const int64_t blocks = (params.num_rows + kWarpsPerBlock - 1) / kWarpsPerBlock;
  launch_kernel("sparse_attention_combine", combine_kernel,
                {static_cast<unsigned>(blocks), 32 * kWarpsPerBlock, 0}, stream, params);
}

}  // namespace dsv4::cuda::combine

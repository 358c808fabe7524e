// Split-KV combine kernel: one warp per (query row, head); each lane owns 16 of the 512 value
// dims (four float4 columns 128 apart, so every load instruction is coalesced). Splits are
// merged in index order by every lane alike: no atomics, bit-identical run to run.
//
// Its time is load latency, not bandwidth: a row's partials are a few KB, read once from L2. So
// the lanes read 32 splits' lse in one round trip (not one split after another), and a lane
// loads the partial o of kSplitsInFlight splits before it accumulates any. The arithmetic and its
// order are those of one loop over the splits (max, then the sum of exp in index order, then
// acc += w · o in index order), so the outputs do not depend on how the loads are grouped.
#include "cuda/attention/combine/combine.h"

#include <cmath>

#include "cuda/common/check.h"
#include "cuda/common/fp8_convert.cuh"
#include "cuda/common/launch.cuh"

namespace dsv4::cuda::combine {
namespace {

constexpr int kDv = 512;
constexpr int kWarpsPerBlock = 4;
constexpr int kSplitsInFlight = 4;  // splits whose o a lane has in flight at once (16 float4)

// The largest split lse of the row (−inf when every split is empty), lane s of each round
// loading split base + s.
__device__ __forceinline__ float max_split_lse(const float* lse_in, int num_splits, int lane) {
  float m = -INFINITY;
  for (int base = 0; base < num_splits; base += 32)
    if (base + lane < num_splits) m = fmaxf(m, lse_in[base + lane]);
#pragma unroll
  for (int offset = 16; offset >= 1; offset /= 2) m = fmaxf(m, __shfl_xor_sync(0xffffffffu, m, offset));
  return m;
}

// Σ_s exp(lse_s − m) in split order on every lane (the values pass by shuffle, the sum is the
// same sequence of additions as a loop over the splits).
__device__ __forceinline__ float sum_split_weights(const float* lse_in, int num_splits, float m, int lane) {
  float sum = 0.0f;
  for (int base = 0; base < num_splits; base += 32) {
    const float mine = base + lane < num_splits ? lse_in[base + lane] : -INFINITY;
    const int count = min(32, num_splits - base);
    for (int j = 0; j < count; ++j) sum += expf(__shfl_sync(0xffffffffu, mine, j) - m);
  }
  return sum;
}

// acc = Σ_s w_s · o_s over the splits in index order, w_s = exp(lse_s − lse); a split of weight
// 0 (empty, or far below the row's lse) is skipped, its o not read. The o of kSplitsInFlight
// splits is requested before any of them is accumulated.
__device__ __forceinline__ void accumulate_splits(const float* po_row, const float* lse_in, int num_splits,
                                                  float lse, int lane, float4 (&acc)[4]) {
#pragma unroll
  for (int i = 0; i < 4; ++i) acc[i] = make_float4(0.0f, 0.0f, 0.0f, 0.0f);
  for (int first = 0; first < num_splits; first += kSplitsInFlight) {
    float w[kSplitsInFlight];
    float4 v[kSplitsInFlight][4];
#pragma unroll
    for (int k = 0; k < kSplitsInFlight; ++k) {
      const int s = first + k;
      w[k] = s < num_splits ? expf(lse_in[s] - lse) : 0.0f;  // empty split: exp(−inf) = 0
      if (w[k] != 0.0f) {
        const float* po = po_row + static_cast<int64_t>(s) * kDv + lane * 4;
#pragma unroll
        for (int i = 0; i < 4; ++i) v[k][i] = *reinterpret_cast<const float4*>(po + i * 128);
      }
    }
#pragma unroll
    for (int k = 0; k < kSplitsInFlight; ++k) {
      if (w[k] == 0.0f) continue;
#pragma unroll
      for (int i = 0; i < 4; ++i) {
        acc[i].x += w[k] * v[k][i].x;
        acc[i].y += w[k] * v[k][i].y;
        acc[i].z += w[k] * v[k][i].z;
        acc[i].w += w[k] * v[k][i].w;
      }
    }
  }
}

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

  const float m = max_split_lse(lse_in, p.num_splits, lane);
  if (m == -INFINITY) {  // no valid key in any split
#pragma unroll
    for (int i = 0; i < 4; ++i) {
      *reinterpret_cast<uint2*>(out + i * 128 + lane * 4) = make_uint2(0u, 0u);
    }
    if (lane == 0) *lse_out = INFINITY;
    return;
  }
  const float lse = m + logf(sum_split_weights(lse_in, p.num_splits, m, lane));

  float4 acc[4];
  accumulate_splits(p.partial_o + row * p.num_splits * kDv, lse_in, p.num_splits, lse, lane, acc);
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

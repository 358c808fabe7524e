// Split-KV combine kernel: kWarpsPerRow warps per (query row, head), each lane owning
// kFloat4PerSplit float4 columns of the 512 value dims, 128 dims apart (so every warp load is 512
// contiguous bytes), and 128 threads a CTA. Splits are merged in index order by every lane alike: no atomics,
// bit-identical run to run.
//
// Its time is load latency, not bandwidth: a row's partials are a few KB, read once from L2, and
// at small batches the combine is a large share of a decode call (V4-Flash b 2: 3.7 of ~15 µs of
// GPU time, docs/notes/decode.md). So one round trip brings in both the splits' lse (32 a round,
// a split a lane) and a lane's 16 float4 of partial o (kSplitsInFlight splits): o is requested
// before its weights are known, and a split of weight 0 is skipped when accumulating (its o,
// read but unused, may hold anything). A launch of few rows spreads each over four warps (a
// float4 a lane, 16 splits a round trip); one of many rows keeps a warp per row (four float4 a
// lane, 4 splits), since four warps a row would not all fit on the SMs at once (b 16 s_q 1
// H 128's 2048 rows took 10 % longer that way). The arithmetic and its order are those of one
// loop over the splits (max, then the sum of exp in index order, then acc += w · o in index
// order), so the outputs do not depend on how the loads are grouped.
#include "cuda/attention/combine/combine.h"

#include <cmath>

#include "cuda/common/check.h"
#include "cuda/common/device_props.h"
#include "cuda/common/fp8_convert.cuh"
#include "cuda/common/launch.cuh"

namespace dsv4::cuda::combine {
namespace {

constexpr int kDv = 512;
constexpr int kThreadsPerCta = 128;
constexpr int kFloat4InFlight = 16;  // a lane's partial o loads in flight at once
// Rows (b · s_q · H) up to this many SMs' worth take four warps a row (above).
constexpr int kWideRowsPerSm = 2;

template <int kWarpsPerRow>
struct RowSpread {
  static constexpr int kFloat4PerSplit = kDv / (32 * kWarpsPerRow * 4);  // a lane's, of one split
  static constexpr int kSplitsInFlight = kFloat4InFlight / kFloat4PerSplit;
  static constexpr int kRowsPerCta = kThreadsPerCta / (32 * kWarpsPerRow);
};

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

// A lane's float4 columns of the partial o of splits first .. first + kSplitsInFlight − 1
// (those that exist), all requested before any is used. Column j is dims
// (j · kWarpsPerRow) · 128 past po_lane.
template <int kWarpsPerRow>
__device__ __forceinline__ void load_splits(const float* po_lane, int first, int num_splits,
                                            float4 (&v)[kFloat4InFlight]) {
  using Spread = RowSpread<kWarpsPerRow>;
#pragma unroll
  for (int k = 0; k < Spread::kSplitsInFlight; ++k)
    if (first + k < num_splits)
#pragma unroll
      for (int j = 0; j < Spread::kFloat4PerSplit; ++j)
        v[k * Spread::kFloat4PerSplit + j] = *reinterpret_cast<const float4*>(
            po_lane + static_cast<int64_t>(first + k) * kDv + j * kWarpsPerRow * 128);
}

// acc += w_s · o_s over the loaded splits in index order, w_s = exp(lse_s − lse); a split of
// weight 0 (empty, or far below the row's lse) adds nothing, whatever its o holds.
template <int kWarpsPerRow>
__device__ __forceinline__ void accumulate_splits(const float4 (&v)[kFloat4InFlight], const float* lse_in,
                                                  int first, int num_splits, float lse,
                                                  float4 (&acc)[RowSpread<kWarpsPerRow>::kFloat4PerSplit]) {
  using Spread = RowSpread<kWarpsPerRow>;
#pragma unroll
  for (int k = 0; k < Spread::kSplitsInFlight; ++k) {
    const int s = first + k;
    const float w = s < num_splits ? expf(lse_in[s] - lse) : 0.0f;  // empty split: exp(−inf) = 0
    if (w == 0.0f) continue;
#pragma unroll
    for (int j = 0; j < Spread::kFloat4PerSplit; ++j) {
      const float4& o = v[k * Spread::kFloat4PerSplit + j];
      acc[j].x += w * o.x;
      acc[j].y += w * o.y;
      acc[j].z += w * o.z;
      acc[j].w += w * o.w;
    }
  }
}

template <int kWarpsPerRow>
__global__ void __launch_bounds__(kThreadsPerCta) combine_kernel(const CombineParams p) {
  grid_dependency_entry();
  using Spread = RowSpread<kWarpsPerRow>;
  const int thread_in_row = threadIdx.x % (32 * kWarpsPerRow);
  const int64_t row = static_cast<int64_t>(blockIdx.x) * Spread::kRowsPerCta + threadIdx.x / (32 * kWarpsPerRow);
  if (row >= p.num_rows) return;
  const int lane = threadIdx.x % 32;
  // This lane's first value dim: warp w of the row owns columns w, w + kWarpsPerRow, ... of 128.
  const int dim = (thread_in_row / 32) * 128 + lane * 4;
  const float* lse_in = p.partial_lse + row * p.num_splits;
  const float* po_lane = p.partial_o + row * p.num_splits * kDv + dim;

  float4 v[kFloat4InFlight];
  load_splits<kWarpsPerRow>(po_lane, 0, p.num_splits, v);  // in flight beside the lse loads below

  // (batch, seq, head) of this row: out and lse may be strided views.
  const int64_t query_row = row / p.num_heads;
  const int64_t head = row - query_row * p.num_heads;
  const int64_t batch = query_row / p.s_q, seq = query_row - batch * p.s_q;
  uint16_t* out = p.out + batch * p.out_b_stride + seq * p.out_s_stride + head * p.out_h_stride + dim;
  float* lse_out = p.lse + batch * p.lse_b_stride + seq * p.lse_s_stride + head * p.lse_h_stride;

  const float m = max_split_lse(lse_in, p.num_splits, lane);
  if (m == -INFINITY) {  // no valid key in any split
#pragma unroll
    for (int j = 0; j < Spread::kFloat4PerSplit; ++j)
      *reinterpret_cast<uint2*>(out + j * kWarpsPerRow * 128) = make_uint2(0u, 0u);
    if (thread_in_row == 0) *lse_out = INFINITY;
    return;
  }
  const float lse = m + logf(sum_split_weights(lse_in, p.num_splits, m, lane));

  float4 acc[Spread::kFloat4PerSplit];
#pragma unroll
  for (int j = 0; j < Spread::kFloat4PerSplit; ++j) acc[j] = make_float4(0.0f, 0.0f, 0.0f, 0.0f);
  for (int first = 0;;) {
    accumulate_splits<kWarpsPerRow>(v, lse_in, first, p.num_splits, lse, acc);
    first += Spread::kSplitsInFlight;
    if (first >= p.num_splits) break;
    load_splits<kWarpsPerRow>(po_lane, first, p.num_splits, v);
  }
  // Sink σ: out · e^lse / (e^lse + e^σ) = out / (1 + e^(σ − lse)); σ = +inf → 0, −inf → 1.
  const float factor = p.sink != nullptr ? 1.0f / (1.0f + expf(p.sink[head] - lse)) : 1.0f;
#pragma unroll
  for (int j = 0; j < Spread::kFloat4PerSplit; ++j)
    *reinterpret_cast<uint2*>(out + j * kWarpsPerRow * 128) =
        make_uint2(pack_bf16x2(acc[j].x * factor, acc[j].y * factor), pack_bf16x2(acc[j].z * factor, acc[j].w * factor));
  if (thread_in_row == 0) *lse_out = lse;
}

template <int kWarpsPerRow>
void launch_spread(const CombineParams& params, cudaStream_t stream) {
  constexpr int kRows = RowSpread<kWarpsPerRow>::kRowsPerCta;
  const int64_t blocks = (params.num_rows + kRows - 1) / kRows;
  DSV4_CHECK(blocks <= 0x7fffffff, "sparse_attention_combine: ", params.num_rows,
             " rows (b · s_q · H) need more than the grid's 2^31 − 1 CTAs");
  launch_kernel("sparse_attention_combine", combine_kernel<kWarpsPerRow>,
                {static_cast<unsigned>(blocks), kThreadsPerCta, 0}, stream, params);
}

}  // namespace

void launch_combine(const CombineParams& params, cudaStream_t stream) {
  if (params.num_rows == 0) return;
  if (params.num_rows <= int64_t{kWideRowsPerSm} * current_device_sm_count("sparse_attention_combine")) {
    launch_spread<4>(params, stream);
  } else {
    launch_spread<1>(params, stream);
  }
}

}  // namespace dsv4::cuda::combine

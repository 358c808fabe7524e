// combine_topk_swa_indices on CUDA: one warp per token row. The warp finds its request by a
// binary search of query_start_loc, re-checks that request's metadata as the CPU reference does
// (an invalid request's rows become -1), packs its causal top-k entries in order (rounds of 32,
// ballot + popcount), appends its SWA window as workspace rows and pads with -1. Every write
// stays in the row's K + W entries; every read is inside the validated views.
#include "cuda/common/check.h"
#include "cuda/common/launch.cuh"
#include "cuda/index/indexing.h"
#include "cuda/index/warp_rows.cuh"
#include "math/index.h"

namespace dsv4::cuda {
namespace {

constexpr const char* kOp = "combine_topk_swa_indices";
using namespace index_rows;

struct CombineParams {
  const int32_t* topk;  // [T, K], row stride topk_stride; nullptr when K == 0
  int64_t topk_stride, k;
  const int32_t* query_start_loc;  // [R + 1], stride qsl_stride
  int64_t qsl_stride;
  const int32_t* seq_lens;  // [R], stride seq_stride
  int64_t seq_stride;
  const int32_t* gather_lens;  // [R], stride gather_stride
  int64_t gather_stride;
  int64_t requests, tokens, rows_per_request;
  int32_t* out;  // [T, K + window], row stride out_stride
  int64_t out_stride;
  int32_t* out_lens;  // [T], stride out_lens_stride
  int64_t out_lens_stride;
  int window, compressed_region, ratio;
};

__device__ __forceinline__ int64_t qsl_at(const CombineParams& p, int64_t i) {
  return p.query_start_loc[i * p.qsl_stride];
}

// Where token row t sits: its request and position, or valid == false for a row the CPU
// reference would reject (see indexing.h).
struct TokenPlace {
  bool valid;
  int64_t request, position, seq, gather;
};

__device__ TokenPlace place_token(const CombineParams& p, int64_t t) {
  TokenPlace place{false, 0, 0, 0, 0};
  if (p.requests == 0 || qsl_at(p, p.requests) - qsl_at(p, 0) != p.tokens) return place;
  const int64_t x = qsl_at(p, 0) + t;
  // The last request r with query_start_loc[r] <= x (unique when query_start_loc is
  // non-decreasing; any r in 0..R-1 otherwise, then checked below).
  int64_t lo = 0, hi = p.requests - 1;
  while (lo < hi) {
    const int64_t mid = (lo + hi + 1) / 2;
    if (qsl_at(p, mid) <= x) lo = mid;
    else hi = mid - 1;
  }
  const int64_t q0 = qsl_at(p, lo), q1 = qsl_at(p, lo + 1);
  if (x < q0 || x >= q1) return place;
  const int64_t seq = p.seq_lens[lo * p.seq_stride];
  const int64_t gather = p.gather_lens[lo * p.gather_stride];
  // The CPU reference's per-request checks: these make every row written below lie in
  // [r*M, r*M + N + gather) ⊆ [r*M, (r+1)*M).
  if (seq < q1 - q0 || gather < 0 || gather > seq ||
      p.compressed_region + gather > p.rows_per_request ||
      index_math::window_first(seq - (q1 - q0), p.window) < seq - gather)
    return place;
  return {true, lo, seq - (q1 - x), seq, gather};
}

__global__ void __launch_bounds__(kThreadsPerBlock) combine_kernel(const CombineParams p) {
  grid_dependency_entry();
  const int64_t t = warp_row();
  if (t >= p.tokens) return;
  const int lane = lane_id();
  const TokenPlace place = place_token(p, t);  // the same on every lane
  int32_t* out = p.out + t * p.out_stride;
  int count = 0;  // entries written; <= K + window < 2^31 (checked at launch)
  if (place.valid) {
    const int64_t row0 = place.request * p.rows_per_request;
    if (p.k > 0) {
      const int64_t visible = index_math::visible_compressed(place.position, p.ratio);
      const int32_t* sel = p.topk + t * p.topk_stride;
      for (int64_t k0 = 0; k0 < p.k; k0 += 32) {  // every lane runs every round
        const int64_t k = k0 + lane;
        const int64_t j = k < p.k ? sel[k] : -1;
        const bool keep = j >= 0 && j < p.compressed_region && j < visible;
        count = pack_round(keep, static_cast<int32_t>(keep ? row0 + j : -1), out, count);
      }
    }
    // SWA region: workspace row N + (q - (seq - gather)) of the request holds position q.
    const int64_t swa0 = row0 + p.compressed_region - (place.seq - place.gather);
    const int64_t first = index_math::window_first(place.position, p.window);
    const int64_t span = place.position - first + 1;  // 1..window
    for (int64_t k = lane; k < span; k += 32)
      out[count + k] = static_cast<int32_t>(swa0 + first + k);
    count += static_cast<int>(span);
  }
  for (int64_t k = count + lane; k < p.k + p.window; k += 32) out[k] = -1;
  if (lane == 0) p.out_lens[t * p.out_lens_stride] = count;
}

}  // namespace

void combine_topk_swa_indices(const TensorView& topk, const TensorView& query_start_loc,
                              const TensorView& seq_lens, const TensorView& gather_lens,
                              int window, int compressed_region, int64_t rows_per_request,
                              int ratio, const TensorView& out, const TensorView& out_lens,
                              Stream stream) {
  CombineParams p{};
  p.k = topk.defined() ? topk.shape[1] : 0;
  p.topk = p.k > 0 ? topk.ptr<const int32_t>() : nullptr;
  p.topk_stride = p.k > 0 ? topk.strides[0] : 0;
  p.query_start_loc = query_start_loc.ptr<const int32_t>();
  p.qsl_stride = query_start_loc.strides[0];
  p.seq_lens = seq_lens.ptr<const int32_t>();
  p.seq_stride = seq_lens.strides[0];
  p.gather_lens = gather_lens.ptr<const int32_t>();
  p.gather_stride = gather_lens.strides[0];
  p.requests = query_start_loc.shape[0] - 1;
  p.tokens = out.shape[0];
  p.rows_per_request = rows_per_request;
  p.out = out.ptr<int32_t>();
  p.out_stride = out.strides[0];
  p.out_lens = out_lens.ptr<int32_t>();
  p.out_lens_stride = out_lens.strides[0];
  p.window = window;
  p.compressed_region = compressed_region;
  p.ratio = ratio;
  DSV4_CHECK(p.k + window <= 2147483647, kOp, ": topk width ", p.k, " + window ", window,
             " exceeds the int32 length range");
  if (p.tokens == 0) return;
  launch_kernel(kOp, combine_kernel, {blocks_for(kOp, p.tokens), kThreadsPerBlock, 0}, stream, p);
}

}  // namespace dsv4::cuda

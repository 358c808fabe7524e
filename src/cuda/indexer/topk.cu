// CUDA top-k of the indexer (SPEC §5): one block per row, for any row length.
//
// Each candidate column j < visible gets the 64-bit key (topk_key(score) << 32) | j: ascending
// key order is the CPU's rank order (descending score, NaN last, ties → lower column), and keys
// are distinct. A radix select over the keys, 8 bits per pass from the top, finds the count-th
// smallest key (count = min(K, visible)) reading the row once per pass and stopping as soon as
// the bucket holding it is taken whole; the count selected keys are then gathered into shared
// memory (in any order: atomics) and sorted there (bitonic), which fixes the output order.
// Integer counts only: the result does not depend on scheduling.
#include <cstdint>

#include "cuda/common/check.h"
#include "cuda/common/index_vector.cuh"
#include "cuda/indexer/indexer.h"
#include "dsv4/indexer_math.h"

namespace dsv4::cuda {
namespace {

namespace im = indexer_math;
constexpr int kThreads = 512;
constexpr int kMaxK = 4096;  // shared memory of the final sort: kMaxK · 8 bytes
constexpr int kBins = 256;

struct TopkParams {
  const float* scores;  // [T, N], row stride
  int64_t scores_stride0, N;
  IndexVector positions;
  int ratio;
  int32_t* indices;  // [T, K], row stride
  int64_t indices_stride0;
  int K;
  int32_t* lens;  // [T] (stride lens_stride) or nullptr
  int64_t lens_stride;
};

__device__ __forceinline__ uint64_t rank_key(const float* row, int64_t j) {
  return (static_cast<uint64_t>(im::topk_key(row[j])) << 32) | static_cast<uint32_t>(j);
}

__global__ void __launch_bounds__(kThreads) topk_kernel(TopkParams p) {
  __shared__ uint32_t hist[kBins];
  __shared__ uint64_t sel[kMaxK];
  __shared__ uint64_t s_prefix, s_mask;
  __shared__ uint32_t s_remaining, s_done, s_fill;
  const int tid = threadIdx.x;
  const int64_t t = blockIdx.x;
  const float* row = p.scores + t * p.scores_stride0;
  const int64_t seen = im::visible_entries(p.positions[t], p.ratio);
  const int64_t visible = seen < p.N ? seen : p.N;
  const int count = static_cast<int>(visible < p.K ? visible : p.K);  // block-uniform

  // Selected: every key whose bits under `mask` are <= `prefix` (all of them when count ==
  // visible: mask = prefix = 0).
  uint64_t prefix = 0, mask = 0;
  if (count > 0 && count < visible) {
    if (tid == 0) s_remaining = static_cast<uint32_t>(count);
    for (int shift = 56; shift >= 0; shift -= 8) {
      for (int b = tid; b < kBins; b += kThreads) hist[b] = 0;
      __syncthreads();
      for (int64_t j = tid; j < visible; j += kThreads) {
        const uint64_t key = rank_key(row, j);
        if ((key & mask) == prefix) atomicAdd(&hist[(key >> shift) & 0xffu], 1u);
      }
      __syncthreads();
      if (tid == 0) {
        // The bucket holding the remaining-th smallest key of the current prefix.
        const uint32_t remaining = s_remaining;
        uint32_t below = 0;
        int digit = 0;
        while (digit < kBins - 1 && below + hist[digit] < remaining) below += hist[digit++];
        s_remaining = remaining - below;
        s_prefix = prefix | (static_cast<uint64_t>(digit) << shift);
        s_mask = mask | (uint64_t{0xff} << shift);
        s_done = hist[digit] == remaining - below;  // the bucket is taken whole
      }
      __syncthreads();
      prefix = s_prefix;
      mask = s_mask;
      // Keys are distinct, so at the last digit the bucket holds one key and s_done is set.
      if (s_done) break;  // block-uniform
    }
  }

  int32_t* out = p.indices + t * p.indices_stride0;
  if (count > 0) {
    if (tid == 0) s_fill = 0;
    __syncthreads();
    for (int64_t j = tid; j < visible; j += kThreads) {
      const uint64_t key = rank_key(row, j);
      if ((key & mask) <= prefix) {
        const uint32_t slot = atomicAdd(&s_fill, 1u);
        if (slot < static_cast<uint32_t>(count)) sel[slot] = key;  // exactly count are selected
      }
    }
    int n = 1;
    while (n < count) n *= 2;
    for (int i = count + tid; i < n; i += kThreads) sel[i] = ~uint64_t{0};
    __syncthreads();
    for (int size = 2; size <= n; size *= 2) {
      for (int stride = size / 2; stride > 0; stride /= 2) {
        for (int i = tid; i < n; i += kThreads) {
          const int partner = i ^ stride;
          if (partner > i) {
            const bool ascending = (i & size) == 0;
            const uint64_t a = sel[i], b = sel[partner];
            if ((a > b) == ascending) {
              sel[i] = b;
              sel[partner] = a;
            }
          }
        }
        __syncthreads();
      }
    }
  }
  for (int i = tid; i < p.K; i += kThreads)
    out[i] = i < count ? static_cast<int32_t>(sel[i] & 0xffffffffu) : -1;
  if (p.lens != nullptr && tid == 0) p.lens[t * p.lens_stride] = count;
}

}  // namespace

void indexer_topk(const TensorView& scores, const TensorView& positions, int ratio,
                  const TensorView& indices, const TensorView& lens, Stream stream) {
  constexpr const char* kOp = "indexer_topk";
  const int64_t T = scores.size(0), N = scores.size(1), K = indices.size(1);
  if (K > kMaxK) fail_expected(kOp, "indices.shape[1] (K) on CUDA", "<= 4096", K);
  if (N > 0x7fffffff) fail_expected(kOp, "scores.shape[1] on CUDA", "< 2^31", N);
  if (T == 0) return;
  DSV4_CHECK(T <= 0x7fffffff, kOp, ": T = ", T, " rows exceed one launch");

  TopkParams p;
  p.scores = scores.ptr<const float>();
  p.scores_stride0 = scores.stride(0);
  p.N = N;
  p.positions = IndexVector::of(positions);
  p.ratio = ratio;
  p.indices = indices.ptr<int32_t>();
  p.indices_stride0 = indices.stride(0);
  p.K = static_cast<int>(K);
  p.lens = lens.defined() ? lens.ptr<int32_t>() : nullptr;
  p.lens_stride = lens.defined() ? lens.stride(0) : 0;
  topk_kernel<<<static_cast<unsigned>(T), kThreads, 0, stream>>>(p);
  check_launch(kOp);
}

}  // namespace dsv4::cuda

// CUDA top-k of the indexer (docs/spec.md §5): one block per row, for any row length.
//
// Rank order: ascending 32-bit indexer_math::topk_key(score) (descending score, NaN last), ties →
// lower column. Per row, with visible = min((p+1) div r, N) and count = min(K, visible):
//   1. threshold (only when count < visible): a radix select over the keys, 11 + 11 + 10 bits from
//      the top, one pass over the row per digit (histogram in shared memory, warp-aggregated
//      increments: scores crowd into few buckets), stopping once the bucket holding the count-th
//      key is taken whole. Result: a masked prefix θ and `need`: every key whose masked bits are
//      < θ is selected, and the `need` lowest columns among those == θ.
//   2. compaction: one more pass, 4 consecutive columns per thread, a block scan of (below, equal)
//      counts gives each selected column its place in column order (no atomics, deterministic).
//      When count == visible (every visible column is selected: short prefill rows) steps 1–2 are
//      skipped and the row is read directly.
//   3. TopkOrder::score: a stable block radix sort (CUB) of the count keys with their columns,
//      over only the bits in which the selected keys differ; stable on column order = ties →
//      lower column. TopkOrder::column: no sort, the compaction's column order is stored as it is;
//      and when count == visible the row is 0, 1, …, count−1, so its scores are not read at all.
//      The order is one runtime flag of the launch (grid-uniform, so every branch on it is
//      block-uniform and the barriers inside stay legal): one kernel per shape serves both.
// Block shape by launch: 128 threads when there are many rows (>= kFewRows) of at most
// kWideRowColumns columns (a prefill: more rows in flight), 512 otherwise (a decode batch, long
// rows: more loads in flight per row); the sort capacity is the smallest of 512, 1024, 2048, 4096
// holding K.
#include <cub/block/block_radix_sort.cuh>
#include <cub/block/block_reduce.cuh>
#include <cub/block/block_scan.cuh>

#include <cstdint>

#include "cuda/common/check.h"
#include "cuda/common/index_vector.cuh"
#include "cuda/indexer/indexer.h"
#include "dsv4/indexer_math.h"

namespace dsv4::cuda {
namespace {

namespace im = indexer_math;
constexpr const char* kOp = "indexer_topk";
constexpr int kMaxK = 4096;
constexpr int64_t kWideRowColumns = 8192;
constexpr int64_t kFewRows = 512;
constexpr int kColumnsPerThread = 4;  // compaction: consecutive columns per thread per round
constexpr int kLoadsInFlight = 4;     // threshold passes: loads per thread before their increments
constexpr uint32_t kPadKey = 0xffffffffu;

// The radix select's digits, from the top: 11 + 11 + 10 bits.
constexpr int kPasses = 3;
__host__ __device__ constexpr int digit_shift(int pass) { return pass == 0 ? 21 : pass == 1 ? 10 : 0; }
__host__ __device__ constexpr int digit_bits(int pass) { return pass == 2 ? 10 : 11; }
constexpr int kMaxBins = 1 << 11;

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
  bool by_column;  // TopkOrder::column: the selection in ascending column order, unsorted
};

// Selected: keys whose bits under `mask` are < `prefix`, and the `need` lowest columns among
// those whose masked bits equal it.
struct Threshold {
  uint32_t prefix, mask, need;
};

template <int kThreads, int kCapacity>
struct Topk {
  static constexpr int kItems = kCapacity / kThreads;
  static_assert(kItems >= 1 && kCapacity % kThreads == 0, "capacity must be a multiple of the block");
  static_assert(kMaxBins % kThreads == 0 && (kMaxBins / 2) % kThreads == 0, "bins per thread");
  using Scan = cub::BlockScan<uint32_t, kThreads>;
  using Reduce = cub::BlockReduce<uint32_t, kThreads>;
  using Sort = cub::BlockRadixSort<uint32_t, kThreads, kItems, int32_t>;

  // Shared memory by phase (each phase ends with a barrier before the next one reuses it).
  struct Shared {
    union {
      uint32_t hist[kMaxBins];  // 1. threshold
      struct {
        uint32_t key[kCapacity];
        int32_t column[kCapacity];
      } selected;                            // 2. compaction
      typename Sort::TempStorage sort;       // 3. sort
    } phase;
    typename Scan::TempStorage scan;
    typename Reduce::TempStorage reduce;
    uint32_t digit, below, whole;  // a threshold pass's result, broadcast
    uint32_t differ;               // bits in which the selected keys differ, broadcast
  };

  // ---------------------------------------------------------------- 1. threshold
  __device__ static Threshold find_threshold(const float* row, int64_t visible, uint32_t count, Shared& sh) {
    const int tid = threadIdx.x, lane = tid % 32;
    uint32_t prefix = 0, mask = 0, remaining = count;
#pragma unroll 1
    for (int pass = 0; pass < kPasses; ++pass) {
      const int shift = digit_shift(pass), bins = 1 << digit_bits(pass);
      for (int b = tid; b < bins; b += kThreads) sh.phase.hist[b] = 0;
      __syncthreads();
      // Uniform trip count (whole warps): lanes past the row take part in the match as outsiders.
      // kLoadsInFlight coalesced loads first, then their increments (the shared atomics would
      // otherwise hold each next load back).
      for (int64_t base = 0; base < visible; base += int64_t{kThreads} * kLoadsInFlight) {
        uint32_t key[kLoadsInFlight];
#pragma unroll
        for (int u = 0; u < kLoadsInFlight; ++u) {
          const int64_t j = base + u * kThreads + tid;
          key[u] = j < visible ? im::topk_key(row[j]) : kPadKey;
        }
#pragma unroll
        for (int u = 0; u < kLoadsInFlight; ++u) {
          const bool in = base + u * kThreads + tid < visible && (key[u] & mask) == prefix;
          const uint32_t digit = (key[u] >> shift) & static_cast<uint32_t>(bins - 1);
          // Lanes with the same digit add together: one shared atomic per distinct digit.
          const uint32_t peers = __match_any_sync(0xffffffffu, in ? digit : kPadKey);
          if (in && lane == __ffs(peers) - 1) atomicAdd(&sh.phase.hist[digit], static_cast<uint32_t>(__popc(peers)));
        }
      }
      __syncthreads();
      // The bucket holding the remaining-th key: thread t owns bins [t·per, (t+1)·per).
      const int per = bins / kThreads;
      uint32_t mine = 0;
      for (int b = 0; b < per; ++b) mine += sh.phase.hist[tid * per + b];
      uint32_t before;
      Scan(sh.scan).ExclusiveSum(mine, before);
      if (before < remaining && remaining <= before + mine) {
        uint32_t below = before;
        int b = tid * per;
        while (below + sh.phase.hist[b] < remaining) below += sh.phase.hist[b++];
        sh.digit = static_cast<uint32_t>(b);
        sh.below = below;
        sh.whole = sh.phase.hist[b] == remaining - below;
      }
      __syncthreads();
      remaining -= sh.below;
      prefix |= sh.digit << shift;
      mask |= static_cast<uint32_t>(bins - 1) << shift;
      const bool whole = sh.whole;
      __syncthreads();  // sh.digit/below/whole, the histogram and the scan storage are reused
      if (whole) break;
    }
    return {prefix, mask, remaining};
  }

  // ---------------------------------------------------------------- 2. compaction
  // Every selected (key, column) into sh.phase.selected, in column order.
  __device__ static void compact(const float* row, int64_t visible, const Threshold& th, Shared& sh) {
    const int tid = threadIdx.x;
    uint32_t below_total = 0, equal_total = 0;  // over earlier rounds (block-uniform)
    for (int64_t base = 0; base < visible; base += int64_t{kThreads} * kColumnsPerThread) {
      const int64_t j0 = base + int64_t{tid} * kColumnsPerThread;
      uint32_t key[kColumnsPerThread];
      bool below[kColumnsPerThread], equal[kColumnsPerThread];
      uint32_t counts = 0;  // (equal << 16) | below: both <= kThreads · 4 < 2^16
#pragma unroll
      for (int v = 0; v < kColumnsPerThread; ++v) {
        const bool valid = j0 + v < visible;
        key[v] = valid ? im::topk_key(row[j0 + v]) : kPadKey;
        below[v] = valid && (key[v] & th.mask) < th.prefix;
        equal[v] = valid && (key[v] & th.mask) == th.prefix;
        counts += (static_cast<uint32_t>(equal[v]) << 16) | static_cast<uint32_t>(below[v]);
      }
      uint32_t before, round_total;
      Scan(sh.scan).ExclusiveSum(counts, before, round_total);
      uint32_t n_below = below_total + (before & 0xffffu), n_equal = equal_total + (before >> 16);
#pragma unroll
      for (int v = 0; v < kColumnsPerThread; ++v) {
        // Selected before this column: every "below" one and the first `need` "equal" ones.
        if (below[v] || (equal[v] && n_equal < th.need)) {
          const uint32_t slot = n_below + (n_equal < th.need ? n_equal : th.need);
          sh.phase.selected.key[slot] = key[v];
          sh.phase.selected.column[slot] = static_cast<int32_t>(j0 + v);
        }
        n_below += below[v];
        n_equal += equal[v];
      }
      below_total += round_total & 0xffffu;
      equal_total += round_total >> 16;
      __syncthreads();  // the scan storage is reused
    }
  }

  // ---------------------------------------------------------------- 3. sort and store
  __device__ static void sort_and_store(uint32_t (&key)[kItems], int32_t (&column)[kItems], int count,
                                        int32_t* out, int K, Shared& sh) {
    const int tid = threadIdx.x;
    // Sort only the bits in which the selected keys differ (float keys of one row share their
    // top bits): OR and AND of the keys, then the lowest and highest differing bit.
    uint32_t any = 0, all = 0xffffffffu;
#pragma unroll
    for (int k = 0; k < kItems; ++k)
      if (tid * kItems + k < count) {
        any |= key[k];
        all &= key[k];
      }
    any = Reduce(sh.reduce).Reduce(any, [](uint32_t a, uint32_t b) { return a | b; });
    __syncthreads();
    all = Reduce(sh.reduce).Reduce(all, [](uint32_t a, uint32_t b) { return a & b; });
    if (tid == 0) sh.differ = count > 1 ? any ^ all : 0u;  // the reductions' results live in thread 0
    __syncthreads();
    const uint32_t differ = sh.differ;
    if (differ != 0) {  // block-uniform
      const int begin_bit = __ffs(differ) - 1, end_bit = 32 - __clz(differ);
      Sort(sh.phase.sort).Sort(key, column, begin_bit, end_bit);  // stable: ties keep column order
    }
#pragma unroll
    for (int k = 0; k < kItems; ++k) {
      const int i = tid * kItems + k;
      if (i < K) out[i] = i < count ? column[k] : -1;
    }
  }

  // out[i] = column_of(i) for i < count, then −1 up to K: coalesced stores, the block striding.
  template <class ColumnOf>
  __device__ static void store_in_order(int32_t* out, int K, int count, ColumnOf column_of) {
    for (int i = threadIdx.x; i < K; i += kThreads) out[i] = i < count ? column_of(i) : -1;
  }

  __device__ static void run(const TopkParams& p, Shared& sh) {
    const int tid = threadIdx.x;
    const int64_t t = blockIdx.x;
    const float* row = p.scores + t * p.scores_stride0;
    const int64_t seen = im::visible_entries(p.positions[t], p.ratio);
    const int64_t visible = seen < p.N ? seen : p.N;
    const int count = static_cast<int>(visible < p.K ? visible : p.K);  // block-uniform
    int32_t* out = p.indices + t * p.indices_stride0;
    if (p.lens != nullptr && tid == 0) p.lens[t * p.lens_stride] = count;
    if (count == 0 || (p.by_column && count == visible)) {
      // The selection is columns 0 .. count−1 (none: nothing visible, or K = 0), already in column
      // order: no scores to read, no select, no sort.
      store_in_order(out, p.K, count, [](int i) { return static_cast<int32_t>(i); });
      return;
    }
    uint32_t key[kItems];
    int32_t column[kItems];
    if (count == visible) {
      // Everything visible is selected: read it in column order, straight into the sort's items.
#pragma unroll
      for (int k = 0; k < kItems; ++k) {
        const int i = tid * kItems + k;
        key[k] = i < count ? im::topk_key(row[i]) : kPadKey;
        column[k] = i;
      }
    } else {
      const Threshold th = find_threshold(row, visible, static_cast<uint32_t>(count), sh);
      compact(row, visible, th, sh);  // ends with a barrier: the whole selection is visible
      if (p.by_column) {
        store_in_order(out, p.K, count, [&sh](int i) { return sh.phase.selected.column[i]; });
        return;
      }
#pragma unroll
      for (int k = 0; k < kItems; ++k) {
        const int i = tid * kItems + k;
        key[k] = i < count ? sh.phase.selected.key[i] : kPadKey;
        column[k] = i < count ? sh.phase.selected.column[i] : -1;
      }
      __syncthreads();  // the sort's storage overlays the selection
    }
    sort_and_store(key, column, count, out, p.K, sh);
  }
};

template <int kThreads, int kCapacity>
__global__ void __launch_bounds__(kThreads) topk_kernel(TopkParams p) {
  using Kernel = Topk<kThreads, kCapacity>;
  __shared__ typename Kernel::Shared sh;
  Kernel::run(p, sh);
}

template <int kThreads, int kCapacity>
void launch(const TopkParams& p, int64_t T, cudaStream_t stream) {
  topk_kernel<kThreads, kCapacity><<<static_cast<unsigned>(T), kThreads, 0, stream>>>(p);
}

}  // namespace

void indexer_topk(const TensorView& scores, const TensorView& positions, int ratio,
                  const TensorView& indices, const TensorView& lens, Stream stream,
                  TopkOrder order) {
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
  p.by_column = order == TopkOrder::column;
  // Few rows (a decode batch) cannot fill the GPU with 128-thread blocks: give each row more.
  const bool wide = N > kWideRowColumns || K > 2048 || T < kFewRows;
  const cudaStream_t s = stream;
  if (!wide) {
    if (K <= 512) launch<128, 512>(p, T, s);
    else if (K <= 1024) launch<128, 1024>(p, T, s);
    else launch<128, 2048>(p, T, s);
  } else {
    if (K <= 512) launch<512, 512>(p, T, s);
    else if (K <= 1024) launch<512, 1024>(p, T, s);
    else if (K <= 2048) launch<512, 2048>(p, T, s);
    else launch<512, 4096>(p, T, s);
  }
  check_launch(kOp);
}

}  // namespace dsv4::cuda

// CUDA top-k of the indexer (docs/spec.md §5): one block per row, for any row length.
//
// Rank order: ascending 32-bit indexer_math::topk_key(score) (descending score, NaN last), ties →
// lower column. Per row, with visible = min((p+1) div r, N) and count = min(K, visible):
//   0. the keys (only when count < visible): a row of at most kCachedColumns visible entries is
//      read from global memory once, coalesced (thread t holds columns u·threads + t, all its
//      loads in flight before their conversions), and kept in registers as keys for every pass
//      below; a longer row is streamed from global memory again by each pass, kLoadsInFlight
//      loads per thread at a time. Both are one `RowKeys` source (tiles of columns in the same
//      striped layout), so the passes are written once.
//   1. threshold: a radix select over the keys, 11 + 11 + 10 bits from the top, one pass over
//      the keys per digit (histogram in shared memory, warp-aggregated increments: scores crowd
//      into few buckets; a warp with no key in the current bucket skips the step), stopping once
//      the bucket holding the count-th key is taken whole. Result: a masked prefix θ and `need`:
//      every key whose masked bits are < θ is selected, and the `need` lowest columns among
//      those == θ.
//   2. compaction: one more pass; per tile, warp ballots of (below, equal) in column order, one
//      block scan of the per-warp counts, and each selected column lands at its rank in column
//      order (no atomics, deterministic).
//      The tiles' padding past `visible` (key kPadKey, which is also a NaN's key) is never counted
//      and no key's column is tested: in 1 its histogram bin starts at −padding, in 2 it is never
//      below θ and comes after every visible column, so it is never among the `need`.
//      When count == visible (every visible column is selected: short prefill rows) steps 0–2 are
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
// holding K. The register cache (kCachedColumns) is 24 keys a thread for 128 threads (3072
// columns), 8 for 512 (4096 columns): see cached_keys_per_thread.
#include <cub/block/block_radix_sort.cuh>
#include <cub/block/block_reduce.cuh>
#include <cub/block/block_scan.cuh>

#include <cstdint>

#include "cuda/common/check.h"
#include "cuda/common/index_vector.cuh"
#include "cuda/common/launch.cuh"
#include "cuda/indexer/indexer.h"
#include "dsv4/indexer_math.h"

namespace dsv4::cuda {
namespace {

namespace im = indexer_math;
constexpr const char* kOp = "indexer_topk";
constexpr int kMaxK = 4096;
constexpr int64_t kWideRowColumns = 8192;
constexpr int64_t kFewRows = 512;
// Keys a thread holds of a row that fits the block's registers (the row then is read once):
// 128 threads × 24 = 3072 columns (a V4-Flash prefill row, N = 3072, fits whole; 32 keys a thread
// would take the kernel to 72 registers, 7 blocks an SM where 10 ran before, 24 keeps it at 56 and
// 9), 512 × 8 = 4096 (these launches stay within 64 registers: 2 blocks an SM, as before).
__host__ __device__ constexpr int cached_keys_per_thread(int threads) { return threads == 128 ? 24 : 8; }
constexpr int kLoadsInFlight = 4;  // streamed rows: loads per thread before their keys are used
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

// Thread threadIdx.x's keys of the columns base + u·kThreads + threadIdx.x (u < kRounds; kPadKey
// past `visible`): every load issued before the first conversion, so kRounds are in flight.
template <int kThreads, int kRounds>
__device__ __forceinline__ void load_keys(const float* row, int64_t visible, int64_t base, uint32_t (&key)[kRounds]) {
  float score[kRounds];
#pragma unroll
  for (int u = 0; u < kRounds; ++u) {
    const int64_t j = base + u * kThreads + threadIdx.x;
    score[u] = j < visible ? row[j] : 0.0f;
  }
#pragma unroll
  for (int u = 0; u < kRounds; ++u)
    key[u] = base + u * kThreads + threadIdx.x < visible ? im::topk_key(score[u]) : kPadKey;
}

// A row's keys as the passes see them (RowKeys): for_each_tile(visit) calls visit(base, key) for
// tiles of kRounds · kThreads columns from base, thread t holding key[u] of column
// base + u·kThreads + t (coalesced; column order is u-major, then thread), and `padding` keys
// kPadKey past `visible` at the end. Every thread makes the same calls (the passes' barriers and
// warp votes are inside).
//
// A row that fits the block's registers: read once, when made; one tile.
template <int kThreads>
struct CachedRowKeys {
  static constexpr int kRounds = cached_keys_per_thread(kThreads);
  static constexpr int kColumns = kRounds * kThreads;
  int64_t visible;  // <= kColumns
  uint32_t key[kRounds];

  __device__ __forceinline__ uint32_t padding() const { return static_cast<uint32_t>(kColumns - visible); }
  __device__ __forceinline__ CachedRowKeys(const float* row, int64_t visible_) : visible(visible_) {
    load_keys<kThreads>(row, visible, 0, key);
  }
  template <class Visit>
  __device__ __forceinline__ void for_each_tile(Visit&& visit) const {
    visit(int64_t{0}, key);
  }
};

// A longer row: read from global memory again by each pass, kLoadsInFlight columns a thread a tile.
template <int kThreads>
struct StreamedRowKeys {
  static constexpr int kRounds = kLoadsInFlight;
  int64_t visible;
  const float* row;

  __device__ __forceinline__ uint32_t padding() const {
    constexpr int64_t kTile = int64_t{kThreads} * kRounds;
    return static_cast<uint32_t>((visible + kTile - 1) / kTile * kTile - visible);
  }
  template <class Visit>
  __device__ __forceinline__ void for_each_tile(Visit&& visit) const {
    for (int64_t base = 0; base < visible; base += int64_t{kThreads} * kRounds) {
      uint32_t key[kRounds];
      load_keys<kThreads>(row, visible, base, key);
      visit(base, key);
    }
  }
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
  static constexpr int kWarps = kThreads / 32;
  // The compaction's per-warp counts of one tile: kRounds · kWarps, one a thread in its scan.
  static constexpr int kCachedColumns = CachedRowKeys<kThreads>::kColumns;
  static constexpr int kTileCounts = (kCachedColumns > kLoadsInFlight * kThreads ? kCachedColumns : kLoadsInFlight * kThreads) / 32;
  static_assert(kTileCounts <= kThreads, "the compaction scans a tile's counts one a thread");
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
    uint32_t tile_counts[kTileCounts];  // 2. compaction: (equal << 16) | below per (round, warp)
    uint32_t digit, below, whole;  // a threshold pass's result, broadcast
    uint32_t differ;               // bits in which the selected keys differ, broadcast
  };

  // ---------------------------------------------------------------- 1. threshold
  template <class RowKeys>
  __device__ __forceinline__ static Threshold find_threshold(const RowKeys& keys, uint32_t count, Shared& sh) {
    const int tid = threadIdx.x, lane = tid % 32;
    const uint32_t padding = keys.padding();
    uint32_t prefix = 0, mask = 0, remaining = count;
#pragma unroll 1
    for (int pass = 0; pass < kPasses; ++pass) {
      const int shift = digit_shift(pass), bins = 1 << digit_bits(pass);
      // The padding keys (kPadKey: every digit all ones) fall in the bucket's last bin whenever the
      // bucket holds them (prefix == mask); that bin starts at −padding (mod 2^32) so they are
      // never counted, and no key needs a test of its column.
      const uint32_t last_bin_start = prefix == mask ? 0u - padding : 0u;
      for (int b = tid; b < bins; b += kThreads) sh.phase.hist[b] = b == bins - 1 ? last_bin_start : 0u;
      __syncthreads();
      keys.for_each_tile([&](int64_t, const uint32_t(&key)[RowKeys::kRounds]) {
#pragma unroll
        for (int u = 0; u < RowKeys::kRounds; ++u) {
          const bool in = (key[u] & mask) == prefix;
          if (__ballot_sync(0xffffffffu, in) == 0u) continue;  // warp-uniform: no key in the bucket
          const uint32_t digit = (key[u] >> shift) & static_cast<uint32_t>(bins - 1);
          // Lanes with the same digit add together: one shared atomic per distinct digit.
          const uint32_t peers = __match_any_sync(0xffffffffu, in ? digit : kPadKey);
          if (in && lane == __ffs(peers) - 1) atomicAdd(&sh.phase.hist[digit], static_cast<uint32_t>(__popc(peers)));
        }
      });
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
  // Every selected (key, column) into sh.phase.selected, in column order; ends with a barrier.
  template <class RowKeys>
  __device__ __forceinline__ static void compact(const RowKeys& keys, const Threshold& th, Shared& sh) {
    constexpr int kRounds = RowKeys::kRounds;
    static_assert(kRounds * kWarps <= kTileCounts, "a tile's per-warp counts");
    const int tid = threadIdx.x, lane = tid % 32, warp = tid / 32;
    const uint32_t lanes_before = (1u << lane) - 1u;  // lanes of lower columns in the warp
    uint32_t below_total = 0, equal_total = 0;      // over earlier tiles (block-uniform)
    keys.for_each_tile([&](int64_t base, const uint32_t(&key)[kRounds]) {
      // The warp's columns of round u (32 consecutive ones) below / equal to the threshold. A
      // padding key is never below (its masked bits are the mask, >= prefix) and, when equal, comes
      // after every visible column: `need` is at most the visible equal ones, so it is never taken.
      const auto vote = [&](int u, uint32_t& below, uint32_t& equal) {
        const uint32_t masked = key[u] & th.mask;
        below = __ballot_sync(0xffffffffu, masked < th.prefix);
        equal = __ballot_sync(0xffffffffu, masked == th.prefix);
      };
      // Counts per (round, warp) — column order — as (equal << 16) | below: both <= 4096 < 2^16.
#pragma unroll
      for (int u = 0; u < kRounds; ++u) {
        uint32_t below, equal;
        vote(u, below, equal);
        if (lane == 0) sh.tile_counts[u * kWarps + warp] = (static_cast<uint32_t>(__popc(equal)) << 16) | __popc(below);
      }
      __syncthreads();
      // Their exclusive prefix: thread i reads and rewrites entry i only.
      const bool owner = tid < kRounds * kWarps;
      uint32_t before, tile_total;
      Scan(sh.scan).ExclusiveSum(owner ? sh.tile_counts[tid] : 0u, before, tile_total);
      if (owner) sh.tile_counts[tid] = before;
      __syncthreads();
#pragma unroll
      for (int u = 0; u < kRounds; ++u) {
        uint32_t below, equal;
        vote(u, below, equal);
        const uint32_t counted = sh.tile_counts[u * kWarps + warp];
        const uint32_t n_below = below_total + (counted & 0xffffu) + __popc(below & lanes_before);
        const uint32_t n_equal = equal_total + (counted >> 16) + __popc(equal & lanes_before);
        // Selected before this column: every "below" one and the first `need` "equal" ones.
        const bool is_below = (below >> lane) & 1u, is_equal = (equal >> lane) & 1u;
        if (is_below || (is_equal && n_equal < th.need)) {
          const uint32_t slot = n_below + (n_equal < th.need ? n_equal : th.need);
          sh.phase.selected.key[slot] = key[u];
          sh.phase.selected.column[slot] = static_cast<int32_t>(base + u * kThreads + tid);
        }
      }
      below_total += tile_total & 0xffffu;
      equal_total += tile_total >> 16;
      __syncthreads();  // the tile counts and the scan storage are reused; the selection is whole
    });
  }

  template <class RowKeys>
  __device__ __forceinline__ static void select(const RowKeys& keys, uint32_t count, Shared& sh) {
    compact(keys, find_threshold(keys, count, sh), sh);
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
      // The branch is block-uniform; either way ends with a barrier: the whole selection is visible.
      if (visible <= kCachedColumns) select(CachedRowKeys<kThreads>(row, visible), count, sh);
      else select(StreamedRowKeys<kThreads>{visible, row}, count, sh);
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
  grid_dependency_entry();
  using Kernel = Topk<kThreads, kCapacity>;
  __shared__ typename Kernel::Shared sh;
  Kernel::run(p, sh);
}

template <int kThreads, int kCapacity>
void launch(const TopkParams& p, int64_t T, cudaStream_t stream) {
  launch_kernel(kOp, topk_kernel<kThreads, kCapacity>, {static_cast<unsigned>(T), kThreads, 0}, stream, p);
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
}

}  // namespace dsv4::cuda

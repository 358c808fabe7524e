// The FP8 tensor-core scores kernel of the C4A indexer (sm_90a). See config.h for the work split.
//
// Per CTA (kTokens consecutive tokens × one chunk of key tiles):
//   setup    — thread 0 builds the token plan (visible counts, requests grouped into segments,
//              tiles per segment); the math warpgroup turns weights and q_scale into one factor
//              per (token, head) column.
//   producer — Q of the kTokens tokens (heads padded with zero rows) into the B operand, then for
//              every (segment, tile): wait for a free stage, gather the tile's 64 key rows through
//              the block table (cp.async, rows of unmapped blocks zero-filled) and their scales
//              (NaN for an unmapped key), arrive on the stage's `full` barrier. When every tile
//              lies in one block (the usual layout) that is one table read per tile, made a tile
//              ahead; otherwise one per key.
//   math     — per tile: C = K̂·Q̂ᵀ (wgmma m64 n{kCols} k32 × 4, fp32 accumulators), release the
//              stage, then per key row: score = k_scale · Σ_h (w_h · q_scale_h) · ReLU(C[key, h])
//              for each token of the segment (in-thread FMAs over the thread's head columns, then
//              a quad reduce-scatter: each thread stores the (token, row) scores it owns), −inf
//              past the token's visible count.
// ReLU commutes with the positive power-of-two scales, so applying q_scale·k_scale after it is
// the CPU's w · ReLU(dot · q_scale · k_scale) up to rounding order (indexer.h states the bound).
#pragma once

#include <cuda_runtime.h>

#include <cmath>
#include <cstdint>

#include "cuda/common/check.h"
#include "cuda/common/launch.cuh"
#include "cuda/common/per_device_once.h"
#include "cuda/common/ptx.cuh"
#include "cuda/common/smem_layout.cuh"
#include "cuda/common/wgmma.cuh"
#include "cuda/indexer/scores/config.h"
#include "dsv4/indexer_key_cache.h"
#include "dsv4/indexer_math.h"

#if !defined(DSV4_HAVE_CUTLASS)
#error "the indexer scores kernel needs CuTe (third_party/cutlass)"
#endif

namespace dsv4::cuda::indexer_scores_detail {

// C[64 keys, kCols] += K̂ · Q̂ᵀ, both fp8 e4m3 K-major in shared memory, fp32 accumulators.
template <int kCols>
using MmaScores = decltype(cute::make_tiled_mma(
    cute::GMMA::ss_op_selector<fp8_e4m3_t, fp8_e4m3_t, float,
                               cute::Shape<cute::Int<kTileKeys>, cute::Int<kCols>, cute::_32>>()));

// The scale a gathered key row gets when it has no key (request out of range, block unmapped):
// its score becomes NaN, as the op documents. Globals (fp32 NaN bits, four for a 16-byte copy)
// so cp.async can copy them like real scales.
__device__ const uint4 kMissingKeyScales = {0x7fc00000u, 0x7fc00000u, 0x7fc00000u, 0x7fc00000u};

// ReLU that keeps NaN (max.NaN), as indexer_math::head_term does.
__device__ __forceinline__ float relu_keep_nan(float x) {
  float y;
  asm("max.NaN.f32 %0, %1, 0f00000000;" : "=f"(y) : "f"(x));
  return y;
}

// The block of key entry j of request `req`, or nullptr when the request row or the block is out
// of range.
__device__ __forceinline__ const uint8_t* key_block(const Params& p, int64_t req, int64_t j) {
  if (req < 0) return nullptr;
  const int64_t k = j / p.block_size;
  if (k >= p.max_blocks) return nullptr;
  const int32_t b = __ldg(p.table + req * p.table_stride0 + k * p.table_stride1);
  if (b < 0 || b >= p.num_key_blocks) return nullptr;
  return p.keys + b * p.key_stride0;
}

// ---------------------------------------------------------------- setup (thread 0)
// The CTA's tokens (heaviest group first: later tokens of a prefill see more keys, and the
// scheduler starts the long CTAs before the short ones), grouped by request into segments.
template <int kTokens>
__device__ void build_token_plan(const Params& p, TokenPlan<kTokens>& plan) {
  const int64_t group = static_cast<int64_t>(gridDim.x) - 1 - blockIdx.x;
  plan.chunk_begin = static_cast<int64_t>(blockIdx.y) * p.chunk_tiles * kTileKeys;
  const int64_t chunk_end = plan.chunk_begin + static_cast<int64_t>(p.chunk_tiles) * kTileKeys;
  plan.chunk_end = chunk_end < p.N ? chunk_end : p.N;
  // All index reads first (independent loads in flight together), then the grouping.
  int64_t position[kTokens], request[kTokens];
#pragma unroll
  for (int tau = 0; tau < kTokens; ++tau) {
    const int64_t t = group * kTokens + tau;
    position[tau] = t < p.num_tokens ? p.positions[t] : -1;
    request[tau] = t < p.num_tokens ? p.token_to_req[t] : -1;
  }
  int64_t limit[kTokens];  // per segment: the largest visible count of its tokens
  plan.num_segments = 0;
#pragma unroll
  for (int tau = 0; tau < kTokens; ++tau) {
    const int64_t t = group * kTokens + tau;
    plan.token[tau] = -1;
    plan.segment[tau] = -1;
    plan.visible[tau] = 0;
    if (t >= p.num_tokens) continue;
    const int64_t seen = indexer_math::visible_entries(position[tau], p.ratio);
    const int64_t visible = seen < p.N ? seen : p.N;
    int64_t req = request[tau];
    if (req < 0 || req >= p.num_requests) req = -1;  // every key of the token scores NaN
    int s = 0;
    while (s < plan.num_segments && plan.request[s] != req) ++s;
    if (s == plan.num_segments) {
      plan.request[s] = req;
      limit[s] = 0;
      ++plan.num_segments;
    }
    limit[s] = visible > limit[s] ? visible : limit[s];
    plan.token[tau] = t;
    plan.segment[tau] = s;
    plan.visible[tau] = visible;
  }
  plan.total_tiles = 0;
  for (int s = 0; s < plan.num_segments; ++s) {
    const int64_t end = limit[s] < plan.chunk_end ? limit[s] : plan.chunk_end;
    plan.limit[s] = end;
    plan.tiles[s] = end > plan.chunk_begin ? static_cast<int>((end - plan.chunk_begin + kTileKeys - 1) / kTileKeys) : 0;
    plan.total_tiles += plan.tiles[s];
  }
}

// ---------------------------------------------------------------- producer (one warp)
// Copies one 128-byte row into row `row` of a K-major SW128 fp8 tile of kRows rows: 16-byte
// chunks (lane % 8 of four rows per instruction) or 4-byte words (one row per instruction).
// `src` null: the row is zero-filled and nothing is read.
template <int kRows>
__device__ __forceinline__ void copy_row_chunk16(uint8_t* tile, int row, int chunk, const uint8_t* src,
                                                 const uint8_t* any_global) {
  ptx::cp_async_16_zfill(tile + sw128_chunk_offset<kRows>(row, chunk), src != nullptr ? src + chunk * 16 : any_global,
                         src != nullptr);
}
template <int kRows>
__device__ __forceinline__ void copy_row_word(uint8_t* tile, int row, int word, const uint8_t* src,
                                              const uint8_t* any_global) {
  ptx::cp_async_4_zfill(tile + sw128_chunk_offset<kRows>(row, word / 4) + (word % 4) * 4,
                        src != nullptr ? src + word * 4 : any_global, src != nullptr);
}

// Gathers kRows rows whose sources `row_src(r)` are resolved per lane: with 16-byte copies lane
// l moves chunk l % 8 of rows l / 8, l / 8 + 4, ... (a warp instruction covers four whole rows).
template <int kRows, class RowSrc>
__device__ __forceinline__ void gather_rows(uint8_t* tile, bool chunk16, int lane, const uint8_t* any_global,
                                            RowSrc&& row_src) {
  if (chunk16) {
#pragma unroll 4
    for (int r = lane / 8; r < kRows; r += 4) copy_row_chunk16<kRows>(tile, r, lane % 8, row_src(r), any_global);
  } else {
#pragma unroll 4
    for (int r = 0; r < kRows; ++r) copy_row_word<kRows>(tile, r, lane, row_src(r), any_global);
  }
}

// Key tiles, general layout: lane l resolves keys j0 + l and j0 + l + 32 through the block table
// (a tile may span blocks), the others get the row addresses by shuffle.
template <class Plan>
__device__ void produce_row_tiles(const Params& p, Plan& sp, int lane) {
  const auto& plan = sp.plan;
  int it = 0;
  for (int s = 0; s < plan.num_segments; ++s) {
    const int64_t req = plan.request[s], limit = plan.limit[s];
    for (int k = 0; k < plan.tiles[s]; ++k, ++it) {
      const int stage = it % kStages;
      if (it >= kStages) ptx::mbarrier_wait(&sp.empty[stage], ((it / kStages) - 1) & 1);
      const int64_t j0 = plan.chunk_begin + static_cast<int64_t>(k) * kTileKeys;
      const uint8_t* row_of_lane[2];
      const float* scale_of_lane[2];
#pragma unroll
      for (int half = 0; half < 2; ++half) {
        const int64_t j = j0 + lane + 32 * half;
        const uint8_t* block = j < limit ? key_block(p, req, j) : nullptr;
        const int off = static_cast<int>(j % p.block_size);
        row_of_lane[half] = block != nullptr ? indexer_key_codes(block, off) : nullptr;
        scale_of_lane[half] = block != nullptr ? reinterpret_cast<const float*>(
                                                     block + indexer_key_scale_offset(p.block_size, off))
                                               : reinterpret_cast<const float*>(&kMissingKeyScales);
        ptx::cp_async_4_zfill(&sp.key_scale[stage][lane + 32 * half], scale_of_lane[half], true);
      }
      gather_rows<kTileKeys>(sp.keys[stage], p.key_rows_16, lane, p.keys, [&](int row) {
        const auto mine = reinterpret_cast<uintptr_t>(row < 32 ? row_of_lane[0] : row_of_lane[1]);
        return reinterpret_cast<const uint8_t*>(__shfl_sync(0xffffffffu, static_cast<unsigned long long>(mine), row % 32));
      });
      ptx::cp_async_arrive_noinc(&sp.full[stage]);
    }
  }
}

// The block-table entry holding key tile `tile` of segment `s` (its keys [j0, j0 + 64) lie in one
// block: p.tiles_in_block), or −1 when the request row or the block index is out of range.
template <class TokenPlanT>
__device__ __forceinline__ int32_t tile_block_entry(const Params& p, const TokenPlanT& plan, int s, int tile) {
  const int64_t req = plan.request[s];
  const uint32_t tile_in_row = static_cast<uint32_t>(plan.chunk_begin / kTileKeys) + tile;
  const int64_t k = p.tiles_in_block.div(tile_in_row);
  if (req < 0 || k >= p.max_blocks) return -1;
  return __ldg(p.table + req * p.table_stride0 + k * p.table_stride1);
}

// Key tiles when each lies in one cache block (block_size a multiple of 64, rows 16-byte aligned:
// the usual layout): one table read per tile, issued a tile ahead so that its latency passes
// while the previous tile is copied, and each lane's sixteen 16-byte chunks (chunk l % 8 of rows
// l / 8 + 4i) and the 64 scales (lanes 0-15, 16 bytes each) at fixed offsets from the block.
// Rows past the segment's limit are copied too (same block): every score there is masked −inf.
template <class Plan>
__device__ void produce_block_tiles(const Params& p, Plan& sp, int lane) {
  const auto& plan = sp.plan;
  int s = 0, tile = 0;  // the (segment, tile) being copied, in the math warpgroup's order
  auto skip_empty_segments = [&] {
    while (s < plan.num_segments && tile >= plan.tiles[s]) {
      ++s;
      tile = 0;
    }
  };
  skip_empty_segments();
  int32_t next_entry = tile_block_entry(p, plan, s, tile);
  for (int it = 0; it < plan.total_tiles; ++it) {
    const int32_t entry = next_entry;
    const uint32_t tile_in_row = static_cast<uint32_t>(plan.chunk_begin / kTileKeys) + tile;
    ++tile;
    skip_empty_segments();
    if (it + 1 < plan.total_tiles) next_entry = tile_block_entry(p, plan, s, tile);
    const int stage = it % kStages;
    if (it >= kStages) ptx::mbarrier_wait(&sp.empty[stage], ((it / kStages) - 1) & 1);
    const bool mapped = entry >= 0 && entry < p.num_key_blocks;
    const uint8_t* block = p.keys + (mapped ? entry * p.key_stride0 : 0);
    const int off0 = static_cast<int>(tile_in_row - p.tiles_in_block.div(tile_in_row) * p.tiles_in_block.divisor) *
                     kTileKeys;
    const uint8_t* rows = block + indexer_key_data_offset(off0);
#pragma unroll
    for (int i = 0; i < kTileKeys / 4; ++i) {
      const int row = lane / 8 + 4 * i, chunk = lane % 8;
      ptx::cp_async_16_zfill(sp.keys[stage] + sw128_chunk_offset<kTileKeys>(row, chunk),
                             rows + row * kDim + chunk * 16, mapped);
    }
    if (lane < kTileKeys / 4) {
      const uint8_t* scales = mapped ? block + indexer_key_scale_offset(p.block_size, off0) + lane * 16
                                     : reinterpret_cast<const uint8_t*>(&kMissingKeyScales);
      ptx::cp_async_16(&sp.key_scale[stage][4 * lane], scales);
    }
    ptx::cp_async_arrive_noinc(&sp.full[stage]);
  }
}

template <int kCols, int kHeadsPadded>
__device__ void produce(const Params& p, SharedPlan<kCols, kCols / kHeadsPadded>& sp, int lane) {
  constexpr int kTokens = kCols / kHeadsPadded;
  const TokenPlan<kTokens>& plan = sp.plan;

  // Q: row (token tau, head h) of the B operand; padded heads and tokens past T are zero rows.
  gather_rows<kCols>(sp.q, p.q_rows_16, lane, p.keys, [&](int row) -> const uint8_t* {
    const int tau = row / kHeadsPadded, h = row % kHeadsPadded;
    const int64_t t = plan.token[tau];
    return t >= 0 && h < p.num_heads ? p.q_fp8 + t * p.q_stride0 + h * p.q_stride1 : nullptr;
  });
  ptx::cp_async_arrive_noinc(&sp.q_full);
  if (p.block_tiles) produce_block_tiles(p, sp, lane);
  else produce_row_tiles(p, sp, lane);
}

// ---------------------------------------------------------------- math (one warpgroup)
// The scores a math thread stores. Per key row pair (row0, row0 + 8) a tile has 2·kTokens
// (token tau, row r) combos c = 2·tau + r; the four threads of a quad hold the same rows and
// split them: thread `quad` owns c ≡ quad (mod 4), so its row offset r = quad % 2 is the same for
// all it owns. Resolved once per CTA, so a tile's stores are a compare and a store each.
template <int kTokens>
struct OwnedScores {
  static constexpr int kOwned = (2 * kTokens + 3) / 4;
  float* row[kOwned];       // the combo's token's scores row
  int64_t visible[kOwned];  // its visible count
  int segment[kOwned];      // its segment; −1 when the quad has no such combo or no token
  int r;

  __device__ OwnedScores(const Params& p, const TokenPlan<kTokens>& plan, int quad) : r(quad % 2) {
#pragma unroll
    for (int m = 0; m < kOwned; ++m) {
      const int c = quad + 4 * m, tau = c / 2;
      const bool live = c < 2 * kTokens && plan.token[tau] >= 0;
      row[m] = live ? p.scores + plan.token[tau] * p.scores_stride0 : p.scores;
      visible[m] = live ? plan.visible[tau] : 0;
      segment[m] = live ? plan.segment[tau] : -1;
    }
  }
};

// The scores of one tile from its accumulators: thread `tid` holds rows row0 and row0 + 8 of the
// tile (keys j0 + row0 + 8r) and, per row, columns 8·v + 2·(lane % 4) + {0, 1} for v < kCols / 8.
// Columns [tau·kHeadsPadded, (tau+1)·kHeadsPadded) are token tau's heads.
template <int kCols, int kHeadsPadded, class Acc>
__device__ __forceinline__ void store_tile_scores(const SharedPlan<kCols, kCols / kHeadsPadded>& sp,
                                                  const OwnedScores<kCols / kHeadsPadded>& own,
                                                  const Acc& acc, float key_scale, int segment,
                                                  int64_t j, int64_t chunk_end, int quad) {
  constexpr int kTokens = kCols / kHeadsPadded;
  constexpr int kGroupsPerToken = kHeadsPadded / 8;
  constexpr int kOwned = OwnedScores<kTokens>::kOwned;
  // sum[c]: combo c = 2·tau + r over this thread's columns (zero past 2·kTokens: a whole quad's
  // worth of combos for the reduction below).
  float sum[4 * kOwned];
#pragma unroll
  for (int c = 0; c < 4 * kOwned; ++c) sum[c] = 0.0f;
#pragma unroll
  for (int v = 0; v < kCols / 8; ++v) {
    const int tau = v / kGroupsPerToken;
    const float2 f = *reinterpret_cast<const float2*>(&sp.head_factor[8 * v + 2 * quad]);
#pragma unroll
    for (int r = 0; r < 2; ++r) {
      sum[2 * tau + r] = fmaf(f.x, relu_keep_nan(acc(4 * v + 2 * r)), sum[2 * tau + r]);
      sum[2 * tau + r] = fmaf(f.y, relu_keep_nan(acc(4 * v + 2 * r + 1)), sum[2 * tau + r]);
    }
  }
  // Reduce-scatter over the quad (its threads hold disjoint columns of the same rows): across
  // lanes q, q ^ 1 each keeps the combos whose bit 0 is its own and sends the others; then across
  // q, q ^ 2 by bit 1. Thread quad ends with the full sums of combos quad + 4m (each sum added in
  // the order the full butterfly adds it: the same bits).
  const bool bit0 = quad & 1, bit1 = quad & 2;
  float half[2 * kOwned];
#pragma unroll
  for (int i = 0; i < 2 * kOwned; ++i) {
    const float keep = bit0 ? sum[2 * i + 1] : sum[2 * i], send = bit0 ? sum[2 * i] : sum[2 * i + 1];
    half[i] = keep + __shfl_xor_sync(0xffffffffu, send, 1);
  }
#pragma unroll
  for (int m = 0; m < kOwned; ++m) {
    const float keep = bit1 ? half[2 * m + 1] : half[2 * m], send = bit1 ? half[2 * m] : half[2 * m + 1];
    const float total = keep + __shfl_xor_sync(0xffffffffu, send, 2);
    if (own.segment[m] == segment && j < chunk_end)
      own.row[m][j] = j < own.visible[m] ? key_scale * total : -INFINITY;
  }
}

template <int kCols, int kHeadsPadded>
__device__ void compute(const Params& p, SharedPlan<kCols, kCols / kHeadsPadded>& sp, int tid) {
  using namespace cute;
  using Mma = MmaScores<kCols>;
  constexpr int kTokens = kCols / kHeadsPadded;
  const TokenPlan<kTokens>& plan = sp.plan;

  // One factor per (token, head) column: w_h · q_scale_h (exact: q_scale is a power of two).
  for (int col = tid; col < kCols; col += kMathThreads) {
    const int tau = col / kHeadsPadded, h = col % kHeadsPadded;
    const int64_t t = plan.token[tau];
    sp.head_factor[col] = t >= 0 && h < p.num_heads
                              ? p.weights[t * p.weights_stride0 + h] * p.q_scale[t * p.q_scale_stride0 + h]
                              : 0.0f;
  }
  ptx::named_barrier_sync(1, kMathThreads);

  if (plan.total_tiles > 0) {
    ptx::mbarrier_wait(&sp.q_full, 0);
    auto sQ = make_tensor(make_smem_ptr(reinterpret_cast<fp8_e4m3_t*>(sp.q)), SmemTileKFp8x128<kCols>{});
    Tensor acc = partition_fragment_C(Mma{}, Shape<Int<kTileKeys>, Int<kCols>>{});
    const int quad = tid % 4;
    const OwnedScores<kTokens> own(p, plan, quad);
    const int row = acc_row(0, tid) + 8 * own.r;  // the tile row this thread stores
    const int64_t chunk_end = plan.chunk_end;
    int it = 0;
    for (int s = 0; s < plan.num_segments; ++s) {
      for (int k = 0; k < plan.tiles[s]; ++k, ++it) {
        const int stage = it % kStages;
        ptx::mbarrier_wait(&sp.full[stage], (it / kStages) & 1);
        auto sK = make_tensor(make_smem_ptr(reinterpret_cast<fp8_e4m3_t*>(sp.keys[stage])),
                              SmemTileKFp8x128<kTileKeys>{});
        wgmma_ss(Mma{}, sK, sQ, acc, /*zero_init=*/true);
        wgmma_commit();
        const float key_scale = sp.key_scale[stage][row];
        wgmma_wait<0>();
        ptx::mbarrier_arrive(&sp.empty[stage]);  // products and scales read: the stage is free
        store_tile_scores<kCols, kHeadsPadded>(sp, own, acc, key_scale, s,
                                               plan.chunk_begin + static_cast<int64_t>(k) * kTileKeys + row,
                                               chunk_end, quad);
      }
    }
  }
  // Columns of the chunk past every computed tile: −inf (nothing visible there).
#pragma unroll 1
  for (int tau = 0; tau < kTokens; ++tau) {
    if (plan.token[tau] < 0) continue;
    float* row = p.scores + plan.token[tau] * p.scores_stride0;
    const int64_t from = plan.chunk_begin + static_cast<int64_t>(plan.tiles[plan.segment[tau]]) * kTileKeys;
    for (int64_t j = from + tid; j < plan.chunk_end; j += kMathThreads) row[j] = -INFINITY;
  }
}

// ---------------------------------------------------------------- entry
template <int kCols>
inline constexpr int kMinCtasPerSm = kCols >= 256 ? 2 : kCols >= 128 ? 3 : 4;

template <int kCols, int kHeadsPadded>
__global__ void __launch_bounds__(kThreads, kMinCtasPerSm<kCols>) scores_kernel(const __grid_constant__ Params p) {
  grid_dependency_entry();
#if defined(__CUDA_ARCH__) && (__CUDA_ARCH__ >= 900)
  static_assert(kHeadsPadded % 64 == 0 && kCols % kHeadsPadded == 0 && kCols <= kMaxCols, "bad tile shape");
  using Plan = SharedPlan<kCols, kCols / kHeadsPadded>;
  extern __shared__ uint8_t smem_raw[];
  Plan& sp = aligned_dynamic_smem<Plan>(smem_raw);
  if (threadIdx.x == 0) {
    build_token_plan(p, sp.plan);
    ptx::mbarrier_init(&sp.q_full, kProducerThreads);
    for (int s = 0; s < kStages; ++s) {
      ptx::mbarrier_init(&sp.full[s], kProducerThreads);  // one cp.async arrival per producer lane
      ptx::mbarrier_init(&sp.empty[s], kMathThreads);
    }
    ptx::fence_barrier_init();
  }
  __syncthreads();
  if (threadIdx.x < kMathThreads) {
    compute<kCols, kHeadsPadded>(p, sp, threadIdx.x);
  } else if (sp.plan.total_tiles > 0) {
    produce<kCols, kHeadsPadded>(p, sp, threadIdx.x % 32);
  }
#endif
}

template <int kCols, int kHeadsPadded>
void launch_scores(const Params& params, int chunks, cudaStream_t stream) {
  constexpr int kTokens = kCols / kHeadsPadded;
  constexpr int kSmem = kSmemBytes<kCols, kTokens>;
  static PerDeviceOnce smem_opt_in;
  opt_in_dynamic_smem(smem_opt_in, scores_kernel<kCols, kHeadsPadded>, kSmem, "indexer_scores");
  const int64_t groups = (params.num_tokens + kTokens - 1) / kTokens;
  const dim3 grid(static_cast<unsigned>(groups), static_cast<unsigned>(chunks));
  launch_kernel("indexer_scores", scores_kernel<kCols, kHeadsPadded>, {grid, kThreads, kSmem}, stream,
                params);
}

}  // namespace dsv4::cuda::indexer_scores_detail

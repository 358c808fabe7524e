// The skinny GEMM (skinny_gemm.h), sm_90a.
//
// Work split: CTA (n tile, token tile, split, batch) computes y[b][t0 … t0+kCols, n0 … n0+64] over
// the K blocks [split · kblocks_per_split, …). A K block is one 128-byte row of each operand: 128
// fp8 values (one scale block) or 64 bf16 values.
//   warpgroup 0 (128 threads): math — per K block C = W_tile · X_tileᵀ (wgmma m64 n{kCols}, fp32);
//                              fp8: C from zero, then total += C · w_scale · x_scale[token], with
//                              block k+1's product issued before block k is scaled (two C sets);
//                              bf16: C accumulates into the total directly, one product in flight
//                              behind the next. At the end the totals go to y (one split) or to
//                              the split's partial sums;
//   warp 4 (32 threads):       producer — per K block two TMA boxes, the 64 weight rows and the
//                              kCols token rows (tokens past T zero-filled), and for fp8 their
//                              scales with cp.async, into a ring of kStages stages (mbarriers
//                              full / empty). TMA, not per-lane cp.async, for the rows: one warp
//                              issuing 16-byte copies of a 24 KB stage held a V4 decode GEMM at
//                              45-100 µs (measured on the H200 with T = 128).
// W is the wgmma A operand (M = 64 output columns) and X the B operand (N = kCols tokens), so a
// decode step of a few tokens pads only the small operand, and a CTA of 128 tokens reads its
// weight tile once for all of them. With more than one split, a second kernel adds the partial
// sums in split order and writes y.
#include "cuda/gemm/skinny_gemm.h"

#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include <algorithm>
#include <cstdint>
#include <limits>

#include "cuda/common/check.h"
#include "cuda/common/device_props.h"
#include "cuda/common/launch.cuh"
#include "cuda/common/per_device_once.h"
#include "cuda/common/ptx.cuh"
#include "cuda/common/smem_layout.cuh"
#include "cuda/common/tma.h"
#include "cuda/common/wgmma.cuh"

#if !defined(DSV4_HAVE_CUTLASS)
#error "the skinny GEMM needs CuTe (third_party/cutlass)"
#endif

namespace dsv4::cuda {
namespace skinny {

constexpr int kTileRows = 64;   // output columns (rows of w) per CTA = wgmma M
constexpr int kRowBytes = 128;  // bytes of a K block per operand row: one SW128 span
constexpr int kMathThreads = 128;
constexpr int kProducerThreads = 32;
constexpr int kThreads = kMathThreads + kProducerThreads;
constexpr int kReduceThreads = 256;
constexpr int kMaxTokenTile = 128;
constexpr int kSmemLimit = 227 * 1024;         // sm_90's opt-in maximum per CTA
constexpr int kSmemPerSm = 228 * 1024;         // an SM's shared memory
constexpr int kSmemReservedPerCta = 1024;      // what the system keeps of it per CTA

// Per token tile: the K blocks in flight per CTA, and the CTAs that share an SM (the launch
// bounds promise ptxas that many; the split rule of the wide tiles counts on it).
//   16 / 32 tokens: 4 stages of 10-12 KB, as measured; many CTAs fit an SM (the split rule of
//     these tiles, kept as measured, assumes 2).
//   64 tokens: 6 stages of 16 KB (~98 KB) and at most 204 registers a thread: 2 CTAs an SM.
//   128 tokens: 8 stages of 24 KB (~197 KB): its three accumulator sets (192 registers a thread)
//     leave room for one CTA an SM anyway, so its ring holds what two CTAs' rings would.
template <int kCols>
constexpr int kStages = kCols <= 32 ? 4 : (kCols == 64 ? 6 : 8);
template <int kCols>
constexpr int kCtasPerSm = kCols == 128 ? 1 : 2;

// The two operand kinds: element type, K per block, the wgmma instruction's K, the shared tile.
struct Fp8Operands {
  using Elem = fp8_e4m3_t;
  static constexpr int kKBlock = 128;
  static constexpr bool kBlockScaled = true;
  using InstrK = cute::_32;
  template <int kRows>
  using Tile = SmemTileKFp8x128<kRows>;
};
struct Bf16Operands {
  using Elem = bf16_t;
  static constexpr int kKBlock = 64;
  static constexpr bool kBlockScaled = false;
  using InstrK = cute::_16;
  template <int kRows>
  using Tile = SmemTileK<kRows, 64>;
};

struct Params {
  CUtensorMap x_map;  // [batch, T, K] elements, boxes of kCols rows × one K block (rows past T: zeros)
  CUtensorMap w_map;  // [batch, N, K] elements, boxes of 64 rows × one K block
  const float* x_scale;  // fp8 only
  int64_t x_scale_batch_stride;
  const float* w_scale;  // fp8 only
  int64_t w_scale_ld, w_scale_batch_stride;
  void* y;
  int64_t y_ld, y_batch_stride;
  bool y_bf16;
  float* partial;  // more than one split: [splits][batch][T][N] fp32; else null (y directly)
  int64_t T, N;
  int token_tiles;  // ⌈T / kCols⌉: blockIdx.x = token tile + token_tiles · column tile
  int batch, kblocks, kblocks_per_split;
};

template <int kCols>
struct SharedPlan {
  static constexpr int kRing = kStages<kCols>;
  alignas(1024) uint8_t w[kRing][kTileRows * kRowBytes];  // A operand: K-major SW128
  alignas(1024) uint8_t x[kRing][kCols * kRowBytes];      // B operand, same layout
  float x_scale[kRing][kCols];                            // fp8: per token; 0 past T
  float w_scale[kRing];                                   // fp8: the tile's 128 × 128 block
  uint64_t full[kRing], empty[kRing];
};
template <int kCols>
constexpr int kSmemBytes = static_cast<int>(sizeof(SharedPlan<kCols>)) + 1024;  // + alignment

template <class Operands, int kCols>
using Mma = decltype(cute::make_tiled_mma(
    cute::GMMA::ss_op_selector<typename Operands::Elem, typename Operands::Elem, float,
                               cute::Shape<cute::Int<kTileRows>, cute::Int<kCols>, typename Operands::InstrK>>()));

// What one CTA computes.
struct CtaWork {
  int64_t n0;  // first output column
  int t0;      // first token
  int batch, split, kb_begin, kb_end;
};
template <int kCols>
__device__ __forceinline__ CtaWork cta_work(const Params& p) {
  CtaWork c;
  c.n0 = static_cast<int64_t>(blockIdx.x / p.token_tiles) * kTileRows;
  c.t0 = static_cast<int>(blockIdx.x % p.token_tiles) * kCols;
  c.split = static_cast<int>(blockIdx.y);
  c.batch = static_cast<int>(blockIdx.z);
  c.kb_begin = c.split * p.kblocks_per_split;
  c.kb_end = min(p.kblocks, c.kb_begin + p.kblocks_per_split);
  return c;
}

// The ring slot of the CTA's i-th K block and the parity of its use of that slot.
template <int kCols>
__device__ __forceinline__ int stage_of(int i) {
  return i % kStages<kCols>;
}
template <int kCols>
__device__ __forceinline__ uint32_t phase_of(int i) {
  return static_cast<uint32_t>(i / kStages<kCols>) & 1;
}

// Arrivals that complete a stage: lane 0's (announcing the TMA bytes), plus, for fp8, one
// cp.async arrival per producer lane for the scales.
template <class Operands>
constexpr uint32_t kFullArrivals = Operands::kBlockScaled ? kProducerThreads + 1 : 1;

// ---------------------------------------------------------------- producer (one warp)
template <class Operands, int kCols>
__device__ void produce(const Params& p, SharedPlan<kCols>& sp, const CtaWork& c, int lane) {
  constexpr uint32_t kStageBytes = (kTileRows + kCols) * kRowBytes;  // the two boxes, padding included
  for (int kb = c.kb_begin, i = 0; kb < c.kb_end; ++kb, ++i) {
    const int stage = stage_of<kCols>(i);
    if (i >= kStages<kCols>) ptx::mbarrier_wait(&sp.empty[stage], phase_of<kCols>(i) ^ 1);
    const int k0 = kb * Operands::kKBlock;
    if (lane == 0) {
      ptx::mbarrier_arrive_expect_tx(&sp.full[stage], kStageBytes);
      ptx::tma_load_3d(sp.w[stage], &p.w_map, k0, static_cast<int>(c.n0), c.batch, &sp.full[stage]);
      ptx::tma_load_3d(sp.x[stage], &p.x_map, k0, c.t0, c.batch, &sp.full[stage]);
    }
    if constexpr (Operands::kBlockScaled) {
      const float* x_scale = p.x_scale + c.batch * p.x_scale_batch_stride + static_cast<int64_t>(kb) * p.T;
      const float* w_scale = p.w_scale + c.batch * p.w_scale_batch_stride + (c.n0 / 128) * p.w_scale_ld;
      for (int r = lane; r < kCols; r += 32) {
        const bool valid = c.t0 + r < p.T;
        ptx::cp_async_4_zfill(&sp.x_scale[stage][r], valid ? x_scale + c.t0 + r : p.x_scale, valid);
      }
      if (lane == 0) ptx::cp_async_4_zfill(&sp.w_scale[stage], w_scale + kb, true);
      ptx::cp_async_arrive_noinc(&sp.full[stage]);
    }
  }
}

// ---------------------------------------------------------------- math (one warpgroup)
// Issues (does not wait for) the wgmma chain of the K block in `stage`: acc (+)= W · Xᵀ.
template <class Operands, int kCols, class Acc>
__device__ __forceinline__ void issue_product(SharedPlan<kCols>& sp, int stage, Acc& acc, bool zero_init) {
  using namespace cute;
  using Elem = typename Operands::Elem;
  auto sW = make_tensor(make_smem_ptr(reinterpret_cast<Elem*>(sp.w[stage])), typename Operands::template Tile<kTileRows>{});
  auto sX = make_tensor(make_smem_ptr(reinterpret_cast<Elem*>(sp.x[stage])), typename Operands::template Tile<kCols>{});
  wgmma_ss(Mma<Operands, kCols>{}, sW, sX, acc, zero_init);
  wgmma_commit();
}

// fp8: total += slice · w_scale · x_scale[token], the K block in `stage`'s scales — DeepSeek's
// per-128 promotion, one fmaf per element in K-block order (the kernel's numerics; the expression
// stays this one so every tile and pipeline depth gives the same bits).
template <int kCols, class Acc>
__device__ __forceinline__ void promote(const SharedPlan<kCols>& sp, int stage, const Acc& slice, Acc& total,
                                        int tid) {
  const float w_scale = sp.w_scale[stage];
  CUTE_UNROLL
  for (int e = 0; e < cute::size(slice); ++e)
    total(e) = fmaf(slice(e), w_scale * sp.x_scale[stage][acc_col(e, tid)], total(e));
}

// fp8, the CTA's i-th K block, whose product is the only one in flight, in `current`: waits for
// it, issues block i+1's into `next` (if there is one: the tensor cores work on it while this
// thread scales block i), promotes block i and frees its stage. Returns whether block i+1 exists.
// Why wait<0> before the issue rather than wait<1> after it: ptxas (CUDA 13) serializes every
// wgmma of a kernel (warning C7514) whose loop reads, after a wait<1>, accumulators that a product
// of an earlier turn wrote; read after a wait<0>, with nothing else in flight, they are pipelined.
// So each block's product starts right after the previous one ends, and only the wait→issue
// latency, not the scaling, stands between them.
template <int kCols, class Acc>
__device__ __forceinline__ bool promote_behind_next(SharedPlan<kCols>& sp, int i, int blocks, Acc& current,
                                                    Acc& next, Acc& total, int tid) {
  wgmma_wait<0>();
  cute::warpgroup_fence_operand(current);  // the reads below stay after the wait
  if (i + 1 == blocks) {
    promote<kCols>(sp, stage_of<kCols>(i), current, total, tid);
    return false;  // the last block: its stage is never refilled
  }
  ptx::mbarrier_wait(&sp.full[stage_of<kCols>(i + 1)], phase_of<kCols>(i + 1));
  issue_product<Fp8Operands, kCols>(sp, stage_of<kCols>(i + 1), next, /*zero_init=*/true);
  promote<kCols>(sp, stage_of<kCols>(i), current, total, tid);
  ptx::mbarrier_arrive(&sp.empty[stage_of<kCols>(i)]);  // products and scales read: the stage is free
  return true;
}

// Thread `tid` holds output columns n0 + acc_row(e) and tokens t0 + acc_col(e) (wgmma.cuh).
template <class Acc>
__device__ __forceinline__ void store_totals(const Params& p, const CtaWork& c, const Acc& total, int tid) {
  CUTE_UNROLL
  for (int e = 0; e < cute::size(total); ++e) {  // unrolled: total stays in registers
    const int64_t n = c.n0 + acc_row(e, tid), t = c.t0 + acc_col(e, tid);
    if (t >= p.T) continue;
    if (p.partial != nullptr) {
      p.partial[((static_cast<int64_t>(c.split) * p.batch + c.batch) * p.T + t) * p.N + n] = total(e);
    } else if (p.y_bf16) {
      static_cast<__nv_bfloat16*>(p.y)[c.batch * p.y_batch_stride + t * p.y_ld + n] = __float2bfloat16_rn(total(e));
    } else {
      static_cast<float*>(p.y)[c.batch * p.y_batch_stride + t * p.y_ld + n] = total(e);
    }
  }
}

// fp8: block i's product goes to `even` for even i and to `odd` for odd i, so the loop runs two
// blocks per turn with the roles swapped (registers cannot be indexed at run time). The sets start
// defined (zeros, fenced) so the compiler cannot tie their registers to others' values — ptxas
// serialized the products when an undefined set shared the zeros of `total`.
template <int kCols>
__device__ void compute_block_scaled(const Params& p, SharedPlan<kCols>& sp, const CtaWork& c, int tid) {
  using namespace cute;
  Tensor total = partition_fragment_C(Mma<Fp8Operands, kCols>{}, Shape<Int<kTileRows>, Int<kCols>>{});
  Tensor even = make_fragment_like(total), odd = make_fragment_like(total);
  clear(total);
  clear(even);
  clear(odd);
  warpgroup_fence_operand(even);
  warpgroup_fence_operand(odd);
  const int blocks = c.kb_end - c.kb_begin;  // >= 1: no split is empty
  ptx::mbarrier_wait(&sp.full[stage_of<kCols>(0)], phase_of<kCols>(0));
  issue_product<Fp8Operands, kCols>(sp, stage_of<kCols>(0), even, /*zero_init=*/true);
  for (int i = 0;; i += 2) {
    if (!promote_behind_next<kCols>(sp, i, blocks, even, odd, total, tid)) break;
    if (!promote_behind_next<kCols>(sp, i + 1, blocks, odd, even, total, tid)) break;
  }
  store_totals(p, c, total, tid);
}

// bf16: the products accumulate into the totals, in K-block order (chained wgmmas on the same
// registers run in issue order); block i is issued before block i-1 is waited for, whose stage is
// then freed.
template <int kCols>
__device__ void compute_bf16(const Params& p, SharedPlan<kCols>& sp, const CtaWork& c, int tid) {
  using namespace cute;
  Tensor total = partition_fragment_C(Mma<Bf16Operands, kCols>{}, Shape<Int<kTileRows>, Int<kCols>>{});
  clear(total);
  const int blocks = c.kb_end - c.kb_begin;
  for (int i = 0; i < blocks; ++i) {
    ptx::mbarrier_wait(&sp.full[stage_of<kCols>(i)], phase_of<kCols>(i));
    issue_product<Bf16Operands, kCols>(sp, stage_of<kCols>(i), total, /*zero_init=*/i == 0);
    wgmma_wait<1>();
    if (i > 0) ptx::mbarrier_arrive(&sp.empty[stage_of<kCols>(i - 1)]);
  }
  wgmma_wait<0>();  // the last block's stage is never reused: nothing to free
  warpgroup_fence_operand(total);
  store_totals(p, c, total, tid);
}

// ---------------------------------------------------------------- entries
template <class Operands, int kCols>
__global__ void __launch_bounds__(kThreads, kCtasPerSm<kCols>) skinny_gemm_kernel(const __grid_constant__ Params p) {
  grid_dependency_entry();
#if defined(__CUDA_ARCH__) && (__CUDA_ARCH__ >= 900)
  static_assert(kCols % 16 == 0 && kCols <= kMaxTokenTile, "bad token tile");
  static_assert(kSmemBytes<kCols> <= kSmemLimit, "shared plan over sm_90's limit per CTA");
  static_assert(kCtasPerSm<kCols> * (kSmemBytes<kCols> + kSmemReservedPerCta) <= kSmemPerSm,
                "kCtasPerSm CTAs of this tile do not fit an SM's shared memory");
  extern __shared__ uint8_t smem_raw[];
  auto& sp = aligned_dynamic_smem<SharedPlan<kCols>>(smem_raw);
  const CtaWork c = cta_work<kCols>(p);
  if (threadIdx.x == 0) {
    for (int s = 0; s < kStages<kCols>; ++s) {
      ptx::mbarrier_init(&sp.full[s], kFullArrivals<Operands>);
      ptx::mbarrier_init(&sp.empty[s], kMathThreads);
    }
    ptx::fence_barrier_init();
  }
  __syncthreads();
  if (threadIdx.x < kMathThreads) {
    if constexpr (Operands::kBlockScaled)
      compute_block_scaled<kCols>(p, sp, c, static_cast<int>(threadIdx.x));
    else
      compute_bf16<kCols>(p, sp, c, static_cast<int>(threadIdx.x));
  } else {
    produce<Operands, kCols>(p, sp, c, static_cast<int>(threadIdx.x) % 32);
  }
#endif
}

// y = Σ over splits of the partial sums, in split order.
__global__ void __launch_bounds__(kReduceThreads) reduce_splits_kernel(const Params p, int splits) {
  grid_dependency_entry();
  const int64_t per_split = static_cast<int64_t>(p.batch) * p.T * p.N;
  const int64_t step = static_cast<int64_t>(gridDim.x) * blockDim.x;
  for (int64_t i = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; i < per_split; i += step) {
    float sum = 0.0f;
    for (int s = 0; s < splits; ++s) sum += p.partial[s * per_split + i];
    const int64_t n = i % p.N, t = (i / p.N) % p.T, b = i / (p.N * p.T);
    const int64_t at = b * p.y_batch_stride + t * p.y_ld + n;
    if (p.y_bf16)
      static_cast<__nv_bfloat16*>(p.y)[at] = __float2bfloat16_rn(sum);
    else
      static_cast<float*>(p.y)[at] = sum;
  }
}

template <class Operands, int kCols>
void launch(const Params& p, dim3 grid, cudaStream_t stream) {
  constexpr int kSmem = kSmemBytes<kCols>;
  static PerDeviceOnce smem_opt_in;
  opt_in_dynamic_smem(smem_opt_in, skinny_gemm_kernel<Operands, kCols>, kSmem, "skinny_gemm");
  launch_kernel("skinny_gemm", skinny_gemm_kernel<Operands, kCols>, {grid, kThreads, kSmem}, stream, p);
}

int64_t ceil_div(int64_t a, int64_t b) { return (a + b - 1) / b; }

// The token tile (wgmma N) of a problem of T tokens: the smallest of 16 … 64 that holds them
// (padding at most half a tile), 64 beyond (several tiles). The 128-token tile (one CTA per SM)
// lost to two 64-token tiles on all six V4-Flash projections at 128 tokens (H200, 2026-11-27,
// bench/RESULTS.md), so only a forced token_tile takes it.
int token_tile(const SkinnyGemm& g) {
  constexpr int kDefaultMaxTile = 64;
  if (g.token_tile != 0) return g.token_tile;
  for (int tile = 16; tile < kDefaultMaxTile; tile *= 2)
    if (g.T <= tile) return tile;
  return kDefaultMaxTile;
}

// Bytes between rows of a [rows, K] operand as the TMA map gets them: a one-row matrix's ld is
// never used (and may be anything), so its rows are given as packed, rounded to 16 bytes.
int64_t row_pitch_bytes(int64_t ld, int64_t rows, int64_t K, int64_t elem_bytes) {
  return rows > 1 ? ld * elem_bytes : ceil_div(K * elem_bytes, 16) * 16;
}

bool aligned16(const void* p, int64_t a, int64_t b) {
  return (reinterpret_cast<uintptr_t>(p) | static_cast<uint64_t>(a) | static_cast<uint64_t>(b)) % 16 == 0;
}

// The TMA map of a [batch, rows, K] operand read in boxes of box_rows rows × one K block (one
// SW128 span per row). One batch: any 16-byte multiple serves as the unused batch stride.
CUtensorMap operand_map(DType dtype, const void* base, int64_t batch, int64_t rows, int64_t K, int64_t ld,
                        int64_t batch_stride, int box_rows) {
  const int64_t eb = static_cast<int64_t>(dtype_size(dtype));
  const int64_t pitch = row_pitch_bytes(ld, rows, K, eb);
  const uint64_t dims[3] = {static_cast<uint64_t>(K), static_cast<uint64_t>(rows), static_cast<uint64_t>(batch)};
  const uint64_t strides[2] = {static_cast<uint64_t>(pitch),
                               static_cast<uint64_t>(batch > 1 ? batch_stride * eb : pitch * rows)};
  const uint32_t box[3] = {static_cast<uint32_t>(kRowBytes / eb), static_cast<uint32_t>(box_rows), 1};
  return dtype == DType::bf16 ? make_tensor_map_bf16_sw128("skinny_gemm", base, 3, dims, strides, box)
                              : make_tensor_map_u8_sw128("skinny_gemm", base, 3, dims, strides, box);
}

template <class Operands>
void launch_tile(const Params& p, int tile, dim3 grid, cudaStream_t stream) {
  switch (tile) {
    case 16: launch<Operands, 16>(p, grid, stream); break;
    case 32: launch<Operands, 32>(p, grid, stream); break;
    case 64: launch<Operands, 64>(p, grid, stream); break;
    default: launch<Operands, 128>(p, grid, stream); break;
  }
}

int ctas_per_sm(int tile) {
  switch (tile) {
    case 16: return kCtasPerSm<16>;
    case 32: return kCtasPerSm<32>;
    case 64: return kCtasPerSm<64>;
    default: return kCtasPerSm<128>;
  }
}

// The number of K splits: asked for (g.splits), or by the rule of the tile. Either way at most what
// the workspace holds and K has blocks, and no more than keeps the partial sums' traffic (written,
// then read back) within half the weight's bytes: splits · T · N · 4 · 2 <= N · K · eb / 2.
//   16 / 32 tokens (the rule they were measured with, and their results depend on it bit for bit):
//     until there are about two CTAs per SM, each streaming a fraction of its weight rows.
//   64 / 128 tokens: the count that streams the fewest K blocks per SM — waves of CTAs over the
//     SMs (kCtasPerSm each) times the blocks each CTA streams —, the fewest splits among equals
//     (fewer partial sums; none, and no reduction, with one). The ceiling of the rule above would
//     start a second, mostly empty wave there (V4's wo_b at 64 tokens: 5 splits, 320 CTAs on
//     264 places; this rule takes 4).
int64_t choose_splits(const SkinnyGemm& g, int tile, int64_t kblocks, int64_t ctas_per_split) {
  const int64_t eb = static_cast<int64_t>(dtype_size(g.ab_dtype));
  const int64_t partial_bytes = g.batch * g.T * g.N * static_cast<int64_t>(sizeof(float));
  const int64_t workspace_splits = g.workspace != nullptr ? g.workspace_bytes / partial_bytes : 1;
  const int64_t cap = std::max<int64_t>(std::min<int64_t>({kblocks, workspace_splits, 65535}), 1);
  if (g.splits > 0) return std::min(g.splits, cap);
  const int64_t traffic_cap = std::max<int64_t>(std::min(cap, g.K * eb / (16 * g.T)), 1);
  const int64_t sms = current_device_sm_count("skinny_gemm");
  if (tile <= 32) return std::min(ceil_div(2 * sms, ctas_per_split), traffic_cap);
  const int64_t places = sms * ctas_per_sm(tile);
  int64_t best = 1, best_cost = ceil_div(ctas_per_split, places) * kblocks;
  for (int64_t splits = 2; splits <= traffic_cap; ++splits) {
    const int64_t per_split = ceil_div(kblocks, splits);
    const int64_t cost = ceil_div(ctas_per_split * ceil_div(kblocks, per_split), places) * per_split;
    if (cost < best_cost) best = splits, best_cost = cost;
  }
  return best;
}

}  // namespace skinny

bool skinny_gemm_fits(const SkinnyGemm& g) {
  using namespace skinny;
  if (g.ab_dtype != DType::fp8_e4m3 && g.ab_dtype != DType::bf16) return false;
  const int64_t eb = static_cast<int64_t>(dtype_size(g.ab_dtype));
  const int64_t k_block = kRowBytes / eb;
  constexpr int64_t kMaxCoordinate = std::numeric_limits<int32_t>::max();  // TMA coordinates
  if (g.T < 1 || g.K <= 0 || g.K % k_block != 0 || g.N <= 0 || g.N % kTileRows != 0 || g.batch < 1 ||
      g.batch > 65535 || g.T > kMaxCoordinate || g.N > kMaxCoordinate || g.K > kMaxCoordinate)
    return false;
  if (g.token_tile != 0 && g.token_tile != 16 && g.token_tile != 32 && g.token_tile != 64 && g.token_tile != 128)
    return false;
  if (g.splits < 0) return false;
  if (g.ab_dtype == DType::fp8_e4m3 && (g.x_scale == nullptr || g.w_scale == nullptr)) return false;
  if (!aligned16(g.x, row_pitch_bytes(g.x_ld, g.T, g.K, eb), g.x_batch_stride * eb) ||
      !aligned16(g.w, row_pitch_bytes(g.w_ld, g.N, g.K, eb), g.w_batch_stride * eb))
    return false;
  return g.y_dtype == DType::bf16 || g.y_dtype == DType::fp32;
}

bool skinny_gemm_preferred(const SkinnyGemm& g) {
  return skinny_gemm_fits(g) && g.T <= kSkinnyMaxTokens &&
         g.batch * skinny::ceil_div(g.N, 128) < current_device_sm_count("skinny_gemm");
}

bool runs_on_skinny_gemm(const char* op, rt::GemmPath path, const SkinnyGemm& g) {
  switch (path) {
    case rt::GemmPath::automatic: return skinny_gemm_preferred(g);
    case rt::GemmPath::cublaslt: return false;
    case rt::GemmPath::skinny: break;
  }
  DSV4_CHECK(skinny_gemm_fits(g), op, ": the skinny GEMM (forced) does not take the problem (", dtype_name(g.ab_dtype),
             ", T ", g.T, ", N ", g.N, ", K ", g.K, ", batch ", g.batch, ", token tile ", g.token_tile,
             "): it needs fp8 or bf16 operands, N a multiple of 64, K of one 128-byte row, 16-byte aligned rows, "
             "a token tile of 16, 32, 64 or 128 (0: its own)");
  return true;
}

void skinny_gemm(const SkinnyGemm& g, Stream stream) {
  using namespace skinny;
  constexpr const char* kWhere = "skinny_gemm";
  DSV4_CHECK(skinny_gemm_fits(g), kWhere, ": a problem the kernel does not take (", dtype_name(g.ab_dtype), ", T ",
             g.T, ", N ", g.N, ", K ", g.K, ", batch ", g.batch, ")");
  const int64_t eb = static_cast<int64_t>(dtype_size(g.ab_dtype));
  const int tile = token_tile(g);
  Params p{};
  p.x_map = operand_map(g.ab_dtype, g.x, g.batch, g.T, g.K, g.x_ld, g.x_batch_stride, tile);
  p.w_map = operand_map(g.ab_dtype, g.w, g.batch, g.N, g.K, g.w_ld, g.w_batch_stride, kTileRows);
  p.x_scale = g.x_scale;
  p.x_scale_batch_stride = g.x_scale_batch_stride;
  p.w_scale = g.w_scale;
  p.w_scale_ld = g.w_scale_ld;
  p.w_scale_batch_stride = g.w_scale_batch_stride;
  p.y = g.y;
  p.y_ld = g.y_ld;
  p.y_batch_stride = g.y_batch_stride;
  p.y_bf16 = g.y_dtype == DType::bf16;
  p.T = g.T;
  p.N = g.N;
  p.batch = static_cast<int>(g.batch);
  p.kblocks = static_cast<int>(g.K * eb / kRowBytes);

  // The token tiles of a column tile are neighbours in the grid, so they run together and the
  // weight tile comes from HBM once, then from L2.
  const int64_t n_tiles = g.N / kTileRows, token_tiles = ceil_div(g.T, tile);
  DSV4_CHECK(n_tiles * token_tiles <= std::numeric_limits<int32_t>::max(), kWhere, ": ", n_tiles,
             " column tiles × ", token_tiles, " token tiles exceed the grid");
  p.token_tiles = static_cast<int>(token_tiles);
  const int64_t ctas_per_split = n_tiles * token_tiles * g.batch;
  int64_t splits = choose_splits(g, tile, p.kblocks, ctas_per_split);
  p.kblocks_per_split = static_cast<int>(ceil_div(p.kblocks, splits));
  splits = ceil_div(p.kblocks, p.kblocks_per_split);  // no empty split
  p.partial = splits > 1 ? static_cast<float*>(g.workspace) : nullptr;

  const dim3 grid(static_cast<unsigned>(n_tiles * token_tiles), static_cast<unsigned>(splits),
                  static_cast<unsigned>(g.batch));
  if (g.ab_dtype == DType::fp8_e4m3)
    launch_tile<Fp8Operands>(p, tile, grid, stream);
  else
    launch_tile<Bf16Operands>(p, tile, grid, stream);
  if (splits > 1) {
    const int64_t partial_bytes = g.batch * g.T * g.N * static_cast<int64_t>(sizeof(float));
    const int64_t sms = current_device_sm_count(kWhere);
    const int64_t blocks = std::clamp<int64_t>(ceil_div(partial_bytes / 4, kReduceThreads), 1, 4 * sms);
    launch_kernel(kWhere, reduce_splits_kernel, {static_cast<unsigned>(blocks), kReduceThreads, 0}, stream, p,
                  static_cast<int>(splits));
  }
}

}  // namespace dsv4::cuda

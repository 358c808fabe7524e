// The skinny GEMM (skinny_gemm.h), sm_90a.
//
// Work split: CTA (n tile, split, batch) computes y[b][:, 64·n_tile …+64] over the K blocks
// [split · kblocks_per_split, …) for all T (≤ kSkinnyMaxTokens) tokens. A K block is one 128-byte
// row of each operand: 128 fp8 values (one scale block) or 64 bf16 values.
//   warpgroup 0 (128 threads): math — per K block C = W_tile · X_tileᵀ (wgmma m64 n{kCols}, fp32);
//                              fp8: C from zero, then total += C · w_scale · x_scale[token];
//                              bf16: C accumulates into the total directly. At the end the totals
//                              go to y (one split) or to the split's partial sums;
//   warp 4 (32 threads):       producer — per K block two TMA boxes, the 64 weight rows and the
//                              kCols token rows (tokens past T zero-filled), and for fp8 their
//                              scales with cp.async, into a ring of kStages stages (mbarriers
//                              full / empty). TMA, not per-lane cp.async, for the rows: one warp
//                              issuing 16-byte copies of a 24 KB stage held a V4 decode GEMM at
//                              45-100 µs (measured on the H200 with T = 128).
// W is the wgmma A operand (M = 64 output columns) and X the B operand (N = kCols tokens), so a
// decode step of a few tokens pads only the small operand. With more than one split, a second
// kernel adds the partial sums in split order and writes y.
#include "cuda/gemm/skinny_gemm.h"

#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include <algorithm>
#include <cstdint>
#include <limits>

#include "cuda/common/check.h"
#include "cuda/common/device_props.h"
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
constexpr int kStages = 4;      // K blocks in flight per CTA
constexpr int kMathThreads = 128;
constexpr int kProducerThreads = 32;
constexpr int kThreads = kMathThreads + kProducerThreads;
constexpr int kReduceThreads = 256;

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
  int batch, kblocks, kblocks_per_split;
};

template <int kCols>
struct SharedPlan {
  alignas(1024) uint8_t w[kStages][kTileRows * kRowBytes];  // A operand: K-major SW128
  alignas(1024) uint8_t x[kStages][kCols * kRowBytes];      // B operand, same layout
  float x_scale[kStages][kCols];                            // fp8: per token; 0 past T
  float w_scale[kStages];                                   // fp8: the tile's 128 × 128 block
  uint64_t full[kStages], empty[kStages];
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
  int batch, split, kb_begin, kb_end;
};
__device__ __forceinline__ CtaWork cta_work(const Params& p) {
  CtaWork c;
  c.n0 = static_cast<int64_t>(blockIdx.x) * kTileRows;
  c.split = static_cast<int>(blockIdx.y);
  c.batch = static_cast<int>(blockIdx.z);
  c.kb_begin = c.split * p.kblocks_per_split;
  c.kb_end = min(p.kblocks, c.kb_begin + p.kblocks_per_split);
  return c;
}

// Arrivals that complete a stage: lane 0's (announcing the TMA bytes), plus, for fp8, one
// cp.async arrival per producer lane for the scales.
template <class Operands>
constexpr uint32_t kFullArrivals = Operands::kBlockScaled ? kProducerThreads + 1 : 1;

// ---------------------------------------------------------------- producer (one warp)
template <class Operands, int kCols>
__device__ void produce(const Params& p, SharedPlan<kCols>& sp, const CtaWork& c, int lane) {
  constexpr uint32_t kStageBytes = (kTileRows + kCols) * kRowBytes;  // the two boxes
  for (int kb = c.kb_begin, i = 0; kb < c.kb_end; ++kb, ++i) {
    const int stage = i % kStages;
    if (i >= kStages) ptx::mbarrier_wait(&sp.empty[stage], ((i / kStages) - 1) & 1);
    const int k0 = kb * Operands::kKBlock;
    if (lane == 0) {
      ptx::mbarrier_arrive_expect_tx(&sp.full[stage], kStageBytes);
      ptx::tma_load_3d(sp.w[stage], &p.w_map, k0, static_cast<int>(c.n0), c.batch, &sp.full[stage]);
      ptx::tma_load_3d(sp.x[stage], &p.x_map, k0, 0, c.batch, &sp.full[stage]);
    }
    if constexpr (Operands::kBlockScaled) {
      const float* x_scale = p.x_scale + c.batch * p.x_scale_batch_stride;
      const float* w_scale = p.w_scale + c.batch * p.w_scale_batch_stride + (c.n0 / 128) * p.w_scale_ld;
      for (int r = lane; r < kCols; r += 32)
        ptx::cp_async_4_zfill(&sp.x_scale[stage][r], r < p.T ? x_scale + kb * p.T + r : p.x_scale, r < p.T);
      if (lane == 0) ptx::cp_async_4_zfill(&sp.w_scale[stage], w_scale + kb, true);
      ptx::cp_async_arrive_noinc(&sp.full[stage]);
    }
  }
}

// ---------------------------------------------------------------- math (one warpgroup)
// Thread `tid` holds output columns n0 + acc_row(e) and tokens acc_col(e) (wgmma.cuh).
template <int kCols, class Acc>
__device__ __forceinline__ void store_totals(const Params& p, const CtaWork& c, const Acc& total, int tid) {
  CUTE_UNROLL
  for (int e = 0; e < cute::size(total); ++e) {  // unrolled: total stays in registers
    const int64_t n = c.n0 + acc_row(e, tid), t = acc_col(e, tid);
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

template <class Operands, int kCols>
__device__ void compute(const Params& p, SharedPlan<kCols>& sp, const CtaWork& c, int tid) {
  using namespace cute;
  using TiledMma = Mma<Operands, kCols>;
  using Elem = typename Operands::Elem;
  Tensor total = partition_fragment_C(TiledMma{}, Shape<Int<kTileRows>, Int<kCols>>{});
  Tensor slice = make_fragment_like(total);  // fp8: one K block's products
  clear(total);
  for (int kb = c.kb_begin, i = 0; kb < c.kb_end; ++kb, ++i) {
    const int stage = i % kStages;
    ptx::mbarrier_wait(&sp.full[stage], (i / kStages) & 1);
    auto sW = make_tensor(make_smem_ptr(reinterpret_cast<Elem*>(sp.w[stage])),
                          typename Operands::template Tile<kTileRows>{});
    auto sX = make_tensor(make_smem_ptr(reinterpret_cast<Elem*>(sp.x[stage])), typename Operands::template Tile<kCols>{});
    if constexpr (Operands::kBlockScaled) {
      wgmma_ss(TiledMma{}, sW, sX, slice, /*zero_init=*/true);
      wgmma_commit();
      wgmma_wait<0>();
      const float w_scale = sp.w_scale[stage];
      CUTE_UNROLL
      for (int e = 0; e < size(slice); ++e)
        total(e) = fmaf(slice(e), w_scale * sp.x_scale[stage][acc_col(e, tid)], total(e));
    } else {
      wgmma_ss(TiledMma{}, sW, sX, total, /*zero_init=*/i == 0);
      wgmma_commit();
      wgmma_wait<0>();
    }
    ptx::mbarrier_arrive(&sp.empty[stage]);  // products (and scales) read: the stage is free
  }
  store_totals<kCols>(p, c, total, tid);
}

// ---------------------------------------------------------------- entries
template <class Operands, int kCols>
__global__ void __launch_bounds__(kThreads, 1) skinny_gemm_kernel(const __grid_constant__ Params p) {
#if defined(__CUDA_ARCH__) && (__CUDA_ARCH__ >= 900)
  static_assert(kCols % 16 == 0 && kCols <= kSkinnyMaxTokens, "bad token tile");
  extern __shared__ uint8_t smem_raw[];
  auto& sp = *reinterpret_cast<SharedPlan<kCols>*>((reinterpret_cast<uintptr_t>(smem_raw) + 1023) & ~uintptr_t(1023));
  const CtaWork c = cta_work(p);
  if (threadIdx.x == 0) {
    for (int s = 0; s < kStages; ++s) {
      ptx::mbarrier_init(&sp.full[s], kFullArrivals<Operands>);
      ptx::mbarrier_init(&sp.empty[s], kMathThreads);
    }
    ptx::fence_barrier_init();
  }
  __syncthreads();
  if (threadIdx.x < kMathThreads)
    compute<Operands, kCols>(p, sp, c, static_cast<int>(threadIdx.x));
  else
    produce<Operands, kCols>(p, sp, c, static_cast<int>(threadIdx.x) % 32);
#endif
}

// y = Σ over splits of the partial sums, in split order.
__global__ void __launch_bounds__(kReduceThreads) reduce_splits_kernel(const Params p, int splits) {
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
  skinny_gemm_kernel<Operands, kCols><<<grid, kThreads, kSmem, stream>>>(p);
}

int64_t ceil_div(int64_t a, int64_t b) { return (a + b - 1) / b; }

// The token tile (wgmma N) of a problem of T <= kSkinnyMaxTokens tokens.
int token_tile(int64_t T) { return T <= 16 ? 16 : 32; }

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
void launch_tiles(const Params& p, int64_t T, dim3 grid, cudaStream_t stream) {
  if (token_tile(T) == 16)
    launch<Operands, 16>(p, grid, stream);
  else
    launch<Operands, 32>(p, grid, stream);
}

}  // namespace skinny

bool skinny_gemm_fits(const SkinnyGemm& g) {
  using namespace skinny;
  if (g.ab_dtype != DType::fp8_e4m3 && g.ab_dtype != DType::bf16) return false;
  const int64_t eb = static_cast<int64_t>(dtype_size(g.ab_dtype));
  const int64_t k_block = kRowBytes / eb;
  constexpr int64_t kMaxCoordinate = std::numeric_limits<int32_t>::max();  // TMA coordinates
  if (g.T < 1 || g.T > kSkinnyMaxTokens || g.K <= 0 || g.K % k_block != 0 || g.N <= 0 || g.N % kTileRows != 0 ||
      g.batch < 1 || g.batch > 65535 || g.N > kMaxCoordinate || g.K > kMaxCoordinate)
    return false;
  if (g.ab_dtype == DType::fp8_e4m3 && (g.x_scale == nullptr || g.w_scale == nullptr)) return false;
  if (!aligned16(g.x, row_pitch_bytes(g.x_ld, g.T, g.K, eb), g.x_batch_stride * eb) ||
      !aligned16(g.w, row_pitch_bytes(g.w_ld, g.N, g.K, eb), g.w_batch_stride * eb))
    return false;
  if (g.y_dtype != DType::bf16 && g.y_dtype != DType::fp32) return false;
  return g.batch * ceil_div(g.N, 128) < current_device_sm_count("skinny_gemm");
}

void skinny_gemm(const SkinnyGemm& g, Stream stream) {
  using namespace skinny;
  constexpr const char* kWhere = "skinny_gemm";
  DSV4_CHECK(skinny_gemm_fits(g), kWhere, ": a problem the kernel does not take (", dtype_name(g.ab_dtype), ", T ",
             g.T, ", N ", g.N, ", K ", g.K, ", batch ", g.batch, ")");
  const int64_t eb = static_cast<int64_t>(dtype_size(g.ab_dtype));
  Params p{};
  p.x_map = operand_map(g.ab_dtype, g.x, g.batch, g.T, g.K, g.x_ld, g.x_batch_stride, token_tile(g.T));
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

  // Split K until about two CTAs per SM (each CTA then streams a fraction of its weight rows),
  // as far as the workspace holds the partial sums and their traffic (written, then read back)
  // stays within half the weight's bytes: splits · T · N · 4 · 2 <= N · K · eb / 2.
  const int64_t sms = current_device_sm_count(kWhere);
  const int64_t tiles = g.N / kTileRows * g.batch;
  const int64_t partial_bytes = g.batch * g.T * g.N * static_cast<int64_t>(sizeof(float));
  int64_t splits = std::clamp<int64_t>(ceil_div(2 * sms, tiles), 1, p.kblocks);
  splits = std::min<int64_t>({splits, g.workspace != nullptr ? g.workspace_bytes / partial_bytes : 1,
                              g.K * eb / (16 * g.T), 65535});
  if (splits < 2) splits = 1;
  p.kblocks_per_split = static_cast<int>(ceil_div(p.kblocks, splits));
  splits = ceil_div(p.kblocks, p.kblocks_per_split);  // no empty split
  p.partial = splits > 1 ? static_cast<float*>(g.workspace) : nullptr;

  const dim3 grid(static_cast<unsigned>(g.N / kTileRows), static_cast<unsigned>(splits), static_cast<unsigned>(g.batch));
  if (g.ab_dtype == DType::fp8_e4m3)
    launch_tiles<Fp8Operands>(p, g.T, grid, stream);
  else
    launch_tiles<Bf16Operands>(p, g.T, grid, stream);
  check_launch(kWhere);
  if (splits > 1) {
    const int64_t blocks = std::clamp<int64_t>(ceil_div(partial_bytes / 4, kReduceThreads), 1, 4 * sms);
    reduce_splits_kernel<<<static_cast<unsigned>(blocks), kReduceThreads, 0, stream>>>(p, static_cast<int>(splits));
    check_launch(kWhere);
  }
}

}  // namespace dsv4::cuda

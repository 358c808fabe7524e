// The skinny block-scaled FP8 GEMM (skinny_fp8_gemm.h), sm_90a.
//
// Work split: CTA (n tile, split, batch) computes y[b][:, 64·n_tile …+64] over the K blocks
// [split · kblocks_per_split, …) for all T (≤ kSkinnyMaxTokens) tokens:
//   warpgroup 0 (128 threads): math — per K block C = W_tile · X_tileᵀ (wgmma m64 n{kCols} k32 × 4,
//                              fp32, from zero), then total += C · w_scale · x_scale[token];
//                              at the end the totals go to y (one split) or to the split's
//                              partial sums;
//   warp 4 (32 threads):       producer — per K block two TMA boxes, the 64 weight rows and the
//                              kCols token rows (128 bytes each, tokens past T zero-filled), and
//                              their scales with cp.async, into a ring of kStages stages (mbarriers
//                              full / empty). TMA, not per-lane cp.async, for the rows: one warp
//                              issuing 16-byte copies of a 24 KB stage held a V4 decode GEMM at
//                              45-100 µs (measured on the H200 with T = 128).
// W is the wgmma A operand (M = 64 output columns) and X the B operand (N = kCols tokens), so a
// decode step of a few tokens pads only the small operand. With more than one split, a second
// kernel adds the partial sums in split order and writes y.
#include "cuda/gemm/skinny_fp8_gemm.h"

#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include <algorithm>
#include <cstdint>
#include <limits>

#include "cuda/common/check.h"
#include "cuda/common/ptx.cuh"
#include "cuda/common/smem_layout.cuh"
#include "cuda/common/tma.h"
#include "cuda/common/wgmma.cuh"

#if !defined(DSV4_HAVE_CUTLASS)
#error "the skinny FP8 GEMM needs CuTe (third_party/cutlass)"
#endif

namespace dsv4::cuda {
namespace skinny_fp8 {

constexpr int kTileRows = 64;  // output columns (rows of w) per CTA = wgmma M
constexpr int kKBlock = 128;   // K per stage: one scale block, one 128-byte SW128 row
constexpr int kStages = 4;     // K blocks in flight per CTA
constexpr int kMathThreads = 128;
constexpr int kProducerThreads = 32;
constexpr int kThreads = kMathThreads + kProducerThreads;
constexpr int kReduceThreads = 256;

struct Params {
  CUtensorMap x_map;  // [batch, T, K] bytes, boxes of kCols × 128 (rows past T read as zeros)
  CUtensorMap w_map;  // [batch, N, K] bytes, boxes of 64 × 128
  const float* x_scale;
  int64_t x_scale_batch_stride;
  const float* w_scale;
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
  alignas(1024) uint8_t w[kStages][kTileRows * kKBlock];  // A operand: K-major SW128 fp8
  alignas(1024) uint8_t x[kStages][kCols * kKBlock];      // B operand, same layout
  float x_scale[kStages][kCols];                          // per token; 0 past T
  float w_scale[kStages];                                 // the tile's 128 × 128 block
  uint64_t full[kStages], empty[kStages];
};
template <int kCols>
constexpr int kSmemBytes = static_cast<int>(sizeof(SharedPlan<kCols>)) + 1024;  // + alignment

template <int kCols>
using Mma = decltype(cute::make_tiled_mma(
    cute::GMMA::ss_op_selector<fp8_e4m3_t, fp8_e4m3_t, float,
                               cute::Shape<cute::Int<kTileRows>, cute::Int<kCols>, cute::_32>>()));

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

// ---------------------------------------------------------------- producer (one warp)
template <int kCols>
__device__ void produce(const Params& p, SharedPlan<kCols>& sp, const CtaWork& c, int lane) {
  constexpr uint32_t kStageBytes = (kTileRows + kCols) * kKBlock;  // the two boxes
  const float* x_scale = p.x_scale + c.batch * p.x_scale_batch_stride;
  const float* w_scale = p.w_scale + c.batch * p.w_scale_batch_stride + (c.n0 / 128) * p.w_scale_ld;
  for (int kb = c.kb_begin, i = 0; kb < c.kb_end; ++kb, ++i) {
    const int stage = i % kStages;
    if (i >= kStages) ptx::mbarrier_wait(&sp.empty[stage], ((i / kStages) - 1) & 1);
    const int k0 = kb * kKBlock;
    if (lane == 0) {
      ptx::mbarrier_arrive_expect_tx(&sp.full[stage], kStageBytes);
      ptx::tma_load_3d(sp.w[stage], &p.w_map, k0, static_cast<int>(c.n0), c.batch, &sp.full[stage]);
      ptx::tma_load_3d(sp.x[stage], &p.x_map, k0, 0, c.batch, &sp.full[stage]);
    }
    for (int r = lane; r < kCols; r += 32)
      ptx::cp_async_4_zfill(&sp.x_scale[stage][r], r < p.T ? x_scale + kb * p.T + r : p.x_scale, r < p.T);
    if (lane == 0) ptx::cp_async_4_zfill(&sp.w_scale[stage], w_scale + kb, true);
    ptx::cp_async_arrive_noinc(&sp.full[stage]);
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

template <int kCols>
__device__ void compute(const Params& p, SharedPlan<kCols>& sp, const CtaWork& c, int tid) {
  using namespace cute;
  using TiledMma = Mma<kCols>;
  Tensor acc = partition_fragment_C(TiledMma{}, Shape<Int<kTileRows>, Int<kCols>>{});
  Tensor total = make_fragment_like(acc);
  clear(total);
  for (int kb = c.kb_begin, i = 0; kb < c.kb_end; ++kb, ++i) {
    const int stage = i % kStages;
    ptx::mbarrier_wait(&sp.full[stage], (i / kStages) & 1);
    ptx::fence_proxy_async_smem();  // the cp.async bytes are read by wgmma (the async proxy)
    auto sW = make_tensor(make_smem_ptr(reinterpret_cast<fp8_e4m3_t*>(sp.w[stage])), SmemTileKFp8x128<kTileRows>{});
    auto sX = make_tensor(make_smem_ptr(reinterpret_cast<fp8_e4m3_t*>(sp.x[stage])), SmemTileKFp8x128<kCols>{});
    wgmma_ss(TiledMma{}, sW, sX, acc, /*zero_init=*/true);
    wgmma_commit();
    wgmma_wait<0>();
    const float w_scale = sp.w_scale[stage];
    CUTE_UNROLL
    for (int e = 0; e < size(acc); ++e)
      total(e) = fmaf(acc(e), w_scale * sp.x_scale[stage][acc_col(e, tid)], total(e));
    ptx::mbarrier_arrive(&sp.empty[stage]);  // products and scales read: the stage is free
  }
  store_totals<kCols>(p, c, total, tid);
}

// ---------------------------------------------------------------- entries
template <int kCols>
__global__ void __launch_bounds__(kThreads, 1) skinny_fp8_gemm_kernel(const __grid_constant__ Params p) {
#if defined(__CUDA_ARCH__) && (__CUDA_ARCH__ >= 900)
  static_assert(kCols % 16 == 0 && kCols <= kSkinnyMaxTokens, "bad token tile");
  extern __shared__ uint8_t smem_raw[];
  auto& sp = *reinterpret_cast<SharedPlan<kCols>*>((reinterpret_cast<uintptr_t>(smem_raw) + 1023) & ~uintptr_t(1023));
  const CtaWork c = cta_work(p);
  if (threadIdx.x == 0) {
    for (int s = 0; s < kStages; ++s) {
      // One cp.async arrival per producer lane, plus lane 0's arrival announcing the TMA bytes.
      ptx::mbarrier_init(&sp.full[s], kProducerThreads + 1);
      ptx::mbarrier_init(&sp.empty[s], kMathThreads);
    }
    ptx::fence_barrier_init();
  }
  __syncthreads();
  if (threadIdx.x < kMathThreads)
    compute<kCols>(p, sp, c, static_cast<int>(threadIdx.x));
  else
    produce<kCols>(p, sp, c, static_cast<int>(threadIdx.x) % 32);
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

template <int kCols>
void launch(const Params& p, dim3 grid, cudaStream_t stream) {
  constexpr int kSmem = kSmemBytes<kCols>;
  static const bool attribute_set = [] {
    DSV4_CUDA_CHECK("skinny_fp8_gemm", cudaFuncSetAttribute(skinny_fp8_gemm_kernel<kCols>,
                                                            cudaFuncAttributeMaxDynamicSharedMemorySize, kSmem));
    return true;
  }();
  (void)attribute_set;
  skinny_fp8_gemm_kernel<kCols><<<grid, kThreads, kSmem, stream>>>(p);
}

int sm_count() {
  constexpr int kMaxDevices = 64;
  static int cached[kMaxDevices] = {};
  int device = 0;
  DSV4_CUDA_CHECK("skinny_fp8_gemm", cudaGetDevice(&device));
  if (device >= 0 && device < kMaxDevices && cached[device] > 0) return cached[device];
  int sms = 0;
  DSV4_CUDA_CHECK("skinny_fp8_gemm", cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, device));
  if (device >= 0 && device < kMaxDevices) cached[device] = sms;
  return sms;
}

int64_t ceil_div(int64_t a, int64_t b) { return (a + b - 1) / b; }

// The token tile (wgmma N) of a problem of T <= kSkinnyMaxTokens tokens.
int token_tile(int64_t T) { return T <= 16 ? 16 : 32; }

// The TMA map of a [batch, rows, K] fp8 operand read in boxes of box_rows × 128 bytes (one SW128
// span per row). One batch: any 16-byte multiple serves as the unused batch stride.
CUtensorMap byte_matrix_map(const void* base, int64_t batch, int64_t rows, int64_t K, int64_t ld, int64_t batch_stride,
                            int box_rows) {
  const uint64_t dims[3] = {static_cast<uint64_t>(K), static_cast<uint64_t>(rows), static_cast<uint64_t>(batch)};
  const uint64_t strides[2] = {static_cast<uint64_t>(ld),
                               static_cast<uint64_t>(batch > 1 ? batch_stride : ld * rows)};
  const uint32_t box[3] = {static_cast<uint32_t>(kKBlock), static_cast<uint32_t>(box_rows), 1};
  return make_tensor_map_u8_sw128("skinny_fp8_gemm", base, 3, dims, strides, box);
}

bool aligned16(const void* p, int64_t ld, int64_t batch_stride) {
  return (reinterpret_cast<uintptr_t>(p) | static_cast<uint64_t>(ld) | static_cast<uint64_t>(batch_stride)) % 16 == 0;
}

}  // namespace skinny_fp8

bool skinny_fp8_gemm_fits(const SkinnyFp8Gemm& g) {
  using namespace skinny_fp8;
  if (g.T < 1 || g.T > kSkinnyMaxTokens || g.K <= 0 || g.K % kKBlock != 0 || g.N <= 0 ||
      g.N % kTileRows != 0 || g.batch < 1 || g.batch > 65535 || g.N > int64_t{std::numeric_limits<int32_t>::max()} || g.K > int64_t{std::numeric_limits<int32_t>::max()})
    return false;
  if (!aligned16(g.x, g.x_ld, g.x_batch_stride) || !aligned16(g.w, g.w_ld, g.w_batch_stride)) return false;
  if (g.y_dtype != DType::bf16 && g.y_dtype != DType::fp32) return false;
  return g.batch * ceil_div(g.N, 128) < sm_count();
}

void skinny_fp8_gemm(const SkinnyFp8Gemm& g, Stream stream) {
  using namespace skinny_fp8;
  constexpr const char* kWhere = "skinny_fp8_gemm";
  DSV4_CHECK(skinny_fp8_gemm_fits(g), kWhere, ": a problem the kernel does not take (T ", g.T, ", N ", g.N,
             ", K ", g.K, ", batch ", g.batch, ")");
  Params p{};
  p.x_map = byte_matrix_map(g.x, g.batch, g.T, g.K, g.x_ld, g.x_batch_stride, token_tile(g.T));
  p.w_map = byte_matrix_map(g.w, g.batch, g.N, g.K, g.w_ld, g.w_batch_stride, kTileRows);
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
  p.kblocks = static_cast<int>(g.K / kKBlock);

  // Split K until about two CTAs per SM (each CTA then streams a fraction of its weight rows),
  // as far as the workspace holds the partial sums and their traffic (written, then read back)
  // stays within half the weight's bytes: splits · T · N · 4 · 2 <= N · K / 2.
  const int64_t tiles = g.N / kTileRows * g.batch;
  const int64_t partial_bytes = g.batch * g.T * g.N * static_cast<int64_t>(sizeof(float));
  int64_t splits = std::clamp<int64_t>(ceil_div(2 * int64_t{sm_count()}, tiles), 1, p.kblocks);
  splits = std::min<int64_t>({splits, g.workspace != nullptr ? g.workspace_bytes / partial_bytes : 1,
                              g.K / (16 * g.T), 65535});
  if (splits < 2) splits = 1;
  p.kblocks_per_split = static_cast<int>(ceil_div(p.kblocks, splits));
  splits = ceil_div(p.kblocks, p.kblocks_per_split);  // no empty split
  p.partial = splits > 1 ? static_cast<float*>(g.workspace) : nullptr;

  const dim3 grid(static_cast<unsigned>(g.N / kTileRows), static_cast<unsigned>(splits), static_cast<unsigned>(g.batch));
  if (token_tile(g.T) == 16)
    launch<16>(p, grid, stream);
  else
    launch<32>(p, grid, stream);
  check_launch(kWhere);
  if (splits > 1) {
    const int64_t blocks = std::clamp<int64_t>(ceil_div(partial_bytes / 4, kReduceThreads), 1, 4 * int64_t{sm_count()});
    reduce_splits_kernel<<<static_cast<unsigned>(blocks), kReduceThreads, 0, stream>>>(p, static_cast<int>(splits));
    check_launch(kWhere);
  }
}

}  // namespace dsv4::cuda

// The sparse FP8 decode kernel (split-KV), templated on the cache layout.
//
// Per CTA: one query token row, 64 heads, one split of the index list. Per tile of 64 slots:
//   1. gather  — cp.async copies each selected token's bytes (fp8 nope + scales + bf16 rope) from
//                the paged cache into a raw staging tile; invalid slots are zero-filled.
//   2. dequant — all threads turn the raw tile into a bf16 [64, d_qk] tile (fp8 · scale is exact
//                in bf16), which is K for S = Q·Kᵀ and, through its first 512 columns, V.
//   3. compute — 8 warps: warp (g, half) owns heads 16g..16g+15; for S it takes keys
//                32·half..+32, for O += P·V it takes value dims 256·half..+256. The two halves
//                exchange row maxima and the bf16 P through shared memory.
// The gather of tile t+1 runs while tile t is dequantized-and-multiplied (one raw stage).
// Softmax runs in base 2 (exp2) with the logits pre-multiplied by scale·log2(e).
#pragma once

#include <cuda_fp16.h>
#include <cuda_fp8.h>

#include <cmath>

#include "cuda/attention/sparse_decode/config.h"
#include "cuda/common/check.h"
#include "cuda/common/cp_async.cuh"
#include "cuda/common/ptx.cuh"
#include "cuda/common/smem_layout.cuh"
#include "cuda/common/warp_mma.cuh"
#include "cuda/common/wgmma.cuh"
#include "dsv4/dtype.h"

namespace dsv4::cuda::decode {

namespace detail {

struct KeySource {
  const uint8_t* row = nullptr;     // token data (V32: the whole token)
  const uint8_t* scales = nullptr;  // MODEL1: the token's 8-byte scale row
  bool valid = false;
};

// Where slot `pos` of the concatenated list [main | extra] of query row `row` lives, if valid.
// Scope fields are picked one by one with selects: a run-time choice of a whole struct inside the
// kernel parameters could be copied to local memory.
template <KvLayout L>
__device__ __forceinline__ KeySource resolve_key(const DecodeParams& p, int row, int pos,
                                                 int split_end) {
  KeySource src;
  if (pos >= split_end) return src;
  const bool in_main = pos < p.main.topk;
  const int topk = in_main ? p.main.topk : p.extra.topk;
  const int32_t* lengths = in_main ? p.main.topk_length : p.extra.topk_length;
  const int local = in_main ? pos : pos - p.main.topk;
  const int len = lengths != nullptr ? min(topk, lengths[row / p.s_q]) : topk;
  if (local >= len) return src;
  const int32_t* indices = in_main ? p.main.indices : p.extra.indices;
  const int32_t idx = indices[static_cast<int64_t>(row) * topk + local];
  if (idx < 0 || idx >= (in_main ? p.main.num_slots : p.extra.num_slots)) return src;
  const int block_size = in_main ? p.main.block_size : p.extra.block_size;
  const int block = idx / block_size;
  const int offset = idx - block * block_size;
  const uint8_t* base = (in_main ? p.main.cache : p.extra.cache) +
                        block * (in_main ? p.main.block_stride : p.extra.block_stride);
  if constexpr (L == KvLayout::model1_fp8) {
    src.row = base + offset * model1::kDataBytes;
    src.scales = base + static_cast<int64_t>(block_size) * model1::kDataBytes +
                 offset * model1::kScaleBytes;
  } else {
    src.row = base + offset * v32::kTokenBytes;
  }
  src.valid = true;
  return src;
}

// Step 1: start the gather of the tile at `tile_start` into the raw stage, and record which of
// its slots are valid (read by the masking of the same tile). Four threads share one slot, so
// each resolves its index once and the four copy interleaved 16-byte chunks of the row.
template <KvLayout L>
__device__ __forceinline__ void issue_gather(const DecodeParams& p, int row, int tile_start,
                                             int split_end, uint8_t* raw, uint8_t* key_valid) {
  using T = LayoutTraits<L>;
  constexpr int kThreadsPerKey = kThreads / kTileKeys;
  static_assert(kThreadsPerKey * kTileKeys == kThreads);
  constexpr int kCopies = T::kDataChunks + (L == KvLayout::model1_fp8 ? 1 : 0);
  const int key = threadIdx.x / kThreadsPerKey;
  const int sub = threadIdx.x % kThreadsPerKey;
  const KeySource src = resolve_key<L>(p, row, tile_start + key, split_end);
  uint8_t* dst = raw + key * T::kRawRowBytes;
  const uint8_t* dummy = p.main.cache;  // never read: src-size 0
#pragma unroll
  for (int c = sub; c < kCopies; c += kThreadsPerKey) {
    if (c < T::kDataChunks) {
      ptx::cp_async_16_zfill(dst + c * 16, src.valid ? src.row + c * 16 : dummy, src.valid);
    } else {
      ptx::cp_async_8_zfill(dst + T::kRawScaleOffset, src.valid ? src.scales : dummy, src.valid);
    }
  }
  if (sub == 0) key_valid[key] = src.valid ? 1 : 0;
}

// Four fp8 e4m3 values (little-endian in a word) times `scale` → two bf16x2 words (exact).
__device__ __forceinline__ uint2 dequant4(uint32_t fp8x4, float scale) {
  const __half2 lo = __half2(__nv_cvt_fp8x2_to_halfraw2(
      static_cast<__nv_fp8x2_storage_t>(fp8x4 & 0xffffu), __NV_E4M3));
  const __half2 hi = __half2(__nv_cvt_fp8x2_to_halfraw2(
      static_cast<__nv_fp8x2_storage_t>(fp8x4 >> 16), __NV_E4M3));
  const float2 a = __half22float2(lo), b = __half22float2(hi);
  return make_uint2(warp::pack_bf16x2(a.x * scale, a.y * scale),
                    warp::pack_bf16x2(b.x * scale, b.y * scale));
}

// Step 2: raw tile → bf16 [64, d_qk] K-major SW128 tile (smem_layout.cuh). Unit u < kNope/16 converts 16 fp8
// values; the remaining 8 units copy the bf16 rope (16 B each).
template <KvLayout L>
__device__ __forceinline__ void dequantize_tile(const uint8_t* raw, uint8_t* kv) {
  using T = LayoutTraits<L>;
  constexpr int kNopeUnits = T::kNope / 16;
  constexpr int kUnits = kNopeUnits + 8;
  for (int i = threadIdx.x; i < kTileKeys * kUnits; i += kThreads) {
    const int key = i / kUnits;
    const int u = i - key * kUnits;
    const uint8_t* src = raw + key * T::kRawRowBytes;
    if (u < kNopeUnits) {
      const uint4 v = *reinterpret_cast<const uint4*>(src + u * 16);
      const int blk = u * 16 / T::kQuantBlock;
      float scale;
      if constexpr (L == KvLayout::model1_fp8) {
        scale = ue8m0_to_float(src[T::kRawScaleOffset + blk]);
      } else {
        scale = reinterpret_cast<const float*>(src + T::kRawScaleOffset)[blk];
      }
      const uint2 a = dequant4(v.x, scale), b = dequant4(v.y, scale);
      const uint2 c = dequant4(v.z, scale), d = dequant4(v.w, scale);
      *reinterpret_cast<uint4*>(kv + sw128_chunk_offset<kTileKeys>(key, 2 * u)) =
          make_uint4(a.x, a.y, b.x, b.y);
      *reinterpret_cast<uint4*>(kv + sw128_chunk_offset<kTileKeys>(key, 2 * u + 1)) =
          make_uint4(c.x, c.y, d.x, d.y);
    } else {
      const int r = u - kNopeUnits;
      *reinterpret_cast<uint4*>(kv + sw128_chunk_offset<kTileKeys>(key, T::kNope / 8 + r)) =
          *reinterpret_cast<const uint4*>(src + T::kRopeOffset + r * 16);
    }
  }
}

// ---- the two products of a tile, per warpgroup (half) -------------------------------------
// Accumulators use the m64nN wgmma fragment order, which is also the order of 16×8 mma.sync
// tiles stacked by warp: element i of a warp's 16-row slice sits at row lane/4 + 8·((i/2)%2),
// column 8·(i/4) + 2·(lane%4) + i%2. kWgmma picks the tensor-core path (measured A/B).
using MmaQK = decltype(cute::make_tiled_mma(
    cute::GMMA::MMA_64x32x16_F32BF16BF16_SS<cute::GMMA::Major::K, cute::GMMA::Major::K>{}));
using MmaPV = decltype(cute::make_tiled_mma(
    cute::GMMA::MMA_64x256x16_F32BF16BF16_SS<cute::GMMA::Major::K, cute::GMMA::Major::MN>{}));

// s[16] = Q (64 heads × d_qk) · K[32·half .. +32]ᵀ for this warp's 16 heads.
template <KvLayout L, bool kWgmma>
__device__ __forceinline__ void qk_product(float (&s)[16], const uint8_t* q_tile, const uint8_t* kv_tile,
                                           int half) {
  constexpr int kDqk = LayoutTraits<L>::kDqk;
  if constexpr (kWgmma) {
    using namespace cute;
    Tensor sQ = make_tensor(make_smem_ptr(reinterpret_cast<const bf16_t*>(q_tile)), SmemTileK<kHeadsPerCta, kDqk>{});
    Tensor sK = local_tile(make_tensor(make_smem_ptr(reinterpret_cast<const bf16_t*>(kv_tile)),
                                       SmemTileK<kTileKeys, kDqk>{}),
                           Shape<_32, Int<kDqk>>{}, make_coord(half, 0));
    Tensor rS = make_tensor(make_rmem_ptr(&s[0]), partition_fragment_C(MmaQK{}, Shape<_64, _32>{}).layout());
    wgmma_ss(MmaQK{}, sQ, sK, rS, true);
    wgmma_commit();
    wgmma_wait<0>();
  } else {
    const int lane = threadIdx.x % 32, group = (threadIdx.x / 32) % 4;
    const uint32_t q_base = ptx::smem_addr(q_tile), kv_base = ptx::smem_addr(kv_tile);
    const int a_row = group * 16 + (lane % 16);
#pragma unroll
    for (int i = 0; i < 16; ++i) s[i] = 0.0f;
#pragma unroll 4
    for (int ks = 0; ks < kDqk / 16; ++ks) {
      uint32_t a[4];
      warp::ldmatrix_x4(a, q_base + sw128_chunk_offset<kHeadsPerCta>(a_row, 2 * ks + lane / 16));
#pragma unroll
      for (int jp = 0; jp < 2; ++jp) {
        const int key = half * 32 + jp * 16 + (lane % 8) + 8 * (lane / 16);
        uint32_t b[4];
        warp::ldmatrix_x4(b, kv_base + sw128_chunk_offset<kTileKeys>(key, 2 * ks + (lane / 8) % 2));
        warp::mma_bf16_16816(*reinterpret_cast<float(*)[4]>(&s[8 * jp]), a, b[0], b[1]);
        warp::mma_bf16_16816(*reinterpret_cast<float(*)[4]>(&s[8 * jp + 4]), a, b[2], b[3]);
      }
    }
  }
}

// o[128] += P (64 heads × 64 keys, bf16) · V[:, 256·half .. +256] for this warp's 16 heads.
template <KvLayout L, bool kWgmma>
__device__ __forceinline__ void pv_product(float (&o)[128], const uint8_t* p_tile, const uint8_t* kv_tile,
                                           int half) {
  constexpr int kDqk = LayoutTraits<L>::kDqk;
  if constexpr (kWgmma) {
    using namespace cute;
    Tensor sP = make_tensor(make_smem_ptr(reinterpret_cast<const bf16_t*>(p_tile)), SmemTileK<kHeadsPerCta, kTileKeys>{});
    Tensor sV = local_tile(make_tensor(make_smem_ptr(reinterpret_cast<const bf16_t*>(kv_tile)),
                                       SmemTileKTransposed<kTileKeys, kDqk>{}),
                           Shape<_256, Int<kTileKeys>>{}, make_coord(half, 0));
    Tensor rO = make_tensor(make_rmem_ptr(&o[0]), partition_fragment_C(MmaPV{}, Shape<_64, _256>{}).layout());
    wgmma_ss(MmaPV{}, sP, sV, rO, false);
    wgmma_commit();
    wgmma_wait<0>();
  } else {
    const int lane = threadIdx.x % 32, group = (threadIdx.x / 32) % 4;
    const uint32_t p_base = ptx::smem_addr(p_tile), kv_base = ptx::smem_addr(kv_tile);
    const int a_row = group * 16 + (lane % 16);
#pragma unroll
    for (int kk = 0; kk < kTileKeys / 16; ++kk) {
      uint32_t a[4];
      warp::ldmatrix_x4(a, p_base + sw128_chunk_offset<kHeadsPerCta>(a_row, 2 * kk + lane / 16));
      const int key = kk * 16 + (lane % 8) + 8 * ((lane / 8) % 2);
#pragma unroll
      for (int jp = 0; jp < 16; ++jp) {
        const int chunk = (half * 256 + jp * 16) / 8 + lane / 16;
        uint32_t b[4];
        warp::ldmatrix_x4_trans(b, kv_base + sw128_chunk_offset<kTileKeys>(key, chunk));
        warp::mma_bf16_16816(*reinterpret_cast<float(*)[4]>(&o[8 * jp]), a, b[0], b[1]);
        warp::mma_bf16_16816(*reinterpret_cast<float(*)[4]>(&o[8 * jp + 4]), a, b[2], b[3]);
      }
    }
  }
}

}  // namespace detail

template <KvLayout L, bool kWgmma>
__global__ void __launch_bounds__(kThreads, 1) sparse_decode_kernel(const __grid_constant__ DecodeParams p) {
  using T = LayoutTraits<L>;
  using S = SmemPlan<L>;
  constexpr int kKSteps = T::kDqk / 16;
  extern __shared__ __align__(128) uint8_t smem[];
  uint8_t* q_tile = smem + S::kQ;
  uint8_t* kv_tile = smem + S::kKv;
  uint8_t* raw_tile = smem + S::kRaw;
  uint8_t* p_tile = smem + S::kP;
  float* row_max_x = reinterpret_cast<float*>(smem + S::kRowMax);
  float* row_sum_x = reinterpret_cast<float*>(smem + S::kRowSum);
  uint8_t* key_valid = smem + S::kKeyValid;

  const int num_head_blocks = (p.num_heads + kHeadsPerCta - 1) / kHeadsPerCta;
  const int head_block = blockIdx.x % num_head_blocks;
  const int split = blockIdx.x / num_head_blocks;
  const int row = blockIdx.y;
  const int split_begin = split * p.split_len;
  const int split_end = min(split_begin + p.split_len, p.topk_total);
  const int num_tiles = split_end > split_begin ? (split_end - split_begin + kTileKeys - 1) / kTileKeys : 0;

  const int warp_id = threadIdx.x / 32, lane = threadIdx.x % 32;
  const int group = warp_id % 4, half = warp_id / 4;
  const int g = lane / 4, q4 = lane % 4;  // fragment row / column-pair of this lane

  // Query rows of this head block (zero rows past H), laid out like the KV tile.
  {
    constexpr int kChunks = T::kDqk / 8;
    for (int i = threadIdx.x; i < kHeadsPerCta * kChunks; i += kThreads) {
      const int r = i / kChunks, c = i - r * kChunks;
      const int h = head_block * kHeadsPerCta + r;
      const bool ok = h < p.num_heads;
      const uint16_t* src = p.q + static_cast<int64_t>(row) * p.q_row_stride +
                            static_cast<int64_t>(ok ? h : 0) * p.q_head_stride + c * 8;
      ptx::cp_async_16_zfill(q_tile + sw128_chunk_offset<kHeadsPerCta>(r, c), src, ok);
    }
  }
  if (num_tiles > 0) detail::issue_gather<L>(p, row, split_begin, split_end, raw_tile, key_valid);
  ptx::cp_async_commit();

  float o_acc[128];  // 16 heads × 256 value dims of this warp
#pragma unroll
  for (int i = 0; i < 128; ++i) o_acc[i] = 0.0f;
  float m_run[2] = {-INFINITY, -INFINITY};  // rows g, g+8 (base-2 logits)
  float l_run[2] = {0.0f, 0.0f};            // this lane's share of the row sums


  for (int t = 0; t < num_tiles; ++t) {
    ptx::cp_async_wait<0>();
    __syncthreads();  // raw tile t landed; tile t-1's S/P/V reads are finished
    detail::dequantize_tile<L>(raw_tile, kv_tile);
    ptx::fence_proxy_async_smem();  // the tensor cores read Q (cp.async) and K/V (st.shared)
    __syncthreads();
    const uint8_t* valid = key_valid + (t & 1) * kTileKeys;
    if (t + 1 < num_tiles) {
      detail::issue_gather<L>(p, row, split_begin + (t + 1) * kTileKeys, split_end, raw_tile,
                              key_valid + ((t + 1) & 1) * kTileKeys);
    }
    ptx::cp_async_commit();

    // ---- S = Q·Kᵀ for 16 heads × 32 keys --------------------------------------------------
    float s_acc[16];
    detail::qk_product<L, kWgmma>(s_acc, q_tile, kv_tile, half);

    // ---- online softmax (base 2) -----------------------------------------------------------
    float tile_max[2] = {-INFINITY, -INFINITY};
#pragma unroll
    for (int j = 0; j < 4; ++j) {
      const int col = half * 32 + j * 8 + 2 * q4;
      const bool v0 = valid[col] != 0, v1 = valid[col + 1] != 0;
      s_acc[4 * j + 0] = v0 ? s_acc[4 * j + 0] * p.scale_log2 : -INFINITY;
      s_acc[4 * j + 1] = v1 ? s_acc[4 * j + 1] * p.scale_log2 : -INFINITY;
      s_acc[4 * j + 2] = v0 ? s_acc[4 * j + 2] * p.scale_log2 : -INFINITY;
      s_acc[4 * j + 3] = v1 ? s_acc[4 * j + 3] * p.scale_log2 : -INFINITY;
      tile_max[0] = fmaxf(tile_max[0], fmaxf(s_acc[4 * j + 0], s_acc[4 * j + 1]));
      tile_max[1] = fmaxf(tile_max[1], fmaxf(s_acc[4 * j + 2], s_acc[4 * j + 3]));
    }
#pragma unroll
    for (int r = 0; r < 2; ++r) {
      tile_max[r] = fmaxf(tile_max[r], __shfl_xor_sync(0xffffffffu, tile_max[r], 1));
      tile_max[r] = fmaxf(tile_max[r], __shfl_xor_sync(0xffffffffu, tile_max[r], 2));
    }
    if (q4 == 0) {
      row_max_x[half * kHeadsPerCta + group * 16 + g] = tile_max[0];
      row_max_x[half * kHeadsPerCta + group * 16 + g + 8] = tile_max[1];
    }
    ptx::named_barrier_sync(1 + group, 64);  // the two warps of this head group
    float corr[2], m_use[2];
#pragma unroll
    for (int r = 0; r < 2; ++r) {
      const float other = row_max_x[(1 - half) * kHeadsPerCta + group * 16 + g + 8 * r];
      const float m_new = fmaxf(m_run[r], fmaxf(tile_max[r], other));
      m_use[r] = m_new == -INFINITY ? 0.0f : m_new;  // all masked so far: keep exp2 finite
      corr[r] = exp2f(m_run[r] - m_use[r]);           // m_run = -inf → 0
      m_run[r] = m_new;
      l_run[r] *= corr[r];
    }
#pragma unroll
    for (int j = 0; j < 4; ++j) {
      const float p0 = exp2f(s_acc[4 * j + 0] - m_use[0]), p1 = exp2f(s_acc[4 * j + 1] - m_use[0]);
      const float p2 = exp2f(s_acc[4 * j + 2] - m_use[1]), p3 = exp2f(s_acc[4 * j + 3] - m_use[1]);
      l_run[0] += p0 + p1;
      l_run[1] += p2 + p3;
      const int chunk = half * 4 + j;  // 8 keys = one 16-byte chunk of a P row
      const int prow = group * 16 + g;
      *reinterpret_cast<uint32_t*>(p_tile + sw128_chunk_offset<kHeadsPerCta>(prow, chunk) + 4 * q4) =
          warp::pack_bf16x2(p0, p1);
      *reinterpret_cast<uint32_t*>(p_tile + sw128_chunk_offset<kHeadsPerCta>(prow + 8, chunk) + 4 * q4) =
          warp::pack_bf16x2(p2, p3);
    }
#pragma unroll
    for (int j = 0; j < 32; ++j) {
      o_acc[4 * j + 0] *= corr[0];
      o_acc[4 * j + 1] *= corr[0];
      o_acc[4 * j + 2] *= corr[1];
      o_acc[4 * j + 3] *= corr[1];
    }
    ptx::fence_proxy_async_smem();
    __syncthreads();  // P of both halves written (each warpgroup reads all 64 rows × 64 keys)

    // ---- O += P·V for 16 heads × 256 value dims --------------------------------------------
    detail::pv_product<L, kWgmma>(o_acc, p_tile, kv_tile, half);
  }

  ptx::cp_async_wait<0>();  // nothing may land after the CTA is gone (num_tiles == 0)

  // ---- finish: full row sums, normalise, write -----------------------------------------------
#pragma unroll
  for (int r = 0; r < 2; ++r) {
    l_run[r] += __shfl_xor_sync(0xffffffffu, l_run[r], 1);
    l_run[r] += __shfl_xor_sync(0xffffffffu, l_run[r], 2);
  }
  if (q4 == 0) {
    row_sum_x[half * kHeadsPerCta + group * 16 + g] = l_run[0];
    row_sum_x[half * kHeadsPerCta + group * 16 + g + 8] = l_run[1];
  }
  __syncthreads();
#pragma unroll
  for (int r = 0; r < 2; ++r) {
    const int hr = group * 16 + g + 8 * r;
    const int h = head_block * kHeadsPerCta + hr;
    if (h >= p.num_heads) continue;
    const float l = l_run[r] + row_sum_x[(1 - half) * kHeadsPerCta + hr];
    const bool empty = !(l > 0.0f);
    const float lse = empty ? -INFINITY : (m_run[r] + log2f(l)) * 0.69314718055994531f;
    const int64_t out_row = static_cast<int64_t>(row) * p.num_heads + h;
    float factor = empty ? 0.0f : 1.0f / l;
    if (p.num_splits == 1) {
      if (!empty && p.sink != nullptr) factor /= 1.0f + expf(p.sink[h] - lse);
      uint16_t* dst = p.out + out_row * kDv + half * 256 + 2 * q4;
#pragma unroll
      for (int j = 0; j < 32; ++j) {
        *reinterpret_cast<uint32_t*>(dst + j * 8) =
            warp::pack_bf16x2(o_acc[4 * j + 2 * r] * factor, o_acc[4 * j + 2 * r + 1] * factor);
      }
      if (half == 0 && q4 == 0) p.lse[out_row] = empty ? INFINITY : lse;
    } else {
      float* dst = p.partial_o + (out_row * p.num_splits + split) * kDv + half * 256 + 2 * q4;
#pragma unroll
      for (int j = 0; j < 32; ++j) {
        *reinterpret_cast<float2*>(dst + j * 8) =
            make_float2(o_acc[4 * j + 2 * r] * factor, o_acc[4 * j + 2 * r + 1] * factor);
      }
      if (half == 0 && q4 == 0) p.partial_lse[out_row * p.num_splits + split] = lse;
    }
  }
}

template <KvLayout L, bool kWgmma>
void launch_sparse_decode(const DecodeParams& params, cudaStream_t stream) {
  constexpr int kSmem = SmemPlan<L>::kBytes;
  static const cudaError_t attr_status = cudaFuncSetAttribute(
      sparse_decode_kernel<L, kWgmma>, cudaFuncAttributeMaxDynamicSharedMemorySize, kSmem);
  check_cuda(attr_status, "sparse_decode", "cudaFuncSetAttribute(max dynamic shared memory)");
  const int num_head_blocks = (params.num_heads + kHeadsPerCta - 1) / kHeadsPerCta;
  const dim3 grid(num_head_blocks * params.num_splits, params.num_rows);
  sparse_decode_kernel<L, kWgmma><<<grid, kThreads, kSmem, stream>>>(params);
  check_launch("sparse_decode");
}

}  // namespace dsv4::cuda::decode

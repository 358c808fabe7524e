// What both sparse attention kernels do with one tile of 64 heads × 64 gathered keys: the three
// wgmma products (S = Q·Kᵀ, O[:, 256 dims] += P·V with P from registers or from shared memory),
// the online-softmax step on S's accumulator fragment (wgmma.cuh: element i of a thread sits at
// acc_row(i), acc_col(i); a thread holds rows acc_row(0) and acc_row(0) + 8), the store of the
// resulting P into a K-major SW128 tile that another warpgroup's wgmma reads, and the normalised
// O's way out (16-byte chunks, or staged in a tile by stmatrix).
#pragma once

#if defined(DSV4_HAVE_CUTLASS)
#include <cmath>
#include <cstdint>
#include <type_traits>

#include <cute/arch/copy_sm90.hpp>

#include "cuda/common/fp8_convert.cuh"
#include "cuda/common/smem_layout.cuh"
#include "cuda/common/wgmma.cuh"

namespace dsv4::cuda {

// S = Q·Kᵀ: M 64 heads, N 64 keys, K over d_qk; both operands K-major in shared memory.
using MmaS = decltype(cute::make_tiled_mma(
    cute::GMMA::MMA_64x64x16_F32BF16BF16_SS<cute::GMMA::Major::K, cute::GMMA::Major::K>{}));
// S = −Q·Kᵀ (the instruction negates A for free): for a negative softmax scale c, S·c = (−S)·|c|,
// so a kernel can hand online_softmax_tile<true> a positive scale (see there).
using MmaSNegated = decltype(cute::make_tiled_mma(
    cute::GMMA::MMA_64x64x16_F32BF16BF16_SS<cute::GMMA::Major::K, cute::GMMA::Major::K, cute::GMMA::ScaleIn::Neg>{}));
// O[:, 256 value dims] += P·V: P (64 heads × 64 keys) from registers or from shared memory; V is
// the gathered tile read MN-major (K = V).
using MmaPvRegs = decltype(cute::make_tiled_mma(
    cute::GMMA::MMA_64x256x16_F32BF16BF16_RS<cute::GMMA::Major::K, cute::GMMA::Major::MN>{}));
using MmaPvSmem = decltype(cute::make_tiled_mma(
    cute::GMMA::MMA_64x256x16_F32BF16BF16_SS<cute::GMMA::Major::K, cute::GMMA::Major::MN>{}));
// The same products as two 64×128 instructions per K step, for a kernel launched with fewer
// registers per thread (at most 128: 512 threads) than one 64×256 instruction names (its 128
// accumulators and more); setmaxnreg gives the warpgroup its registers only after launch. Their
// fragments hold the same elements in the same order (the first instruction's 64 values are the
// 64×256 one's first 64: columns 0-127).
using MmaPvRegsN128 = decltype(cute::make_tiled_mma(
    cute::GMMA::MMA_64x128x16_F32BF16BF16_RS<cute::GMMA::Major::K, cute::GMMA::Major::MN>{}));
using MmaPvSmemN128 = decltype(cute::make_tiled_mma(
    cute::GMMA::MMA_64x128x16_F32BF16BF16_SS<cute::GMMA::Major::K, cute::GMMA::Major::MN>{}));

// The `valid_bits` of online_softmax_tile for this thread from a tile's per-key flags (one byte
// per key, nonzero: valid): its 16 S columns are 8·j + 2·q + e (q = thread_in_wg % 4, e = 0, 1),
// so column pair j is one 2-byte read. Both kernels' producers write the flags and publish them
// on the barrier the consumer waits on before calling this.
__device__ __forceinline__ uint32_t column_valid_bits(const uint8_t* key_valid, int thread_in_wg) {
  uint32_t bits = 0;
#pragma unroll
  for (int j = 0; j < 8; ++j) {
    const uint16_t two = *reinterpret_cast<const uint16_t*>(key_valid + 8 * j + 2 * (thread_in_wg % 4));
    bits |= ((two & 0xffu) != 0 ? 1u : 0u) << (2 * j);
    bits |= ((two >> 8) != 0 ? 1u : 0u) << (2 * j + 1);
  }
  return bits;
}

// One tile: columns whose bit in `valid_bits` is clear (bit 2·(i/4) + i%2 for element i) become
// −inf, the rest are scaled by `scale_log2` (logits in base 2); the rows' reference maxima `m_run`
// and this thread's partial row sums `l_part` are updated; P = exp2(s − m) goes to rP as bf16;
// `scale` returns the factor the rows' O accumulators (and nothing else) must still be
// multiplied by. A row with no valid key so far keeps m = −inf and exponents finite (base 0).
// With `rescale_slack` > 0 the reference max only moves when the tile's max exceeds it by more
// than the slack (P ≤ 2^slack, exact in fp32 sums), so `scale` is 1 for most tiles and callers
// can skip rescaling O; `tile_max` (if given) receives the tile's true row maxima (base 2).
//
// kScaleInExponent: S stays unscaled and each exponent's argument is one FFMA, s·c − m, instead of
// a multiply per logit and a subtraction. It needs c > 0 (max(s·c) = max(s)·c; a kernel with a
// negative scale computes S with MmaSNegated and passes |c|) and c a normal float (a masked
// logit's −inf · c is then −inf, never NaN: the front doors refuse smaller scales). The prefill
// uses it; the decode consumer keeps the multiply (measured no faster with it, 2026-11-29).
template <bool kScaleInExponent = false, class FragS, class FragP>
__device__ __forceinline__ void online_softmax_tile(FragS& rS, FragP& rP, uint32_t valid_bits, float scale_log2,
                                                    float (&m_run)[2], float (&l_part)[2], float (&scale)[2],
                                                    float rescale_slack = 0.f, float* tile_max = nullptr) {
  using cute::size;
  CUTE_UNROLL
  for (int r = 0; r < 2; ++r) {
    float mx = -INFINITY;
    CUTE_UNROLL
    for (int i = 2 * r; i < size(rS); i += 4) {
      CUTE_UNROLL
      for (int e = 0; e < 2; ++e) {
        const bool v = (valid_bits >> (i / 4 * 2 + e)) & 1u;
        if constexpr (kScaleInExponent) rS(i + e) = v ? rS(i + e) : -INFINITY;
        else rS(i + e) = v ? rS(i + e) * scale_log2 : -INFINITY;
        mx = fmaxf(mx, rS(i + e));
      }
    }
    mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, 1));
    mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, 2));
    if constexpr (kScaleInExponent) mx *= scale_log2;  // the row's max of s·c (−inf stays −inf)
    if (tile_max != nullptr) tile_max[r] = mx;
    const float m_new = mx > m_run[r] + rescale_slack ? mx : m_run[r];
    const float base = m_new == -INFINITY ? 0.f : m_new;
    scale[r] = exp2f(m_run[r] - base);  // m_run = −inf → 0
    float sum = 0.f;
    CUTE_UNROLL
    for (int i = 2 * r; i < size(rS); i += 4) {
      CUTE_UNROLL
      for (int e = 0; e < 2; ++e) {
        const float pe = kScaleInExponent ? exp2f(fmaf(rS(i + e), scale_log2, -base)) : exp2f(rS(i + e) - base);
        rP(i + e) = bf16_t(pe);
        sum += pe;
      }
    }
    l_part[r] = l_part[r] * scale[r] + sum;
    m_run[r] = m_new;
  }
}

// The slack both kernels pass to online_softmax_tile: P ≤ 2^8 stays exact enough in bf16
// (relative rounding does not depend on magnitude) and the fp32 row sums cannot overflow, while
// O is rescaled only for the few tiles that raise a row's max by that much (FlashAttention-4's
// conditional rescaling).
inline constexpr float kLazyRescaleSlack = 8.f;

// O *= scale per row (the factors online_softmax_tile returned, or another warpgroup's copy of
// them); skipped by the whole warp when none of its rows' reference max moved — the common case
// once the first tiles are in, which takes 128 multiplies off the tile's critical path.
template <class FragO>
__device__ __forceinline__ void rescale_o_rows(FragO& rO, const float scale[2]) {
  if (__any_sync(0xffffffffu, scale[0] != 1.f || scale[1] != 1.f)) {
    CUTE_UNROLL
    for (int i = 0; i < cute::size(rO); ++i) rO(i) *= scale[(i >> 1) & 1];
  }
}

// P (bf16, or fp32 rounded to bf16 here; same fragment order as S) into a K-major SW128 tile of
// kRows rows: 4-byte stores, conflict-free thanks to the swizzle. The caller fences it into the
// async proxy before publishing it to a wgmma.
template <int kRows, class FragP>
__device__ __forceinline__ void store_p_tile(const FragP& rP, uint8_t* tile, int thread_in_wg) {
  CUTE_UNROLL
  for (int i = 0; i < cute::size(rP); i += 2) {
    uint32_t two;
    if constexpr (std::is_same_v<typename FragP::value_type, float>) {
      two = pack_bf16x2(rP(i), rP(i + 1));
    } else {
      two = (uint32_t{reinterpret_cast<const uint16_t&>(rP(i + 1))} << 16) | reinterpret_cast<const uint16_t&>(rP(i));
    }
    *reinterpret_cast<uint32_t*>(tile + sw128_elem_offset<kRows>(acc_row(i, thread_in_wg), acc_col(i, thread_in_wg))) =
        two;
  }
}

// O (an m64nN accumulator fragment, scaled per row by factor[r], rounded to bf16) in 16-byte
// chunks of 8 consecutive columns: the 4 lanes of a quad hold 2 columns each of every 8-column
// group of their two rows, so a 4×4 transpose of their packed pairs across the quad (3 shuffles
// per 4 groups) gives each lane one whole group. `store(r, col, chunk)` then writes row
// acc_row(0) + 8r, columns [col, col + 8): a warp store covers 64 contiguous bytes of 8 rows
// (full sectors) instead of 8 scattered 4-byte pieces per row (docs/notes/prefill.md, v8).
template <class FragO, class Store>
__device__ __forceinline__ void for_each_o_chunk(const FragO& rO, const float (&factor)[2], int thread_in_wg,
                                                 Store&& store) {
  const int q = thread_in_wg & 3;
  CUTE_UNROLL
  for (int r = 0; r < 2; ++r) {
    CUTE_UNROLL
    for (int m = 0; m < cute::size(rO) / 16; ++m) {  // groups j = 4m .. 4m+3 (32 columns)
      uint32_t a[4];
      CUTE_UNROLL
      for (int jj = 0; jj < 4; ++jj) {
        const int i = 4 * (4 * m + jj) + 2 * r;  // element (row r, column 8j + 2q)
        a[jj] = pack_bf16x2(rO(i) * factor[r], rO(i + 1) * factor[r]);
      }
      auto pick = [&](int k) { return k == 0 ? a[0] : k == 1 ? a[1] : k == 2 ? a[2] : a[3]; };
      // Lane q keeps a[q] and trades a[q ^ s] for lane (q ^ s)'s a[q].
      const uint32_t got1 = __shfl_xor_sync(0xffffffffu, pick(q ^ 1), 1);
      const uint32_t got2 = __shfl_xor_sync(0xffffffffu, pick(q ^ 2), 2);
      const uint32_t got3 = __shfl_xor_sync(0xffffffffu, pick(q ^ 3), 3);
      uint32_t b[4];
      CUTE_UNROLL
      for (int k = 0; k < 4; ++k) b[k] = k == q ? pick(q) : (k ^ q) == 1 ? got1 : (k ^ q) == 2 ? got2 : got3;
      store(r, 8 * (4 * m + q), make_uint4(b[0], b[1], b[2], b[3]));
    }
  }
}

// O (as for_each_o_chunk: scaled per row, rounded to bf16 the same way) into a K-major SW128 tile of
// kRows rows by stmatrix, at 16-byte column chunks [chunk0, chunk0 + N/8) of the tile. A thread's
// packed pairs for column groups 2m and 2m + 1 are, in the accumulator layout, its pieces of four
// 8×8 blocks (rows +0 / +8 of its warp's 16) × (groups 2m, 2m + 1); one stmatrix.x4 stores the
// four, lane l naming row l % 8 of block l / 8. No shuffles, and a quarter of the instructions of
// the shuffle-and-store path: the staging of a whole O competes with the producer's gathers for
// the same load/store issue queue (docs/notes/prefill.md, "The item boundary").
template <int kRows, class FragO>
__device__ __forceinline__ void stage_o_tile(const FragO& rO, const float (&factor)[2], uint8_t* tile, int chunk0,
                                             int thread_in_wg) {
  static_assert(decltype(cute::size(rO))::value % 8 == 0, "whole pairs of column groups");
  const int lane = thread_in_wg % 32, block = lane / 8;
  const int row = 16 * (thread_in_wg / 32) + 8 * (block % 2) + lane % 8;
  CUTE_UNROLL
  for (int m = 0; m < cute::size(rO) / 8; ++m) {
    uint32_t pair[4];
    CUTE_UNROLL
    for (int k = 0; k < 4; ++k) {
      const int i = 8 * m + 2 * k;  // group 2m + k / 2, row +8·(k % 2)
      pair[k] = pack_bf16x2(rO(i) * factor[k % 2], rO(i + 1) * factor[k % 2]);
    }
    auto& dst = *reinterpret_cast<cute::uint128_t*>(tile + sw128_chunk_offset<kRows>(row, chunk0 + 2 * m + block / 2));
    cute::SM90_U32x4_STSM_N::copy(pair[0], pair[1], pair[2], pair[3], dst);
  }
}

}  // namespace dsv4::cuda
#endif

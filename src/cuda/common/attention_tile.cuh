// What both sparse attention kernels do with one tile of 64 heads × 64 gathered keys: the three
// wgmma products (S = Q·Kᵀ, O[:, 256 dims] += P·V with P from registers or from shared memory),
// the online-softmax step on S's accumulator fragment (wgmma.cuh: element i of a thread sits at
// acc_row(i), acc_col(i); a thread holds rows acc_row(0) and acc_row(0) + 8), and the store of
// the resulting P into a K-major SW128 tile that another warpgroup's wgmma reads.
#pragma once

#if defined(DSV4_HAVE_CUTLASS)
#include <cmath>
#include <cstdint>

#include "cuda/common/smem_layout.cuh"
#include "cuda/common/wgmma.cuh"

namespace dsv4::cuda {

// S = Q·Kᵀ: M 64 heads, N 64 keys, K over d_qk; both operands K-major in shared memory.
using MmaS = decltype(cute::make_tiled_mma(
    cute::GMMA::MMA_64x64x16_F32BF16BF16_SS<cute::GMMA::Major::K, cute::GMMA::Major::K>{}));
// O[:, 256 value dims] += P·V: P (64 heads × 64 keys) from registers or from shared memory; V is
// the gathered tile read MN-major (K = V).
using MmaPvRegs = decltype(cute::make_tiled_mma(
    cute::GMMA::MMA_64x256x16_F32BF16BF16_RS<cute::GMMA::Major::K, cute::GMMA::Major::MN>{}));
using MmaPvSmem = decltype(cute::make_tiled_mma(
    cute::GMMA::MMA_64x256x16_F32BF16BF16_SS<cute::GMMA::Major::K, cute::GMMA::Major::MN>{}));

// One tile: columns whose bit in `valid_bits` is clear (bit 2·(i/4) + i%2 for element i) become
// −inf, the rest are scaled by `scale_log2` (logits in base 2); the rows' reference maxima `m_run`
// and this thread's partial row sums `l_part` are updated; P = exp2(s − m) goes to rP as bf16;
// `scale` returns the factor the rows' O accumulators (and nothing else) must still be
// multiplied by. A row with no valid key so far keeps m = −inf and exponents finite (base 0).
// With `rescale_slack` > 0 the reference max only moves when the tile's max exceeds it by more
// than the slack (P ≤ 2^slack, exact in fp32 sums), so `scale` is 1 for most tiles and callers
// can skip rescaling O; `tile_max` (if given) receives the tile's true row maxima (base 2).
template <class FragS, class FragP>
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
        rS(i + e) = v ? rS(i + e) * scale_log2 : -INFINITY;
        mx = fmaxf(mx, rS(i + e));
      }
    }
    mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, 1));
    mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, 2));
    if (tile_max != nullptr) tile_max[r] = mx;
    const float m_new = mx > m_run[r] + rescale_slack ? mx : m_run[r];
    const float base = m_new == -INFINITY ? 0.f : m_new;
    scale[r] = exp2f(m_run[r] - base);  // m_run = −inf → 0
    float sum = 0.f;
    CUTE_UNROLL
    for (int i = 2 * r; i < size(rS); i += 4) {
      CUTE_UNROLL
      for (int e = 0; e < 2; ++e) {
        const float pe = exp2f(rS(i + e) - base);
        rP(i + e) = bf16_t(pe);
        sum += pe;
      }
    }
    l_part[r] = l_part[r] * scale[r] + sum;
    m_run[r] = m_new;
  }
}

// P (bf16, same fragment order as S) into a K-major SW128 tile of kRows rows: 4-byte stores,
// conflict-free thanks to the swizzle. The caller fences it into the async proxy before
// publishing it to a wgmma.
template <int kRows, class FragP>
__device__ __forceinline__ void store_p_tile(const FragP& rP, uint8_t* tile, int thread_in_wg) {
  CUTE_UNROLL
  for (int i = 0; i < cute::size(rP); i += 2) {
    const uint32_t two = (uint32_t{reinterpret_cast<const uint16_t&>(rP(i + 1))} << 16) |
                         reinterpret_cast<const uint16_t&>(rP(i));
    *reinterpret_cast<uint32_t*>(tile + sw128_elem_offset<kRows>(acc_row(i, thread_in_wg), acc_col(i, thread_in_wg))) =
        two;
  }
}

}  // namespace dsv4::cuda
#endif

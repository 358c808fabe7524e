// Warp-level tensor-core primitives (sm_80+ PTX, also on sm_90a): ldmatrix fragment loads and the
// bf16 m16n8k16 MMA, for kernels whose tiles are too small or too irregular for a warpgroup.
// Tiles are read from the SW128 layouts of smem_layout.cuh (conflict-free for ldmatrix too).
//
// Fragment conventions are PTX's for mma.m16n8k16.row.col (lane = 4·g + q):
//   A (16×16, row-major): a[0..3] = (row g, cols 2q..2q+1), (g+8, 2q..), (g, 2q+8..), (g+8, 2q+8..)
//   B (16×8, "col"):      b[0..1] = (rows 2q..2q+1, col g), (rows 2q+8..2q+9, col g)
//   C (16×8, fp32):       c[0..3] = (row g, cols 2q, 2q+1), (row g+8, cols 2q, 2q+1)
#pragma once

#include <cstdint>

namespace dsv4::cuda::warp {

// Four 8×8 b16 matrices; lane l gives the row address of matrix l/8, row l%8.
__device__ __forceinline__ void ldmatrix_x4(uint32_t (&r)[4], uint32_t smem_addr) {
  asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0,%1,%2,%3}, [%4];"
               : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
               : "r"(smem_addr));
}
// Same, each matrix transposed (B fragments of a row-major K×N operand).
__device__ __forceinline__ void ldmatrix_x4_trans(uint32_t (&r)[4], uint32_t smem_addr) {
  asm volatile("ldmatrix.sync.aligned.m8n8.x4.trans.shared.b16 {%0,%1,%2,%3}, [%4];"
               : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
               : "r"(smem_addr));
}

// c += a · b, bf16 operands, fp32 accumulators.
__device__ __forceinline__ void mma_bf16_16816(float (&c)[4], const uint32_t (&a)[4], uint32_t b0,
                                               uint32_t b1) {
  asm volatile(
      "mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, "
      "{%8,%9}, {%0,%1,%2,%3};"
      : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
      : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
}

// Two floats → packed bf16x2 (round to nearest even), `lo` in the low half.
__device__ __forceinline__ uint32_t pack_bf16x2(float lo, float hi) {
  uint32_t r;
  asm("cvt.rn.bf16x2.f32 %0, %1, %2;" : "=r"(r) : "f"(hi), "f"(lo));
  return r;
}

}  // namespace dsv4::cuda::warp

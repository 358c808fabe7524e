// Row gathers into K-major SW128 fp8 tiles (smem_layout.cuh's SmemTileKFp8x128): one warp moves
// 128-byte rows from global memory with cp.async, in the swizzled order wgmma reads. Shared by the
// kernels whose producer warp feeds FP8 wgmma operands row by row (the indexer scores, the skinny
// FP8 GEMM).
#pragma once

#include <cstdint>

#include "cuda/common/ptx.cuh"
#include "cuda/common/smem_layout.cuh"

namespace dsv4::cuda {

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

}  // namespace dsv4::cuda

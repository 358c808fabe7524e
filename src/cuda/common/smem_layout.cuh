// Shared-memory tile layouts for wgmma operands (bf16 and fp8, 128-byte swizzle).
//
// A "K-major SW128 tile" holds kRows rows of kCols bf16 values as kCols/64 column blocks; each
// block is kRows × 128 B (1024-B aligned), and the 16-byte chunk c of row r inside a block sits at
// chunk position c ^ (r % 8). This is exactly CuTe's
//   tile_to_shape(GMMA::Layout_K_SW128_Atom<bf16>, (kRows, kCols), Step<_1,_2>)
// so wgmma descriptors that CuTe builds over SmemTileK see the bytes our own cp.async gathers wrote
// with sw128_chunk_offset(). The same tile read as (kCols, kRows) — SmemTileKTransposed — is the
// MN-major B operand of a P·V product (K = V: a gathered row is stored once, used twice).
#pragma once

#include <cstddef>
#include <cstdint>

#if defined(DSV4_HAVE_CUTLASS)
#include <cute/tensor.hpp>
#include <cutlass/numeric_types.h>
#endif

namespace dsv4::cuda {

// The dynamic shared memory a launch asks for, for a plan read through aligned_dynamic_smem
// (below) whose bytes end at `plan_end` (its last member's end: sizeof would add the padding up to
// the plan's alignment, which nothing reads): those bytes plus the most aligned_dynamic_smem skips
// to reach kAlign from the declared array's 16-byte alignment (1008 for 1024).
template <int kAlign = 1024>
constexpr int aligned_dynamic_smem_bytes(size_t plan_end) { return static_cast<int>(plan_end) + kAlign - 16; }

#if defined(__CUDACC__)
// A kernel's dynamic shared memory as a T at the first kAlign-aligned byte (the launch asks for
// kAlign more bytes than sizeof(T), or aligned_dynamic_smem_bytes of its last member's end: the
// declared array is 16-byte aligned; 1024 is what 128-byte-swizzled wgmma tiles need). The
// offset is added to the declared array itself: a round trip of the address through an integer
// hides that it is shared memory, and every access of the plan then compiles to a generic LD / ST
// (slower, and an L1TEX dependency) instead of LDS / STS.
template <class T, int kAlign = 1024>
__device__ __forceinline__ T& aligned_dynamic_smem(uint8_t* smem_raw) {
  const uint32_t addr = static_cast<uint32_t>(__cvta_generic_to_shared(smem_raw));
  return *reinterpret_cast<T*>(smem_raw + (kAlign - addr % kAlign) % kAlign);
}
#endif

// Byte offset of 16-byte chunk `chunk` (8 bf16 values) of row `row` in a K-major SW128 tile.
template <int kRows>
__host__ __device__ __forceinline__ uint32_t sw128_chunk_offset(int row, int chunk) {
  return static_cast<uint32_t>((chunk >> 3) * (kRows * 128) + row * 128 +
                               (((chunk & 7) ^ (row & 7)) << 4));
}

// Byte offset of the bf16 element (row, col) in the same tile.
template <int kRows>
__host__ __device__ __forceinline__ uint32_t sw128_elem_offset(int row, int col) {
  return sw128_chunk_offset<kRows>(row, col >> 3) + ((col & 7) << 1);
}

#if defined(DSV4_HAVE_CUTLASS)
using bf16_t = cutlass::bfloat16_t;

template <int kRows, int kCols>
using SmemTileK = decltype(cute::tile_to_shape(cute::GMMA::Layout_K_SW128_Atom<bf16_t>{},
                                               cute::Shape<cute::Int<kRows>, cute::Int<kCols>>{},
                                               cute::Step<cute::_1, cute::_2>{}));

// FP8 (e4m3) operand of kRows rows × 128 values: one 128-byte row per swizzle span, so the byte
// of (row, col) sits at sw128_chunk_offset<kRows>(row, col / 16) + col % 16 — the same bytes a
// cp.async gather writes with that offset. FP8 wgmma takes K-major operands only.
using fp8_e4m3_t = cutlass::float_e4m3_t;
template <int kRows>
using SmemTileKFp8x128 = decltype(cute::tile_to_shape(cute::GMMA::Layout_K_SW128_Atom<fp8_e4m3_t>{},
                                                      cute::Shape<cute::Int<kRows>, cute::_128>{},
                                                      cute::Step<cute::_1, cute::_2>{}));

// (kCols, kRows) view of a SmemTileK<kRows, kCols>: element (c, r) is tile element (r, c).
template <int kRows, int kCols>
using SmemTileKTransposed = decltype(cute::composition(
    SmemTileK<kRows, kCols>{},
    cute::Layout<cute::Shape<cute::Int<kCols>, cute::Int<kRows>>,
                 cute::Stride<cute::Int<kRows>, cute::_1>>{}));
#endif

}  // namespace dsv4::cuda

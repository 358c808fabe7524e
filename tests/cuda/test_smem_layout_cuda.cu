// The shared-memory tiles the tensor cores read (CuTe layouts, src/cuda/common/smem_layout.cuh)
// against the byte offsets our own copies and stores write into them (sw128_chunk_offset,
// sw128_elem_offset): every element of each tile, on the host. The sparse kernels build their wgmma
// descriptors from SmemTileK (K and Q) and SmemTileKTransposed (V, the same bytes read MN-major)
// while their producers place each row with sw128_chunk_offset; a disagreement would multiply
// permuted operands, which the kernels' tests would see only as wrong attention. This names the
// tile and counts the elements.
#include <gtest/gtest.h>

#include <cstdint>

#include "cuda/common/smem_layout.cuh"

namespace {

using dsv4::cuda::bf16_t;

alignas(1024) uint8_t g_tile[64 * 576 * 2];

// Byte offset of element (i, j) of a tile with layout `Layout` at g_tile + base (CuTe applies the
// swizzle to the address, as the descriptor's hardware does).
template <class Layout>
int64_t byte_offset(uint32_t base, int i, int j) {
  auto tile = cute::make_tensor(cute::make_smem_ptr(reinterpret_cast<bf16_t*>(g_tile + base)), Layout{});
  return reinterpret_cast<const uint8_t*>(&tile(i, j)) - g_tile;
}

template <int kRows, int kCols>
int misplaced_k_major() {
  int wrong = 0;
  for (int r = 0; r < kRows; ++r)
    for (int c = 0; c < kCols; ++c)
      wrong += byte_offset<dsv4::cuda::SmemTileK<kRows, kCols>>(0, r, c) != dsv4::cuda::sw128_elem_offset<kRows>(r, c);
  return wrong;
}

TEST(SmemLayoutCuda, KMajorTileIsWhereChunksAreStored) {
  EXPECT_EQ((misplaced_k_major<64, 576>()), 0);  // V3.2's keys and queries
  EXPECT_EQ((misplaced_k_major<64, 512>()), 0);  // MODEL1's
  EXPECT_EQ((misplaced_k_major<64, 64>()), 0);   // the decode's P tile
}

// The decode's V halves: columns [256 · half, +256) of a 64-row stage start 4 · half spans in
// (half · 32 KB) and, read as SmemTileKTransposed<64, 256>, element (c, r) is the stage's
// (r, 256 · half + c).
TEST(SmemLayoutCuda, TransposedHalfIsTheStagesColumns) {
  for (int half = 0; half < 2; ++half) {
    const uint32_t base = half * 4 * 64 * 128;
    int wrong = 0;
    for (int c = 0; c < 256; ++c)
      for (int r = 0; r < 64; ++r)
        wrong += byte_offset<dsv4::cuda::SmemTileKTransposed<64, 256>>(base, c, r) !=
                 dsv4::cuda::sw128_elem_offset<64>(r, 256 * half + c);
    EXPECT_EQ(wrong, 0) << "half " << half;
  }
}

}  // namespace

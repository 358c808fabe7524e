// The shared-memory tiles the tensor cores read (CuTe layouts, src/cuda/common/smem_layout.cuh)
// against the byte offsets our own copies and stores write into them (sw128_chunk_offset,
// sw128_group_chunk_offset): every element of each tile, on the host. A descriptor built from a
// layout that disagrees with the stores would multiply permuted operands; the kernels' tests would
// catch that only as wrong attention, this names the tile and the element.
#include <gtest/gtest.h>

#include <algorithm>
#include <climits>
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

// The bf16 element (row, col) of a group-major tile of kCols columns.
template <int kCols>
uint32_t group_elem_offset(int row, int col) {
  return dsv4::cuda::sw128_group_chunk_offset<kCols>(row, col / 8) + (col % 8) * 2;
}

TEST(SmemLayoutCuda, KMajorTileIsWhereChunksAreStored) {
  using Tile = dsv4::cuda::SmemTileK<64, 576>;
  int wrong = 0;
  for (int r = 0; r < 64; ++r)
    for (int c = 0; c < 576; ++c)
      wrong += byte_offset<Tile>(0, r, c) != dsv4::cuda::sw128_elem_offset<64>(r, c);
  EXPECT_EQ(wrong, 0);
}

template <int kCols>
void expect_group_tile_matches() {
  using Tile = dsv4::cuda::SmemTileKGroups<64, kCols>;
  int wrong = 0;
  for (int r = 0; r < 64; ++r)
    for (int c = 0; c < kCols; ++c) wrong += byte_offset<Tile>(0, r, c) != group_elem_offset<kCols>(r, c);
  EXPECT_EQ(wrong, 0) << kCols << " columns";
  // Rows 8g..8g+7 are one contiguous block of kCols · 16 bytes (what one bulk copy moves).
  for (int g = 0; g < 8; ++g) {
    int64_t lo = INT64_MAX, hi = -1;
    for (int r = 8 * g; r < 8 * g + 8; ++r)
      for (int c = 0; c < kCols; ++c) {
        lo = std::min<int64_t>(lo, group_elem_offset<kCols>(r, c));
        hi = std::max<int64_t>(hi, group_elem_offset<kCols>(r, c));
      }
    EXPECT_EQ(lo, g * kCols * 16);
    EXPECT_EQ(hi, (g + 1) * kCols * 16 - 2);
  }
}

TEST(SmemLayoutCuda, GroupMajorTileIsWhereChunksAreStored) {
  expect_group_tile_matches<512>();
  expect_group_tile_matches<576>();
}

// The MN-major view of columns [kFirst, kFirst + 256) (a P·V product's V half): element (c, r) is
// the tile's (r, kFirst + c).
template <int kAllCols, int kFirst>
void expect_cols_view_matches() {
  using View = dsv4::cuda::SmemTileKGroupsColsTransposed<64, kAllCols, 256>;
  const uint32_t base = dsv4::cuda::sw128_group_cols_offset<kFirst>;
  int wrong = 0;
  for (int c = 0; c < 256; ++c)
    for (int r = 0; r < 64; ++r) wrong += byte_offset<View>(base, c, r) != group_elem_offset<kAllCols>(r, kFirst + c);
  EXPECT_EQ(wrong, 0) << kAllCols << " columns, from " << kFirst;
}

TEST(SmemLayoutCuda, GroupMajorColumnsViewIsTheTilesColumns) {
  expect_cols_view_matches<512, 0>();
  expect_cols_view_matches<512, 256>();
  expect_cols_view_matches<576, 0>();
  expect_cols_view_matches<576, 256>();
}

}  // namespace

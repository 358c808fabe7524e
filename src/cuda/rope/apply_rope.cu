// RoPE kernel: one warp per row of x ([T, D] or [T, H, D], flattened). Lanes rotate the R/2
// pairs of the last R dims with the CPU reference's rope_rotate_pair and, unless the op works in
// place (y is x: the first D − R dims are already where they belong, so they are not touched —
// 7/8 of a V4 head), copy the first D − R dims converted to y's type, in chunks of 8 (16-byte
// accesses when the rows are aligned). Each element is read and written by one lane only (pair j
// by lane j mod 32), so y may alias x.
#include "cuda/rope/apply_rope.h"

#include <cuda_runtime.h>

#include <climits>

#include "cuda/common/check.h"
#include "cuda/common/float_rows.cuh"
#include "cuda/common/index_vector.cuh"
#include "cuda/common/launch.cuh"
#include "cuda/common/rope_table.cuh"

namespace dsv4::cuda {
namespace {

constexpr int kWarpsPerBlock = 8;

struct RopeParams {
  FloatRows x, y;
  int64_t heads;          // rows per token (1 for [T, D])
  IndexVector positions;  // [T]
  RopeTable table;
  bool inverse;
  bool in_place;  // y is x (same data and strides)
};

template <bool kVector>
__global__ void __launch_bounds__(32 * kWarpsPerBlock) apply_rope_kernel(const RopeParams p) {
  grid_dependency_entry();
  const int64_t row = static_cast<int64_t>(blockIdx.x) * kWarpsPerBlock + threadIdx.x / 32;
  if (row >= p.x.num_rows) return;
  const int64_t pos = p.positions[row / p.heads];
  if (!p.table.contains(pos)) return;  // invalid position: row left unwritten
  const int lane = static_cast<int>(threadIdx.x % 32);
  const int64_t x_off = p.x.row_offset(row), y_off = p.y.row_offset(row);
  const int64_t nope = p.x.row_len - 2 * p.table.half;
  if (!p.in_place) {
    constexpr int kChunk = FloatRows::kChunk;
    const int64_t full = nope / kChunk;  // chunks entirely in the nope dims
    float v[kChunk];
    for (int64_t c = lane; c < full; c += 32) {
      p.x.load_chunk<kVector>(x_off, c * kChunk, nope, v);
      p.y.store_chunk<kVector>(y_off, c * kChunk, nope, v);
    }
    for (int64_t i = full * kChunk + lane; i < nope; i += 32) p.y.store(y_off, i, p.x.load(x_off, i));
  }
  for (int j = lane; j < p.table.half; j += 32) {
    float a = p.x.load(x_off, nope + 2 * j), b = p.x.load(x_off, nope + 2 * j + 1);
    p.table.rotate(pos, j, a, b, p.inverse);
    p.y.store(y_off, nope + 2 * j, a);
    p.y.store(y_off, nope + 2 * j + 1, b);
  }
}

}  // namespace

void apply_rope(const TensorView& x, const TensorView& positions, const TensorView& cos_sin,
                bool inverse, const TensorView& y, Stream stream) {
  constexpr const char* kOp = "apply_rope";
  RopeParams p;
  p.x = FloatRows::of(x);
  p.y = FloatRows::of(y);
  const int64_t T = x.shape[0];
  if (T == 0 || p.x.num_rows == 0) return;  // nothing to write
  p.heads = p.x.num_rows / T;
  p.positions = IndexVector::of(positions);
  p.table = RopeTable::of(cos_sin);
  p.inverse = inverse;
  p.in_place = x.data == y.data && x.dtype == y.dtype && x.strides == y.strides;
  const int64_t blocks = (p.x.num_rows + kWarpsPerBlock - 1) / kWarpsPerBlock;
  DSV4_CHECK(blocks <= INT_MAX, kOp, ": x: expected at most ", int64_t{INT_MAX} * kWarpsPerBlock,
             " rows, got ", p.x.num_rows);
  if (p.x.rows_aligned16() && p.y.rows_aligned16())
    launch_kernel(kOp, apply_rope_kernel<true>, {static_cast<unsigned>(blocks), 32 * kWarpsPerBlock, 0},
                  stream, p);
  else
    launch_kernel(kOp, apply_rope_kernel<false>, {static_cast<unsigned>(blocks), 32 * kWarpsPerBlock, 0},
                  stream, p);
}

}  // namespace dsv4::cuda

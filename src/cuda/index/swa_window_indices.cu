// swa_window_indices on CUDA: one warp per token walks its window [first, p] oldest first in
// rounds of 32 positions, maps each through its request's block-table row (math/index.h
// paged_slot, as the CPU reference does) and packs the positions whose block is present; then
// pads the row with -1. With valid data every position is present and the row equals the CPU's;
// otherwise missing positions are left out (see indexing.h), never read past the table.
#include "cuda/common/check.h"
#include "cuda/common/launch.cuh"
#include "cuda/index/indexing.h"
#include "cuda/index/request_table.cuh"
#include "cuda/index/warp_rows.cuh"
#include "math/index.h"

namespace dsv4::cuda {
namespace {

constexpr const char* kOp = "swa_window_indices";
using namespace index_rows;

template <typename Position>
struct WindowParams {
  const Position* positions;  // [T], stride pos_stride
  int64_t pos_stride;
  RequestTable requests;
  int32_t* indices;  // [T, window], row stride indices_stride
  int64_t indices_stride;
  int32_t* lens;  // [T], stride lens_stride
  int64_t lens_stride;
  int64_t tokens;
  int block_size, window;
};

template <typename Position>
__global__ void __launch_bounds__(kThreadsPerBlock)
    swa_window_kernel(const WindowParams<Position> p) {
  grid_dependency_entry();
  const int64_t t = warp_row();
  if (t >= p.tokens) return;
  const int lane = lane_id();
  const int64_t pos = p.positions[t * p.pos_stride];
  const int32_t* row = p.requests.row_of(t);
  int32_t* out = p.indices + t * p.indices_stride;
  int count = 0;
  if (pos >= 0 && row != nullptr) {  // the same for the whole warp
    const int64_t first = index_math::window_first(pos, p.window);
    const int64_t span = pos - first + 1;  // 1..window
    for (int64_t k0 = 0; k0 < span; k0 += 32) {  // every lane runs every round
      const int64_t k = k0 + lane;
      const int32_t slot =
          k < span ? index_math::paged_slot(row, p.requests.max_blocks, p.block_size, first + k)
                   : -1;
      count = pack_round(slot >= 0, slot, out, count);  // count <= k0 + 32, <= window overall
    }
  }
  for (int64_t k = count + lane; k < p.window; k += 32) out[k] = -1;
  if (lane == 0) p.lens[t * p.lens_stride] = count;
}

template <typename Position>
void launch(const TensorView& positions, const TensorView& token_to_req,
            const TensorView& block_table, int block_size, int window, const TensorView& indices,
            const TensorView& lens, Stream stream) {
  WindowParams<Position> p{};
  p.positions = positions.ptr<const Position>();
  p.pos_stride = positions.strides[0];
  p.requests = request_table(token_to_req, block_table);
  p.indices = indices.ptr<int32_t>();
  p.indices_stride = indices.strides[0];
  p.lens = lens.ptr<int32_t>();
  p.lens_stride = lens.strides[0];
  p.tokens = positions.shape[0];
  p.block_size = block_size;
  p.window = window;
  if (p.tokens == 0) return;
  launch_kernel(kOp, swa_window_kernel<Position>, {blocks_for(kOp, p.tokens), kThreadsPerBlock, 0}, stream,
                p);
}

}  // namespace

void swa_window_indices(const TensorView& positions, const TensorView& token_to_req,
                        const TensorView& block_table, int block_size, int window,
                        const TensorView& indices, const TensorView& lens, Stream stream) {
  if (positions.dtype == DType::int64)
    launch<int64_t>(positions, token_to_req, block_table, block_size, window, indices, lens,
                    stream);
  else
    launch<int32_t>(positions, token_to_req, block_table, block_size, window, indices, lens,
                    stream);
}

}  // namespace dsv4::cuda

// local_to_global_slots on CUDA: one warp per token converts its K request-local entries through
// its request's block-table row (cache/index_math.h paged_slot, the CPU reference's function) and
// counts the valid ones. Every read is inside the validated views: the table row only for
// 0 <= token_to_req < R, the table entry only for a block < max_blocks.
#include "cache/index_math.h"
#include "cuda/common/check.h"
#include "cuda/index/indexing.h"
#include "cuda/index/warp_rows.cuh"

namespace dsv4::cuda {
namespace {

constexpr const char* kOp = "local_to_global_slots";
using namespace index_rows;

struct SlotParams {
  const int32_t* local;  // [T, K], row stride local_stride (may alias global)
  int64_t local_stride;
  const int32_t* token_to_req;  // [T], stride t2r_stride
  int64_t t2r_stride;
  const int32_t* table;  // [R, max_blocks], row stride table_stride
  int64_t table_stride, requests, max_blocks;
  int32_t* global;  // [T, K], row stride global_stride
  int64_t global_stride;
  int32_t* lens;  // [T], stride lens_stride; nullptr when not requested
  int64_t lens_stride;
  int64_t tokens, k;
  int block_size;
};

__global__ void __launch_bounds__(kThreadsPerBlock) local_to_global_kernel(const SlotParams p) {
  const int64_t t = warp_row();
  if (t >= p.tokens) return;
  const int lane = lane_id();
  const int32_t r = p.token_to_req[t * p.t2r_stride];
  const bool known = r >= 0 && r < p.requests;
  const int32_t* row = p.table + (known ? r * p.table_stride : 0);
  const int32_t* in = p.local + t * p.local_stride;
  int32_t* out = p.global + t * p.global_stride;
  int valid = 0;
  for (int64_t k = lane; k < p.k; k += 32) {
    // Each element is read and written by the same lane, read first: in may alias out.
    const int32_t g = known ? index_math::paged_slot(row, p.max_blocks, p.block_size, in[k]) : -1;
    out[k] = g;
    valid += g >= 0;
  }
  valid = warp_sum(valid);
  if (p.lens != nullptr && lane == 0) p.lens[t * p.lens_stride] = valid;
}

}  // namespace

void local_to_global_slots(const TensorView& local, const TensorView& token_to_req,
                           const TensorView& block_table, int block_size,
                           const TensorView& global, const TensorView& lens, Stream stream) {
  SlotParams p{};
  p.local = local.ptr<const int32_t>();
  p.local_stride = local.strides[0];
  p.token_to_req = token_to_req.ptr<const int32_t>();
  p.t2r_stride = token_to_req.strides[0];
  p.table = block_table.ptr<const int32_t>();
  p.table_stride = block_table.strides[0];
  p.requests = block_table.shape[0];
  p.max_blocks = block_table.shape[1];
  p.global = global.ptr<int32_t>();
  p.global_stride = global.strides[0];
  p.lens = lens.defined() ? lens.ptr<int32_t>() : nullptr;
  p.lens_stride = lens.defined() ? lens.strides[0] : 0;
  p.tokens = local.shape[0];
  p.k = local.shape[1];
  p.block_size = block_size;
  if (p.tokens == 0) return;
  local_to_global_kernel<<<blocks_for(kOp, p.tokens), kThreadsPerBlock, 0, stream>>>(p);
  check_launch(kOp);
}

}  // namespace dsv4::cuda

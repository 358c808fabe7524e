// local_to_global_slots on CUDA: one warp per token converts its K request-local entries through
// its request's block-table row (math/index.h paged_slot, the CPU reference's function) and
// counts the valid ones. Every read is inside the validated views: the table row only for
// 0 <= token_to_req < R, the table entry only for a block < max_blocks.
#include "cuda/common/check.h"
#include "cuda/common/launch.cuh"
#include "cuda/index/indexing.h"
#include "cuda/index/request_table.cuh"
#include "cuda/index/warp_rows.cuh"
#include "math/index.h"

namespace dsv4::cuda {
namespace {

constexpr const char* kOp = "local_to_global_slots";
using namespace index_rows;

struct SlotParams {
  const int32_t* local;  // [T, K], row stride local_stride (may alias global)
  int64_t local_stride;
  RequestTable requests;
  int32_t* global;  // [T, K], row stride global_stride
  int64_t global_stride;
  int32_t* lens;  // [T], stride lens_stride; nullptr when not requested
  int64_t lens_stride;
  int64_t tokens, k;
  int block_size;
};

// Entries a lane converts per round: all of their reads are issued before any write. One at a
// time, each entry was a chain of two dependent loads that its store then fenced off from the
// next entry's (in may alias out, so the compiler cannot hoist a load above a store): 16 chains
// per lane held a 512-entry row at ~10 µs (measured on the H200).
constexpr int kEntriesPerRound = 8;

__global__ void __launch_bounds__(kThreadsPerBlock) local_to_global_kernel(const SlotParams p) {
  grid_dependency_entry();
  const int64_t t = warp_row();
  if (t >= p.tokens) return;
  const int lane = lane_id();
  const int32_t* row = p.requests.row_of(t);
  const int32_t* in = p.local + t * p.local_stride;
  int32_t* out = p.global + t * p.global_stride;
  int valid = 0;
  for (int64_t base = lane; base < p.k; base += 32 * kEntriesPerRound) {
    // Each element is read and written by the same lane, read first (in may alias out), and the
    // lane's elements are distinct: reading the round's entries before writing any is safe.
    int32_t g[kEntriesPerRound];
#pragma unroll
    for (int i = 0; i < kEntriesPerRound; ++i) {
      const int64_t k = base + 32 * i;
      g[i] = k < p.k ? in[k] : -1;
    }
#pragma unroll
    for (int i = 0; i < kEntriesPerRound; ++i)
      g[i] = row ? index_math::paged_slot(row, p.requests.max_blocks, p.block_size, g[i]) : -1;
#pragma unroll
    for (int i = 0; i < kEntriesPerRound; ++i) {
      const int64_t k = base + 32 * i;
      if (k < p.k) {
        out[k] = g[i];
        valid += g[i] >= 0;
      }
    }
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
  p.requests = request_table(token_to_req, block_table);
  p.global = global.ptr<int32_t>();
  p.global_stride = global.strides[0];
  p.lens = lens.defined() ? lens.ptr<int32_t>() : nullptr;
  p.lens_stride = lens.defined() ? lens.strides[0] : 0;
  p.tokens = local.shape[0];
  p.k = local.shape[1];
  p.block_size = block_size;
  if (p.tokens == 0) return;
  launch_kernel(kOp, local_to_global_kernel, {blocks_for(kOp, p.tokens), kThreadsPerBlock, 0}, stream, p);
}

}  // namespace dsv4::cuda

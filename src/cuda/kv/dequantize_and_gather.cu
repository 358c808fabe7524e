// Dequantize-and-gather kernel: one warp per (request r, gathered row j). The warp resolves the
// row's cache entry (the last gather_lens[r] of the request's seq_lens[r] entries), checks every
// index it reads (the host cannot), and its lanes decode the token's dims with the CPU's
// kv_decode_value into the bf16 workspace row offset + j.
#include "cuda/kv/dequantize_and_gather.h"

#include <cuda_runtime.h>

#include <climits>

#include "cuda/common/check.h"
#include "cuda/common/launch.cuh"

namespace dsv4::cuda {
namespace {

constexpr int kWarpsPerBlock = 8;

struct GatherParams {
  KvGeometry geometry;
  const uint8_t* cache;
  int64_t block_stride, num_blocks;
  float tensor_scale;
  const int32_t* block_table;  // [R, max_blocks], contiguous
  int64_t max_blocks;
  const int32_t* seq_lens;     // [R]
  const int32_t* gather_lens;  // [R] or nullptr (= seq_lens)
  int64_t requests, rows_per_request;  // rows_per_request = M − offset
  uint16_t* workspace;                 // bf16 [R, M, dim], last dim contiguous
  int64_t ws_stride0, ws_stride1, offset;
};

__global__ void __launch_bounds__(32 * kWarpsPerBlock) dequantize_and_gather_kernel(const GatherParams p) {
  grid_dependency_entry();
  const int64_t item = static_cast<int64_t>(blockIdx.x) * kWarpsPerBlock + threadIdx.x / 32;
  if (item >= p.requests * p.rows_per_request) return;
  const int64_t r = item / p.rows_per_request, j = item % p.rows_per_request;
  const int64_t seq_len = p.seq_lens[r];
  const int64_t count = p.gather_lens != nullptr ? p.gather_lens[r] : seq_len;
  if (seq_len < 0 || count < 0 || count > seq_len || j >= count) return;
  const int64_t entry = seq_len - count + j;
  const int bs = p.geometry.block_size;
  const int64_t column = entry / bs;
  if (column >= p.max_blocks) return;
  const int64_t block = p.block_table[r * p.max_blocks + column];
  if (block < 0 || block >= p.num_blocks) return;

  const uint8_t* base = p.cache + block * p.block_stride;
  const int offset_in_block = static_cast<int>(entry % bs);
  uint16_t* dst = p.workspace + r * p.ws_stride0 + (p.offset + j) * p.ws_stride1;
  for (int d = static_cast<int>(threadIdx.x % 32); d < p.geometry.dim; d += 32)
    dst[d] = float_to_bf16_bits(kv_decode_value(p.geometry, base, offset_in_block, d, p.tensor_scale));
}

}  // namespace

void dequantize_and_gather(const KvCacheView& cache, const TensorView& block_table,
                           const TensorView& seq_lens, const TensorView& gather_lens,
                           int64_t offset, const TensorView& workspace, Stream stream) {
  constexpr const char* kOp = "dequantize_and_gather";
  GatherParams p;
  p.geometry = kv_geometry(cache.layout, cache.block_size);
  p.cache = static_cast<const uint8_t*>(cache.data.data);
  p.block_stride = cache.data.strides[0];
  p.num_blocks = cache.data.shape[0];
  p.tensor_scale = cache.tensor_scale;
  p.block_table = block_table.ptr<const int32_t>();
  p.max_blocks = block_table.shape[1];
  p.seq_lens = seq_lens.ptr<const int32_t>();
  p.gather_lens = gather_lens.defined() ? gather_lens.ptr<const int32_t>() : nullptr;
  p.requests = workspace.shape[0];
  p.rows_per_request = workspace.shape[1] - offset;
  p.workspace = workspace.ptr<uint16_t>();
  p.ws_stride0 = workspace.strides[0];
  p.ws_stride1 = workspace.strides[1];
  p.offset = offset;
  const int64_t items = p.requests * p.rows_per_request;
  if (items == 0) return;  // nothing to write
  const int64_t blocks = (items + kWarpsPerBlock - 1) / kWarpsPerBlock;
  DSV4_CHECK(blocks <= INT_MAX, kOp, ": workspace: expected at most ",
             int64_t{INT_MAX} * kWarpsPerBlock, " rows, got ", items);
  launch_kernel(kOp, dequantize_and_gather_kernel, {static_cast<unsigned>(blocks), 32 * kWarpsPerBlock, 0},
                stream, p);
}

}  // namespace dsv4::cuda

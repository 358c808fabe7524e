// Block-scaled FP8 → bf16 / fp32 kernel: one thread per element, threads of a block along a row
// (coalesced), block rows y walk the (batch · row) range with a grid stride so any row count
// fits the 65535 limit of grid.y. Per element: fp8 decode and scale decode through dtype.h (as
// the CPU reference), one fp32 product, one rounding to y's dtype.
#include "cuda/gemm/dequantize_fp8_blocks.h"

#include <algorithm>
#include <cstdint>

#include "cuda/common/check.h"
#include "cuda/common/launch.cuh"
#include "dsv4/dtype.h"

namespace dsv4::cuda {
namespace {

constexpr const char* kOp = "dequantize_fp8_blocks";
constexpr int kThreads = 256;
constexpr int64_t kMaxGridY = 65535;

struct DequantizeParams {
  const uint8_t* x;  // [batch, rows, cols], strides in elements
  int64_t x_batch_stride, x_row_stride;
  const void* scale;  // [batch, ceil(rows / block_rows), ceil(cols / block_cols)]
  int64_t s_batch_stride, s_row_stride;
  bool scale_is_ue8m0;
  void* y;  // [batch, rows, cols]
  int64_t y_batch_stride, y_row_stride;
  int64_t batch, rows, cols;
  int64_t block_rows, block_cols;
};

__device__ __forceinline__ void store_value(uint16_t* p, float v) { *p = float_to_bf16_bits(v); }
__device__ __forceinline__ void store_value(float* p, float v) { *p = v; }

template <typename Out>
__global__ void __launch_bounds__(kThreads) dequantize_fp8_blocks_kernel(const DequantizeParams p) {
  grid_dependency_entry();
  const int64_t c = static_cast<int64_t>(blockIdx.x) * kThreads + threadIdx.x;
  if (c >= p.cols) return;  // no shared memory, no barriers: idle threads may leave
  const int64_t scale_col = c / p.block_cols;
  for (int64_t gr = blockIdx.y; gr < p.batch * p.rows; gr += gridDim.y) {
    const int64_t g = gr / p.rows, r = gr % p.rows;
    const int64_t s = g * p.s_batch_stride + (r / p.block_rows) * p.s_row_stride + scale_col;
    const float scale = p.scale_is_ue8m0 ? ue8m0_to_float(static_cast<const uint8_t*>(p.scale)[s])
                                         : static_cast<const float*>(p.scale)[s];
    const float v = fp8_e4m3_to_float(p.x[g * p.x_batch_stride + r * p.x_row_stride + c]) * scale;
    store_value(static_cast<Out*>(p.y) + g * p.y_batch_stride + r * p.y_row_stride + c, v);
  }
}

}  // namespace

void dequantize_fp8_blocks(const TensorView& x, const TensorView& scale, int block_rows,
                           int block_cols, const TensorView& y, Stream stream) {
  const bool batched = x.ndim == 3;
  const int lead = batched ? 1 : 0;  // index of the row dim
  DequantizeParams p{};
  p.x = static_cast<const uint8_t*>(x.data);
  p.x_batch_stride = batched ? x.strides[0] : 0;
  p.x_row_stride = x.strides[lead];
  p.scale = scale.data;
  p.s_batch_stride = batched ? scale.strides[0] : 0;
  p.s_row_stride = scale.strides[lead];
  p.scale_is_ue8m0 = scale.dtype == DType::ue8m0;
  p.y = y.data;
  p.y_batch_stride = batched ? y.strides[0] : 0;
  p.y_row_stride = y.strides[lead];
  p.batch = batched ? x.shape[0] : 1;
  p.rows = x.shape[lead];
  p.cols = x.shape[lead + 1];
  p.block_rows = block_rows;
  p.block_cols = block_cols;

  const int64_t total_rows = p.batch * p.rows;
  if (total_rows == 0 || p.cols == 0) return;
  const int64_t grid_x = (p.cols + kThreads - 1) / kThreads;
  if (grid_x > 0x7fffffff) fail(kOp, ": x: expected fewer than 2^31 · ", kThreads, " columns, got ", p.cols);
  const dim3 grid(static_cast<unsigned>(grid_x), static_cast<unsigned>(std::min(total_rows, kMaxGridY)));
  if (y.dtype == DType::bf16)
    launch_kernel(kOp, dequantize_fp8_blocks_kernel<uint16_t>, {grid, kThreads, 0}, stream, p);
  else
    launch_kernel(kOp, dequantize_fp8_blocks_kernel<float>, {grid, kThreads, 0}, stream, p);
}

}  // namespace dsv4::cuda

// FP8 activation quantization kernel. Each lane holds one chunk of 8 consecutive values of a row
// (one 16-byte load of bf16, two of fp32, when the rows are 16-byte aligned); the block / 8 lanes
// of one quantization block (16 for block 128, 8 for 64) reduce its amax with shuffles (a max is
// exact in any order), then every lane encodes and stores its 8 codes with one 8-byte store.
// Lanes are laid over the (row, block) items in order, so a warp reads 256 consecutive values of
// a row (two blocks of 128 or four of 64) — full 16-byte vectors, no per-element index math.
#include "cuda/oproj/quantize_act_fp8.h"

#include <cstdint>

#include "cuda/common/act_quant.cuh"
#include "cuda/common/check.h"
#include "cuda/common/float_rows.cuh"
#include "cuda/common/launch.cuh"

namespace dsv4::cuda {
namespace {

constexpr const char* kOp = "quantize_act_fp8";
constexpr int kThreads = 256;
constexpr int kChunk = FloatRows::kChunk;

struct QuantizeParams {
  FloatRows x;     // [rows, cols] bf16 / fp32
  uint8_t* xq;     // [rows, cols] fp8 e4m3, row stride xq_ld
  int64_t xq_ld;
  ActScales scale;  // [rows, cols / block]
  int64_t blocks_per_row;
};

template <int kBlock, bool kVector>
__global__ void __launch_bounds__(kThreads) quantize_act_fp8_kernel(const QuantizeParams p) {
  grid_dependency_entry();
  constexpr int kLanes = kBlock / kChunk;  // lanes per quantization block
  const int64_t lane_id = static_cast<int64_t>(blockIdx.x) * kThreads + threadIdx.x;
  const int64_t item = lane_id / kLanes;  // (row, block), row-major
  const int part = static_cast<int>(lane_id % kLanes);
  const bool active = item < p.x.num_rows * p.blocks_per_row;
  const int64_t row = active ? item / p.blocks_per_row : 0, b = active ? item % p.blocks_per_row : 0;
  const int64_t col = b * kBlock + part * kChunk;
  float v[kChunk];
  if (active)
    p.x.load_chunk<kVector>(p.x.row_offset(row), col, p.x.row_len, v);
  else
#pragma unroll
    for (int i = 0; i < kChunk; ++i) v[i] = 0.0f;
  uint2 codes;
  const int32_t k = quantize_block_chunk<kLanes>(v, codes);  // every lane of the warp takes part
  if (!active) return;
  store_codes<kVector>(p.xq + row * p.xq_ld + col, codes, kChunk);
  if (part == 0) p.scale.store(row, b, k);
}

template <int kBlock>
void launch(const QuantizeParams& p, bool vector, int64_t grid, Stream stream) {
  if (vector)
    launch_kernel(kOp, quantize_act_fp8_kernel<kBlock, true>, {static_cast<unsigned>(grid), kThreads, 0},
                  stream, p);
  else
    launch_kernel(kOp, quantize_act_fp8_kernel<kBlock, false>, {static_cast<unsigned>(grid), kThreads, 0},
                  stream, p);
}

}  // namespace

void quantize_act_fp8(const TensorView& x, int block, const TensorView& xq, const TensorView& scale,
                      Stream stream) {
  QuantizeParams p;
  p.x = FloatRows::of(x);
  p.xq = static_cast<uint8_t*>(xq.data);
  p.xq_ld = xq.strides[0];
  p.scale = ActScales::of(scale);
  p.blocks_per_row = x.shape[1] / block;
  const int64_t lanes = p.x.num_rows * x.shape[1] / kChunk;
  if (lanes == 0) return;
  const int64_t grid = (lanes + kThreads - 1) / kThreads;
  if (grid > 0x7fffffff) fail(kOp, ": x: expected fewer than 2^31 · ", kThreads * kChunk, " elements, got ", lanes * kChunk);
  // 16-byte loads need aligned x rows, 8-byte code stores aligned xq rows.
  const bool vector = p.x.rows_aligned16() && reinterpret_cast<uintptr_t>(p.xq) % 8 == 0 && p.xq_ld % 8 == 0;
  if (block == 64)
    launch<64>(p, vector, grid, stream);
  else
    launch<128>(p, vector, grid, stream);
}

}  // namespace dsv4::cuda

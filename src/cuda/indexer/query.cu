// CUDA indexer queries (docs/spec.md §5), the step after the op's two dsv4::linear projections
// (src/ops/indexer.cpp): one warp per (token, head) row: RoPE, Hadamard rotation, FP8 with one power-of-two scale, and the scaling
// of the head weights. Every fp32 operation matches the CPU reference's (math::rope_rotate_pairs,
// math::hadamard_rotate, fp8_quantize_block) one for one, so identical projected rows give
// identical codes and scales.
#include <cmath>

#include "math/hadamard.h"
#include "cuda/common/check.h"
#include "cuda/common/index_vector.cuh"
#include "cuda/common/rope_table.cuh"
#include "cuda/indexer/indexer.h"
#include "cuda/indexer/warp_row128.cuh"
#include "dsv4/fp8_block.h"
#include "dsv4/indexer_math.h"
#include "dsv4/ops.h"

namespace dsv4::cuda {
namespace {

constexpr int kDim = warp_row128::kDim;
constexpr int kWarpsPerBlock = 8;

struct QueryRowsParams {
  const float* q;  // [T, H, 128] contiguous
  int64_t T;
  int H;
  IndexVector positions;
  RopeTable table;  // the last 2·table.half dims are rotated
  float hadamard_scale, weight_scale;
  uint8_t* q_fp8;
  int64_t q_fp8_stride0, q_fp8_stride1;
  float* q_scale;
  int64_t q_scale_stride0;
  float* weights;
  int64_t weights_stride0;
};

// Lane l holds dims 4l .. 4l+3 of the row (warp_row128.cuh).
__global__ void __launch_bounds__(kWarpsPerBlock * 32) query_rows_kernel(QueryRowsParams p) {
  const int lane = static_cast<int>(threadIdx.x) & 31;
  const int64_t row = static_cast<int64_t>(blockIdx.x) * kWarpsPerBlock + (threadIdx.x >> 5);
  if (row >= p.T * p.H) return;  // whole warps leave together
  const int64_t t = row / p.H;
  const int h = static_cast<int>(row % p.H);

  const float4 in = reinterpret_cast<const float4*>(p.q + row * kDim)[lane];
  float v[4] = {in.x, in.y, in.z, in.w};
  const int64_t pos = p.positions[t];
  const bool valid = p.table.contains(pos);

  if (valid) warp_row128::rope_pairs(v, lane, p.table, pos);
  warp_row128::hadamard(v, lane, p.hadamard_scale);
  uint8_t code[4];
  const int32_t k = warp_row128::quantize(v, code);

  uint8_t* codes = p.q_fp8 + t * p.q_fp8_stride0 + h * p.q_fp8_stride1 + 4 * lane;
  for (int j = 0; j < 4; ++j) codes[j] = valid ? code[j] : 0;
  if (lane == 0) {
    p.q_scale[t * p.q_scale_stride0 + h] = valid ? exp2_int(k) : __int_as_float(0x7fc00000);
    float* w = p.weights + t * p.weights_stride0 + h;
    *w = ieee_mul(*w, p.weight_scale);
  }
}

}  // namespace

void indexer_query_rows(const TensorView& q_proj, const TensorView& positions,
                        const TensorView& cos_sin, const TensorView& q_fp8,
                        const TensorView& q_scale, const TensorView& weights, Stream stream) {
  constexpr const char* kOp = "indexer_query";
  const int64_t T = q_fp8.size(0), H = q_fp8.size(1);
  check_device(kOp, "q_proj", q_proj, Device::cuda);
  check_dtype(kOp, "q_proj", q_proj, DType::fp32);
  check_contiguous(kOp, "q_proj", q_proj);
  DSV4_CHECK(q_proj.numel() == T * H * kDim, kOp, ": q_proj: expected ", T * H * kDim,
             " values, got ", q_proj.numel());
  DSV4_CHECK(reinterpret_cast<uintptr_t>(q_proj.data) % 16 == 0, kOp,
             ": q_proj: expected a 16-byte aligned address");
  if (T == 0) return;

  QueryRowsParams p;
  p.q = q_proj.ptr<const float>();
  p.T = T;
  p.H = static_cast<int>(H);
  p.positions = IndexVector::of(positions);
  p.table = RopeTable::of(cos_sin);
  // The same scales as the CPU reference (math::hadamard_rotate, indexer_query).
  p.hadamard_scale = math::hadamard_scale(kDim);
  p.weight_scale = indexer_math::indexer_weight_scale(H);
  p.q_fp8 = q_fp8.ptr<uint8_t>();
  p.q_fp8_stride0 = q_fp8.stride(0);
  p.q_fp8_stride1 = q_fp8.stride(1);
  p.q_scale = q_scale.ptr<float>();
  p.q_scale_stride0 = q_scale.stride(0);
  p.weights = weights.ptr<float>();
  p.weights_stride0 = weights.stride(0);
  const int64_t blocks = (T * H + kWarpsPerBlock - 1) / kWarpsPerBlock;
  DSV4_CHECK(blocks <= 0x7fffffff, kOp, ": T · H_I = ", T * H, " rows exceed one launch");
  query_rows_kernel<<<static_cast<unsigned>(blocks), kWarpsPerBlock * 32, 0, stream>>>(p);
  check_launch(kOp);
}

}  // namespace dsv4::cuda

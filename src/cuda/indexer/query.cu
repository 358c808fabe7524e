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
#include "dsv4/fp8_block.h"
#include "dsv4/indexer_math.h"
#include "dsv4/ops.h"

namespace dsv4::cuda {
namespace {

constexpr int kDim = indexer_keys::kDim;  // 128 = 32 lanes × 4 values
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

// Lane l holds dims 4l .. 4l+3 of the row. Each Hadamard stage is element-wise on the previous
// stage (v[k] ← v[k] + v[k+s], v[k+s] ← v[k] − v[k+s] for k without bit s), so computing the
// stages with shuffles gives the CPU's butterflies bit for bit.
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

  if (valid) {
    // GPT-J pairs (2i, 2i+1) of the last R dims; pairs never straddle lanes (4l is even).
    const int first = kDim - 2 * p.table.half;
    for (int m = 0; m < 2; ++m) {
      const int d = 4 * lane + 2 * m;
      if (d < first) continue;
      p.table.rotate(pos, (d - first) / 2, v[2 * m], v[2 * m + 1]);
    }
  }

  // Hadamard stages s = 1, 2 inside the lane, s = 4 .. 64 across lanes (partner lane l ^ s/4).
  for (int j = 0; j < 4; j += 2) {  // s = 1
    const float a = v[j], b = v[j + 1];
    v[j] = ieee_add(a, b);
    v[j + 1] = ieee_sub(a, b);
  }
  for (int j = 0; j < 2; ++j) {  // s = 2
    const float a = v[j], b = v[j + 2];
    v[j] = ieee_add(a, b);
    v[j + 2] = ieee_sub(a, b);
  }
  for (int lane_bit = 1; lane_bit < 32; lane_bit *= 2) {
    const bool upper = (lane & lane_bit) != 0;  // this lane holds the v[k+s] side
    for (int j = 0; j < 4; ++j) {
      const float other = __shfl_xor_sync(0xffffffffu, v[j], lane_bit);
      v[j] = upper ? ieee_sub(other, v[j]) : ieee_add(v[j], other);
    }
  }
  for (int j = 0; j < 4; ++j) v[j] = ieee_mul(v[j], p.hadamard_scale);

  // fp8_quantize_block over the 128 values: amax (order-free), the UE8M0 exponent, the codes.
  float amax = 0.0f;
  for (int j = 0; j < 4; ++j) amax = fmaxf(amax, fabsf(v[j]));
  for (int off = 16; off > 0; off /= 2)
    amax = fmaxf(amax, __shfl_xor_sync(0xffffffffu, amax, off));
  const int32_t k = ue8m0_exponent_for_amax(amax);
  const float inv = exp2_int(-k);

  uint8_t* codes = p.q_fp8 + t * p.q_fp8_stride0 + h * p.q_fp8_stride1 + 4 * lane;
  for (int j = 0; j < 4; ++j) codes[j] = valid ? float_to_fp8_e4m3(ieee_mul(v[j], inv)) : 0;
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

// The V3.2 indexer's row steps on CUDA (sparse_mla_indexer.h): one warp per 128-dim row, lane l
// holding dims 4l .. 4l+3.
//   queries: NeoX RoPE, Hadamard, FP8 with one power-of-two scale per (token, head) row, and
//            the row's head weight scaled (when given);
//   keys:    LayerNorm (fp32, biased variance), then the same steps, stored into the FP8 indexer
//            key cache at the token's slot.
// Every fp32 operation is the CPU reference's (src/cpu/sparse_mla_indexer.cpp) one for one, in its
// order — the LayerNorm's mean and variance are sequential sums there, so lane 0 adds the row
// in dim order from shared memory — so identical inputs give identical codes, scales and bytes.
#include <cuda_runtime.h>

#include <cstdint>

#include "cuda/common/check.h"
#include "cuda/common/float_rows.cuh"
#include "cuda/common/index_vector.cuh"
#include "cuda/common/launch.cuh"
#include "cuda/common/rope_table.cuh"
#include "cuda/index/warp_rows.cuh"
#include "cuda/indexer/sparse_mla_indexer.h"
#include "cuda/indexer/warp_row128.cuh"
#include "dsv4/indexer_math.h"
#include "math/hadamard.h"

namespace dsv4::cuda {
namespace {

namespace wr = warp_row128;
using index_rows::kWarpsPerBlock;  // one warp per row, as the index kernels (warp_rows.cuh)
constexpr int kDim = wr::kDim;
constexpr uint32_t kNaNBits = 0x7fc00000u;

// The calling warp's index in its block: which shared-memory stage (128 floats) is its own.
__device__ __forceinline__ int warp_in_block() { return static_cast<int>(threadIdx.x / 32); }

__device__ __forceinline__ void load_row4(const FloatRows& rows, int64_t r, int lane, float (&v)[4]) {
  const int64_t off = rows.row_offset(r);
  for (int j = 0; j < 4; ++j) v[j] = rows.load(off, 4 * lane + j);
}

// RoPE (NeoX halves), Hadamard and FP8 of the warp's row: this lane's codes, the exponent.
__device__ __forceinline__ int32_t prepare_row(float (&v)[4], int lane, const RopeTable& table, int64_t pos,
                                               float hadamard_scale, float* stage, uint8_t (&codes)[4]) {
  wr::rope_halves(v, lane, table, pos, stage);
  wr::hadamard(v, lane, hadamard_scale);
  return wr::quantize(v, codes);
}

// ---------------------------------------------------------------- queries
struct QuantizeParams {
  FloatRows x;  // rows (t, h) of 128
  int64_t heads;
  IndexVector positions;
  RopeTable table;
  float hadamard_scale;
  uint8_t* codes;  // [T, n, 128], strides in bytes
  int64_t codes_stride0, codes_stride1;
  float* scales;  // [T, n]
  int64_t scales_stride0, scales_stride1;
  float* weights;  // [T, n], scaled in place; nullptr: none
  int64_t weights_stride0, weights_stride1;
  float weight_scale;
};

__global__ void __launch_bounds__(kWarpsPerBlock * 32) quantize_rows_kernel(const QuantizeParams p) {
  grid_dependency_entry();
  __shared__ float stage[kWarpsPerBlock][kDim];
  const int64_t row = index_rows::warp_row();
  if (row >= p.x.num_rows) return;  // whole warps leave together
  const int lane = index_rows::lane_id();
  const int64_t t = row / p.heads, h = row % p.heads;
  const int64_t pos = p.positions[t];
  const bool valid = p.table.contains(pos);
  float v[4];
  load_row4(p.x, row, lane, v);
  uint8_t codes[4] = {0, 0, 0, 0};
  int32_t k = 0;
  if (valid) k = prepare_row(v, lane, p.table, pos, p.hadamard_scale, stage[warp_in_block()], codes);  // uniform
  uint8_t* out = p.codes + t * p.codes_stride0 + h * p.codes_stride1 + 4 * lane;
  for (int j = 0; j < 4; ++j) out[j] = codes[j];
  if (lane == 0) {
    p.scales[t * p.scales_stride0 + h * p.scales_stride1] = valid ? exp2_int(k) : __uint_as_float(kNaNBits);
    if (p.weights != nullptr) {
      float* w = p.weights + t * p.weights_stride0 + h * p.weights_stride1;
      *w = ieee_mul(*w, p.weight_scale);  // the CPU's one fp32 multiply
    }
  }
}

// ---------------------------------------------------------------- keys
struct KeyInsertParams {
  FloatRows k;  // rows t of 128
  const void* norm_weight;
  bool weight_bf16;
  const void* norm_bias;
  bool bias_bf16;
  float eps;
  IndexVector positions, slots;
  RopeTable table;
  float hadamard_scale;
  uint8_t* cache;
  int64_t block_stride, num_slots;
  int block_size;
};

__global__ void __launch_bounds__(kWarpsPerBlock * 32) key_insert_kernel(const KeyInsertParams p) {
  grid_dependency_entry();
  __shared__ float stage[kWarpsPerBlock][kDim];
  const int64_t row = index_rows::warp_row();
  if (row >= p.k.num_rows) return;  // whole warps leave together
  const int lane = index_rows::lane_id();
  const int64_t slot = p.slots[row], pos = p.positions[row];
  if (slot < 0 || slot >= p.num_slots || !p.table.contains(pos)) return;  // uniform
  float v[4];
  load_row4(p.k, row, lane, v);

  // LayerNorm with the CPU's sequential sums (lane 0, dims in order), broadcast.
  float* values = stage[warp_in_block()];
  for (int j = 0; j < 4; ++j) values[4 * lane + j] = v[j];
  __syncwarp();
  float mean = 0.0f, inv = 0.0f;
  if (lane == 0) {
    for (int i = 0; i < kDim; ++i) mean = ieee_add(mean, values[i]);
    mean = ieee_div(mean, static_cast<float>(kDim));
    float var = 0.0f;
    for (int i = 0; i < kDim; ++i) {
      const float d = ieee_sub(values[i], mean);
      var = ieee_add(var, ieee_mul(d, d));
    }
    inv = ieee_div(1.0f, ieee_sqrt(ieee_add(ieee_div(var, static_cast<float>(kDim)), p.eps)));
  }
  mean = __shfl_sync(0xffffffffu, mean, 0);
  inv = __shfl_sync(0xffffffffu, inv, 0);
  __syncwarp();  // the stage is read before rope_halves writes it
  for (int j = 0; j < 4; ++j) {
    const int i = 4 * lane + j;
    const float weight = load_float(p.norm_weight, p.weight_bf16, i), bias = load_float(p.norm_bias, p.bias_bf16, i);
    v[j] = ieee_add(ieee_mul(ieee_mul(ieee_sub(v[j], mean), inv), weight), bias);
  }

  uint8_t codes[4];
  const int32_t k = prepare_row(v, lane, p.table, pos, p.hadamard_scale, values, codes);
  uint8_t* block = p.cache + (slot / p.block_size) * p.block_stride;
  const int offset = static_cast<int>(slot % p.block_size);
  uint8_t* out = block + indexer_key_data_offset(offset) + 4 * lane;
  for (int j = 0; j < 4; ++j) out[j] = codes[j];
  if (lane == 0) *reinterpret_cast<float*>(block + indexer_key_scale_offset(p.block_size, offset)) = exp2_int(k);
}

}  // namespace

void sparse_mla_indexer_quantize(const TensorView& x, const TensorView& positions,
                                 const TensorView& cos_sin, const TensorView& codes,
                                 const TensorView& scales, const TensorView& weights,
                                 Stream stream) {
  constexpr const char* kOp = "sparse_mla_indexer_quantize";
  QuantizeParams p;
  p.x = FloatRows::of(x);
  if (p.x.num_rows == 0) return;
  p.heads = x.shape[1];
  p.positions = IndexVector::of(positions);
  p.table = RopeTable::of(cos_sin);
  p.hadamard_scale = math::hadamard_scale(kDim);  // math::hadamard_rotate's
  p.codes = codes.ptr<uint8_t>();
  p.codes_stride0 = codes.strides[0];
  p.codes_stride1 = codes.strides[1];
  p.scales = scales.ptr<float>();
  p.scales_stride0 = scales.strides[0];
  p.scales_stride1 = scales.strides[1];
  p.weights = weights.defined() ? weights.ptr<float>() : nullptr;
  p.weights_stride0 = weights.defined() ? weights.strides[0] : 0;
  p.weights_stride1 = weights.defined() ? weights.strides[1] : 0;
  p.weight_scale = indexer_math::indexer_weight_scale(p.heads);  // the CPU kernel's
  launch_kernel(kOp, quantize_rows_kernel,
                {index_rows::blocks_for(kOp, p.x.num_rows), kWarpsPerBlock * 32, 0}, stream, p);
}

void sparse_mla_indexer_key_insert(const TensorView& k, const TensorView& norm_weight,
                                   const TensorView& norm_bias, float eps,
                                   const TensorView& positions, const TensorView& cos_sin,
                                   const IndexerKeyCacheView& keys, const TensorView& slot_mapping,
                                   Stream stream) {
  constexpr const char* kOp = "sparse_mla_indexer_key_insert";
  KeyInsertParams p;
  p.k = FloatRows::of(k);
  if (p.k.num_rows == 0) return;
  p.norm_weight = norm_weight.data;
  p.weight_bf16 = norm_weight.dtype == DType::bf16;
  p.norm_bias = norm_bias.data;
  p.bias_bf16 = norm_bias.dtype == DType::bf16;
  p.eps = eps;
  p.positions = IndexVector::of(positions);
  p.slots = IndexVector::of(slot_mapping);
  p.table = RopeTable::of(cos_sin);
  p.hadamard_scale = math::hadamard_scale(kDim);
  p.cache = keys.data.ptr<uint8_t>();
  p.block_stride = keys.data.strides[0];
  p.num_slots = keys.num_slots();
  p.block_size = keys.block_size;
  launch_kernel(kOp, key_insert_kernel, {index_rows::blocks_for(kOp, p.k.num_rows), kWarpsPerBlock * 32, 0},
                stream, p);
}

}  // namespace dsv4::cuda

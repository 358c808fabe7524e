// CUDA indexer queries (docs/spec.md §5), the step after the op's two dsv4::linear projections
// (src/ops/indexer.cpp): per (token, head) row of 128 fp32 values, RoPE on the last rope dims,
// the Hadamard rotation, FP8 with one power-of-two scale, and the scaling of the head weights.
// Every fp32 operation matches the CPU reference's (math::rope_rotate_pairs,
// math::hadamard_rotate, fp8_quantize_block) one for one, so identical projected rows give
// identical codes and scales.
//
// Work layout: four lanes per row (lane_group_row128.cuh), 64 rows per 256-thread block over the
// flat [T·H] rows; the row's token is one multiply-high (FastDivmod). Each lane issues its eight
// 16-byte loads before any arithmetic.
//
// Why (ncu on an H200, 16384 tokens × 64 heads, the first V4-Flash C4A prefill launch): the
// kernel before this one — a warp per row, four values per lane — ran 605 µs against a ~0.16 ms
// floor (0.54 GB of fp32 read, 0.13 GB written), issue-bound (SM 88.5 %, DRAM 23 %, 0.89 warps
// issued per scheduler). Per row it paid 25 shuffles and 40 predicated adds for the Hadamard's
// five cross-lane stages, a software FP8 encoder (~25 instructions per value, branchy), four
// byte stores per lane and a 64-bit division for the token: ~400 issued instructions per lane
// for 4 values. Now the Hadamard has two shuffle stages (one shuffle and one FMA per value
// each), the codes come from the hardware conversion (fp8_convert.cuh: bit-identical), stores
// are one 4-byte word per four codes, the index math is 32-bit: ~700 instructions per lane for
// 32 values, 55 registers. See docs/notes/layer-cuda.md ("Prefill element-wise kernels").
#include <cmath>
#include <cstdint>

#include "cuda/common/act_quant.cuh"
#include "cuda/common/check.h"
#include "cuda/common/fast_divmod.cuh"
#include "cuda/common/index_vector.cuh"
#include "cuda/common/launch.cuh"
#include "cuda/common/rope_table.cuh"
#include "cuda/indexer/indexer.h"
#include "cuda/indexer/lane_group_row128.cuh"
#include "dsv4/indexer_math.h"
#include "dsv4/ops.h"
#include "math/hadamard.h"

namespace dsv4::cuda {
namespace {

constexpr int kLanesPerRow = 4;
using Row = LaneGroupRow128<kLanesPerRow>;
constexpr int kDim = Row::kDim;
constexpr int kThreads = 256;
constexpr int kRowsPerBlock = kThreads / kLanesPerRow;

struct QueryRowsParams {
  const float* q;       // [T·H, 128] contiguous, 16-byte aligned
  int32_t rows;         // T·H
  int32_t heads;        // H
  FastDivmod token_of;  // row → its token (divisor H)
  IndexVector positions;
  RopeTable table;
  int32_t first_rope_dim;  // 128 − 2·table.half: the dims from here on are rotated
  float hadamard_scale, weight_scale;
  uint8_t* q_fp8;  // [T, H, 128], strides (q_fp8_stride0, q_fp8_stride1, 1)
  int64_t q_fp8_stride0, q_fp8_stride1;
  float* q_scale;  // [T, H], row stride q_scale_stride0
  int64_t q_scale_stride0;
  float* weights;  // [T, H], row stride weights_stride0
  int64_t weights_stride0;
};

// Stores the codes of one float4 group (four dims) at p: one 4-byte store when kWordStores (p
// 4-byte aligned), else byte by byte.
template <bool kWordStores>
__device__ __forceinline__ void store_code_word(uint8_t* p, uint32_t word) {
  if constexpr (kWordStores) {
    *reinterpret_cast<uint32_t*>(p) = word;
  } else {
#pragma unroll
    for (int i = 0; i < 4; ++i) p[i] = static_cast<uint8_t>(word >> (8 * i));
  }
}

template <bool kWordStores>
__global__ void __launch_bounds__(kThreads) query_rows_kernel(const QueryRowsParams p) {
  grid_dependency_entry();
  const int lane = static_cast<int>(threadIdx.x) % kLanesPerRow;
  const int32_t row = static_cast<int32_t>(blockIdx.x) * kRowsPerBlock +
                      static_cast<int32_t>(threadIdx.x) / kLanesPerRow;
  // Rows past the end (the last block's) recompute the last row, unstored: every lane of the
  // warp takes part in the shuffles, and no lane needs a zero-filled path.
  const bool live = row < p.rows;
  const int32_t r = live ? row : p.rows - 1;
  const int32_t t = static_cast<int32_t>(p.token_of.div(static_cast<uint32_t>(r)));
  const int32_t h = r - t * p.heads;

  float v[Row::kValues];
  Row::load(p.q + static_cast<int64_t>(r) * kDim, lane, v);
  const int64_t pos = p.positions[t];
  const bool valid = p.table.contains(pos);  // else: codes 0, scale NaN (the token is marked)

  if (valid) Row::rope_pairs(v, lane, p.table.angles(pos), p.first_rope_dim);
  Row::hadamard(v, lane, p.hadamard_scale);
  uint2 codes[Row::kValues / 8];
  const int32_t k = quantize_block_values<kLanesPerRow, Row::kValues>(v, codes);
  if (!live) return;

  // The lane's groups lie 4·kLanes bytes apart from its first: one base address, immediates.
  uint8_t* out = p.q_fp8 + t * p.q_fp8_stride0 + h * p.q_fp8_stride1 + Row::dim(lane, 0);
#pragma unroll
  for (int g = 0; g < Row::kGroups; ++g) {
    const uint32_t word = g % 2 ? codes[g / 2].y : codes[g / 2].x;
    store_code_word<kWordStores>(out + Row::dim(0, 4 * g), valid ? word : 0u);
  }
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
  if (T == 0 || H == 0) return;
  // int32 row math: T · H_I plus a block's worth of rows past the end.
  DSV4_CHECK(T * H <= INT32_MAX - kRowsPerBlock, kOp, ": T · H_I = ", T * H, " rows exceed one launch");

  QueryRowsParams p;
  p.q = q_proj.ptr<const float>();
  p.rows = static_cast<int32_t>(T * H);
  p.heads = static_cast<int32_t>(H);
  p.token_of = FastDivmod::of(H);
  p.positions = IndexVector::of(positions);
  p.table = RopeTable::of(cos_sin);
  p.first_rope_dim = kDim - 2 * p.table.half;
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
  const bool word_stores = reinterpret_cast<uintptr_t>(p.q_fp8) % 4 == 0 && p.q_fp8_stride0 % 4 == 0 &&
                           p.q_fp8_stride1 % 4 == 0;
  const unsigned blocks = static_cast<unsigned>((T * H + kRowsPerBlock - 1) / kRowsPerBlock);
  if (word_stores)
    launch_kernel(kOp, query_rows_kernel<true>, {blocks, kThreads, 0}, stream, p);
  else
    launch_kernel(kOp, query_rows_kernel<false>, {blocks, kThreads, 0}, stream, p);
}

}  // namespace dsv4::cuda

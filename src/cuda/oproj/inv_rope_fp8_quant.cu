// Fused inverse RoPE + FP8 quantization of the attention output. Lane g of the grid owns chunk
// g of the flattened [T, H·D] output (8 consecutive values of one head); the block / 8 lanes of a
// quantization block are consecutive lanes of one warp (a block never spans two heads: D is a
// multiple of it), so the block's amax is a shuffle reduction among them (act_quant.cuh).
#include "cuda/oproj/inv_rope_fp8_quant.h"

#include <cstdint>

#include "cuda/common/check.h"
#include "cuda/common/float_rows.cuh"
#include "cuda/common/index_vector.cuh"
#include "cuda/common/rope_table.cuh"
#include "cuda/common/act_quant.cuh"

namespace dsv4::cuda {
namespace {

constexpr const char* kOp = "inv_rope_fp8_quant";
constexpr int kThreads = 256;
constexpr int kChunk = FloatRows::kChunk;

struct InvRopeQuantParams {
  FloatRows o;  // rows (t, h) of D bf16 values
  int64_t tokens, heads, head_dim;
  IndexVector positions;  // [T]
  RopeTable table;
  uint8_t* o_fp8;  // [T, H·D], row stride o_fp8_ld
  int64_t o_fp8_ld;
  ActScales scale;  // [T, H·D / block]
};

template <int kBlock, bool kVector>
__global__ void __launch_bounds__(kThreads) inv_rope_fp8_quant_kernel(const InvRopeQuantParams p) {
  constexpr int kLanes = kBlock / kChunk;
  const int64_t chunks_per_token = p.heads * p.head_dim / kChunk;
  const int64_t g = static_cast<int64_t>(blockIdx.x) * kThreads + threadIdx.x;
  const int64_t t = g / chunks_per_token, c = g % chunks_per_token;
  const int64_t col = c * kChunk;  // in the flattened [H·D] row
  const int64_t h = col / p.head_dim, d0 = col % p.head_dim;
  const int64_t pos = t < p.tokens ? p.positions[t] : -1;
  const bool active = t < p.tokens && p.table.contains(pos);  // the same for a block's lanes
  float v[kChunk];
  if (active) {
    p.o.load_chunk<kVector>(p.o.row_offset(t * p.heads + h), d0, p.head_dim, v);
    const int64_t nope = p.head_dim - 2 * p.table.half;
#pragma unroll
    for (int k = 0; k < kChunk / 2; ++k) {
      const int64_t d = d0 + 2 * k;
      if (d < nope) continue;
      p.table.rotate(pos, static_cast<int>((d - nope) / 2), v[2 * k], v[2 * k + 1], /*inverse=*/true);
      v[2 * k] = round_bf16(v[2 * k]);  // what a bf16 o would hold after apply_rope
      v[2 * k + 1] = round_bf16(v[2 * k + 1]);
    }
  } else {
#pragma unroll
    for (int k = 0; k < kChunk; ++k) v[k] = 0.0f;
  }
  uint2 codes;
  const int32_t k = quantize_block_chunk<kLanes>(v, codes);  // every lane of the warp takes part
  if (!active) return;
  store_codes<kVector>(p.o_fp8 + t * p.o_fp8_ld + col, codes, kChunk);
  if (g % kLanes == 0) p.scale.store(t, col / kBlock, k);
}

template <int kBlock>
void launch(const InvRopeQuantParams& p, bool vector, int64_t grid, Stream stream) {
  if (vector)
    inv_rope_fp8_quant_kernel<kBlock, true><<<static_cast<unsigned>(grid), kThreads, 0, stream>>>(p);
  else
    inv_rope_fp8_quant_kernel<kBlock, false><<<static_cast<unsigned>(grid), kThreads, 0, stream>>>(p);
}

}  // namespace

void inv_rope_fp8_quant(const TensorView& o, const TensorView& positions, const TensorView& cos_sin,
                        int block, const TensorView& o_fp8, const TensorView& o_scale, Stream stream) {
  InvRopeQuantParams p;
  p.o = FloatRows::of(o);
  p.tokens = o.shape[0];
  p.heads = o.shape[1];
  p.head_dim = o.shape[2];
  p.positions = IndexVector::of(positions);
  p.table = RopeTable::of(cos_sin);
  p.o_fp8 = static_cast<uint8_t*>(o_fp8.data);
  p.o_fp8_ld = o_fp8.strides[0];
  p.scale = ActScales::of(o_scale);
  const int64_t lanes = p.tokens * p.heads * p.head_dim / kChunk;
  if (lanes == 0) return;
  const int64_t grid = (lanes + kThreads - 1) / kThreads;
  if (grid > 0x7fffffff) fail(kOp, ": o: expected fewer than 2^31 · ", kThreads * kChunk, " elements, got ", lanes * kChunk);
  const bool vector = p.o.rows_aligned16() && reinterpret_cast<uintptr_t>(p.o_fp8) % 8 == 0 && p.o_fp8_ld % 8 == 0;
  if (block == 64)
    launch<64>(p, vector, grid, stream);
  else
    launch<128>(p, vector, grid, stream);
  check_launch(kOp);
}

}  // namespace dsv4::cuda

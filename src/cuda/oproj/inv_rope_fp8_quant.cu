// Fused inverse RoPE + FP8 quantization of the attention output o [T, H, D] (bf16, any strides
// with a contiguous last dim) into o_fp8 [T, H·D] and one scale per token and block of the
// flattened row.
//
// Work layout. Token t is grid row blockIdx.y (past kMaxTokenRows tokens a block row loops over
// tokens gridDim.y apart); blockIdx.x and the thread pick units of its flattened row. A unit is
// 16 values of one quantization block owned by one lane: lane i of the block's kLanes = block / 16
// lanes holds values [8i, 8i + 8) and [block/2 + 8i, block/2 + 8i + 8) of it. So each of the
// lane's two 16-byte loads is part of a whole contiguous segment of the warp (block / 2 values per
// kLanes lanes), and the block's amax, exponent and scale cost one lane's work per 16 values
// instead of per 8. A thread takes kUnitsPerThread units 256 apart, all four 16-byte loads issued
// before any arithmetic.
//
// Why (ncu on an H200, the first launch of a V4-Flash C4A prefill step, 16384 tokens × 64 heads
// × 512 dims): the kernel before this one — one 8-value chunk per lane over a flat 1-D grid,
// int64 index math, rows through FloatRows — ran 1.72 ms against a ~0.38 ms floor, compute-bound
// (SM 77 %, DRAM 19.5 %, 44 registers): a chunk paid four 64-bit divisions (flat index → token,
// → column; column → head; FloatRows::row_offset's loop over the leading dims), ~410 issued
// instructions for 8 values before any RoPE. Here the column → head split is one multiply-high
// (FastDivmod); the position and its table row come once per token; the FP8 codes' NaN test is
// one per lane (act_quant.cuh); a half wholly in the rope dims rotates without per-pair tests and
// rounds to bf16 in hardware (round_bf16x8). ~370 instructions per lane and token for 32 values
// (~530 in the warps that hold rope dims), 61 registers. See docs/notes/layer-cuda.md ("Prefill
// element-wise kernels") for the counts and what to measure.
//
// The arithmetic per value is the CPU op's (rope_rotate_pair with the conjugate angle, rounding
// to bf16, quantize_act_fp8's UE8M0 rule through act_quant.cuh), so the bytes are identical.
#include "cuda/oproj/inv_rope_fp8_quant.h"

#include <algorithm>
#include <cstdint>

#include "cuda/common/act_quant.cuh"
#include "cuda/common/check.h"
#include "cuda/common/fast_divmod.cuh"
#include "cuda/common/fp8_convert.cuh"
#include "cuda/common/index_vector.cuh"
#include "cuda/common/launch.cuh"
#include "cuda/common/rope_table.cuh"

namespace dsv4::cuda {
namespace {

constexpr const char* kOp = "inv_rope_fp8_quant";
constexpr int kThreads = 256;
constexpr int kHalf = 8;              // values of one 16-byte bf16 load
constexpr int kUnitValues = 2 * kHalf;  // values per lane and unit
constexpr int kUnitsPerThread = 2;
constexpr int kUnitsPerBlock = kThreads * kUnitsPerThread;
// Block rows (grid.y): one per token up to this many tokens, so decode and short prefills keep
// every token in flight at once; past it a block row loops over tokens, which amortizes the
// thread's setup (~50 instructions: parameters, block and thread indices) while a long prefill
// still launches thousands of blocks.
constexpr int64_t kMaxTokenRows = 4096;

struct InvRopeQuantParams {
  const uint16_t* o;  // bf16 bits of o [T, H, D], strides (o_token_stride, o_head_stride, 1)
  int64_t o_token_stride, o_head_stride;
  int64_t tokens;
  int32_t units;        // units per token: H·D / 16
  int32_t head_dim;     // D
  FastDivmod head_of;   // column of the flattened row → its head
  int32_t nope;         // leading dims of a head left unrotated: D − 2·table.half
  IndexVector positions;  // [T]
  RopeTable table;
  uint8_t* o_fp8;  // [T, H·D], row stride o_fp8_ld
  int64_t o_fp8_ld;
  ActScales scale;  // [T, H·D / block]
};

// The bits of 8 bf16 values at p: one 16-byte load when kVector (p 16-byte aligned), else eight
// 2-byte loads packed the same way, so both paths unpack alike.
template <bool kVector>
__device__ __forceinline__ uint4 load_bf16x8(const uint16_t* p) {
  if constexpr (kVector) {
    return *reinterpret_cast<const uint4*>(p);
  } else {
    uint32_t w[4];
#pragma unroll
    for (int k = 0; k < 4; ++k) w[k] = p[2 * k] | (static_cast<uint32_t>(p[2 * k + 1]) << 16);
    return make_uint4(w[0], w[1], w[2], w[3]);
  }
}

__device__ __forceinline__ void unpack_bf16x8(const uint4& raw, float* v) {
  const uint32_t w[4] = {raw.x, raw.y, raw.z, raw.w};
#pragma unroll
  for (int k = 0; k < 4; ++k) {
    v[2 * k] = bf16_bits_to_float(static_cast<uint16_t>(w[k] & 0xffffu));
    v[2 * k + 1] = bf16_bits_to_float(static_cast<uint16_t>(w[k] >> 16));
  }
}

// Inverse RoPE of the rotated pairs among head dims [d, d + 8) (those at or past nope), each
// value rounded to bf16 as apply_rope into a bf16 o would leave it (the CPU op's order). Most
// halves lie wholly before the rope dims and leave at the first test. A half wholly inside them
// (the costly case: a warp's other lanes wait for it) rotates its four pairs without per-pair
// tests and rounds through the hardware conversion; the half the rope dims start in (only when
// nope is not a multiple of 8) goes pair by pair.
__device__ __forceinline__ void inverse_rope_half(float* v, int d, int nope, const RopeTable& table,
                                                  int64_t pos) {
  if (d + kHalf <= nope) return;
  const RopeAngles angles = table.angles(pos);
  const int j0 = (d - nope) / 2;  // pair k is rope pair j0 + k: one base address, immediates
  if (d >= nope) {
#pragma unroll
    for (int k = 0; k < kHalf / 2; ++k) angles.rotate(j0 + k, v[2 * k], v[2 * k + 1], /*inverse=*/true);
    round_bf16x8(v);
    return;
  }
#pragma unroll
  for (int k = 0; k < kHalf / 2; ++k) {
    if (d + 2 * k < nope) continue;
    angles.rotate(j0 + k, v[2 * k], v[2 * k + 1], /*inverse=*/true);
    v[2 * k] = round_bf16(v[2 * k]);
    v[2 * k + 1] = round_bf16(v[2 * k + 1]);
  }
}

template <int kBlock, bool kVector>
__global__ void __launch_bounds__(kThreads) inv_rope_fp8_quant_kernel(const InvRopeQuantParams p) {
  grid_dependency_entry();
  constexpr int kLanes = kBlock / kUnitValues;  // lanes per quantization block
  constexpr int kHalfBlock = kBlock / 2;
  const int lane = static_cast<int>(threadIdx.x) & 31;

  for (int64_t t = blockIdx.y; t < p.tokens; t += gridDim.y) {
    const int64_t pos = p.positions[t];
    if (!p.table.contains(pos)) continue;  // the whole block leaves the token unwritten
    // Where this thread's units lie in a token's row: the same for every token, but recomputed
    // per token (a multiply-high each) rather than kept: held across the loop they cost 13
    // registers, which dropped the kernel from 4 to 3 resident blocks.
    int32_t unit[kUnitsPerThread], col[kUnitsPerThread], dim[kUnitsPerThread];
    const uint16_t* in[kUnitsPerThread];  // the unit's first value in token 0's rows of o
#pragma unroll
    for (int j = 0; j < kUnitsPerThread; ++j) {
      unit[j] = static_cast<int32_t>(blockIdx.x) * kUnitsPerBlock + j * kThreads +
                static_cast<int32_t>(threadIdx.x);
      col[j] = unit[j] / kLanes * kBlock + unit[j] % kLanes * kHalf;
      const int32_t h = static_cast<int32_t>(p.head_of.div(static_cast<uint32_t>(col[j])));
      dim[j] = col[j] - h * p.head_dim;
      in[j] = p.o + h * p.o_head_stride + dim[j];
    }
    const int64_t in_t = t * p.o_token_stride;

    // All loads first; a lane past the row holds zeros, which quantize to nothing stored.
    uint4 raw[kUnitsPerThread][2];
#pragma unroll
    for (int j = 0; j < kUnitsPerThread; ++j) {
      raw[j][0] = raw[j][1] = make_uint4(0, 0, 0, 0);
      if (unit[j] >= p.units) continue;
      raw[j][0] = load_bf16x8<kVector>(in[j] + in_t);
      raw[j][1] = load_bf16x8<kVector>(in[j] + in_t + kHalfBlock);
    }

    uint8_t* out_t = p.o_fp8 + t * p.o_fp8_ld;
#pragma unroll
    for (int j = 0; j < kUnitsPerThread; ++j) {
      if (unit[j] - lane >= p.units) break;  // the whole warp is past the row (later j: further)
      const bool live = unit[j] < p.units;   // a quantization block's lanes agree
      float v[kUnitValues];
      unpack_bf16x8(raw[j][0], v);
      unpack_bf16x8(raw[j][1], v + kHalf);
      if (live) {
        inverse_rope_half(v, dim[j], p.nope, p.table, pos);
        inverse_rope_half(v + kHalf, dim[j] + kHalfBlock, p.nope, p.table, pos);
      }
      uint2 codes[2];
      const int32_t k = quantize_block_values<kLanes, kUnitValues>(v, codes);  // every lane of the warp
      if (!live) continue;
      store_codes<kVector>(out_t + col[j], codes[0], kHalf);
      store_codes<kVector>(out_t + col[j] + kHalfBlock, codes[1], kHalf);
      if (unit[j] % kLanes == 0) p.scale.store(t, unit[j] / kLanes, k);
    }
  }
}

template <int kBlock>
void launch(const InvRopeQuantParams& p, bool vector, dim3 grid, Stream stream) {
  if (vector)
    launch_kernel(kOp, inv_rope_fp8_quant_kernel<kBlock, true>, {grid, kThreads, 0}, stream, p);
  else
    launch_kernel(kOp, inv_rope_fp8_quant_kernel<kBlock, false>, {grid, kThreads, 0}, stream, p);
}

}  // namespace

void inv_rope_fp8_quant(const TensorView& o, const TensorView& positions, const TensorView& cos_sin,
                        int block, const TensorView& o_fp8, const TensorView& o_scale, Stream stream) {
  const int64_t T = o.shape[0], H = o.shape[1], D = o.shape[2];
  if (T == 0 || H == 0) return;
  // int32 column math within a token's row (the op has checked D % block == 0, so D % 64 == 0).
  DSV4_CHECK(H * D <= INT32_MAX, kOp, ": o: expected fewer than 2^31 values per token, got H · D = ",
             H * D);
  InvRopeQuantParams p;
  p.o = static_cast<const uint16_t*>(o.data);
  p.o_token_stride = o.strides[0];
  p.o_head_stride = o.strides[1];
  p.tokens = T;
  p.units = static_cast<int32_t>(H * D / kUnitValues);
  p.head_dim = static_cast<int32_t>(D);
  p.head_of = FastDivmod::of(D);
  p.positions = IndexVector::of(positions);
  p.table = RopeTable::of(cos_sin);
  p.nope = static_cast<int32_t>(D - 2 * p.table.half);
  p.o_fp8 = static_cast<uint8_t*>(o_fp8.data);
  p.o_fp8_ld = o_fp8.strides[0];
  p.scale = ActScales::of(o_scale);
  // 16-byte loads need every row of o 16-byte aligned (a unit's halves start at multiples of 8
  // dims), 8-byte code stores every row of o_fp8 8-byte aligned.
  const bool vector = reinterpret_cast<uintptr_t>(p.o) % 16 == 0 && p.o_token_stride % 8 == 0 &&
                      p.o_head_stride % 8 == 0 && reinterpret_cast<uintptr_t>(p.o_fp8) % 8 == 0 &&
                      p.o_fp8_ld % 8 == 0;
  const dim3 grid(static_cast<unsigned>((p.units + kUnitsPerBlock - 1) / kUnitsPerBlock),
                  static_cast<unsigned>(std::min(T, kMaxTokenRows)));
  if (block == 64)
    launch<64>(p, vector, grid, stream);
  else
    launch<128>(p, vector, grid, stream);
}

}  // namespace dsv4::cuda

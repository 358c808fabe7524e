// FP8 activation quantization kernel: one warp per (row, block). Lane l holds elements
// l, l + 32, ... of the block (coalesced loads), the block's amax is a warp max (exact, so the
// order of the shuffles does not matter), and every lane encodes its own values.
#include "cuda/oproj/quantize_act_fp8.h"

#include <cstdint>

#include "cuda/common/check.h"
#include "dsv4/dtype.h"

namespace dsv4::cuda {
namespace {

constexpr const char* kOp = "quantize_act_fp8";
constexpr int kWarpsPerBlock = 8;

struct QuantizeParams {
  const void* x;  // [rows, cols] bf16 / fp32, row stride x_ld (elements)
  int64_t x_ld;
  uint8_t* xq;  // [rows, cols] fp8 e4m3, row stride xq_ld
  int64_t xq_ld;
  void* scale;  // [rows, cols / block] ue8m0 / fp32, row stride scale_ld
  int64_t scale_ld;
  bool scale_is_ue8m0;
  int64_t rows;
  int64_t blocks_per_row;
};

__device__ __forceinline__ float load_value(const uint16_t* p) { return bf16_bits_to_float(*p); }
__device__ __forceinline__ float load_value(const float* p) { return *p; }

template <typename In, int kBlock>
__global__ void __launch_bounds__(32 * kWarpsPerBlock) quantize_act_fp8_kernel(const QuantizeParams p) {
  constexpr int kPerLane = kBlock / 32;
  const int64_t item = static_cast<int64_t>(blockIdx.x) * kWarpsPerBlock + threadIdx.x / 32;
  // `item` is the same for all lanes of a warp, so whole warps leave together and the shuffles
  // below always see 32 active lanes.
  if (item >= p.rows * p.blocks_per_row) return;
  const int lane = threadIdx.x % 32;
  const int64_t row = item / p.blocks_per_row, b = item % p.blocks_per_row;

  const In* x = static_cast<const In*>(p.x) + row * p.x_ld + b * kBlock;
  float v[kPerLane];
  float amax = 0.0f;
#pragma unroll
  for (int i = 0; i < kPerLane; ++i) {
    v[i] = load_value(x + lane + 32 * i);
    amax = fmaxf(amax, fabsf(v[i]));  // a NaN is skipped, as std::max skips it on the CPU
  }
#pragma unroll
  for (int offset = 16; offset > 0; offset /= 2)
    amax = fmaxf(amax, __shfl_xor_sync(0xffffffffu, amax, offset));

  const int32_t k = ue8m0_exponent_for_amax(amax);
  const float inv_scale = exp2_int(-k);  // exact: dividing by a power of two
  uint8_t* q = p.xq + row * p.xq_ld + b * kBlock;
#pragma unroll
  for (int i = 0; i < kPerLane; ++i) q[lane + 32 * i] = float_to_fp8_e4m3(v[i] * inv_scale);
  if (lane == 0) {
    const int64_t s = row * p.scale_ld + b;
    if (p.scale_is_ue8m0)
      static_cast<uint8_t*>(p.scale)[s] = static_cast<uint8_t>(k + 127);
    else
      static_cast<float*>(p.scale)[s] = exp2_int(k);
  }
}

template <typename In>
void launch(int block, const QuantizeParams& p, int64_t grid, Stream stream) {
  if (block == 64)
    quantize_act_fp8_kernel<In, 64><<<static_cast<unsigned>(grid), 32 * kWarpsPerBlock, 0, stream>>>(p);
  else
    quantize_act_fp8_kernel<In, 128><<<static_cast<unsigned>(grid), 32 * kWarpsPerBlock, 0, stream>>>(p);
}

}  // namespace

void quantize_act_fp8(const TensorView& x, int block, const TensorView& xq, const TensorView& scale,
                      Stream stream) {
  const int64_t T = x.shape[0], K = x.shape[1];
  const QuantizeParams p{x.data,       x.strides[0],   static_cast<uint8_t*>(xq.data),
                         xq.strides[0], scale.data,     scale.strides[0],
                         scale.dtype == DType::ue8m0, T, K / block};
  const int64_t items = T * p.blocks_per_row;
  if (items == 0) return;
  const int64_t grid = (items + kWarpsPerBlock - 1) / kWarpsPerBlock;
  if (grid > 0x7fffffff) fail(kOp, ": x: expected fewer than 2^31 · ", kWarpsPerBlock, " blocks, got ", items);
  if (x.dtype == DType::bf16)
    launch<uint16_t>(block, p, grid, stream);
  else
    launch<float>(block, p, grid, stream);
  check_launch(kOp);
}

}  // namespace dsv4::cuda

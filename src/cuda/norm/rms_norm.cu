// RMSNorm kernel: one warp per row (fp32 math, the CPU reference's summation order and rounding,
// see warp_rms.cuh), y = x · inv · weight rounded once to y's type. Phase 1 (every lane reads the
// whole row) ends with a warp barrier; in phase 2 lane l reads and writes only elements l, l + 32,
// …, so y may alias x.
#include "cuda/norm/rms_norm.h"

#include <cuda_runtime.h>

#include <climits>

#include "cuda/common/check.h"
#include "cuda/common/float_rows.cuh"
#include "cuda/norm/warp_rms.cuh"

namespace dsv4::cuda {
namespace {

constexpr int kWarpsPerBlock = 8;

struct NormParams {
  FloatRows x, y;
  const void* weight;  // [row_len] bf16/fp32, or nullptr (no weight)
  bool weight_bf16;
  float eps;
};

__global__ void __launch_bounds__(32 * kWarpsPerBlock) rms_norm_kernel(const NormParams p) {
  const int64_t row = static_cast<int64_t>(blockIdx.x) * kWarpsPerBlock + threadIdx.x / 32;
  if (row >= p.x.num_rows) return;  // whole warps leave together
  const int lane = static_cast<int>(threadIdx.x % 32);
  const int64_t x_off = p.x.row_offset(row), y_off = p.y.row_offset(row), n = p.x.row_len;
  const float inv = warp_rms_inverse([&](int64_t i) { return p.x.load(x_off, i); }, n, p.eps);
  for (int64_t i = lane; i < n; i += 32) {
    const float w = p.weight != nullptr ? load_float(p.weight, p.weight_bf16, i) : 1.0f;
    p.y.store(y_off, i, cpu::rms_apply(p.x.load(x_off, i), inv, w));
  }
}

void launch_rms_norm(const char* where, const TensorView& x, const TensorView& weight, float eps,
                     const TensorView& y, Stream stream) {
  NormParams p;
  p.x = FloatRows::of(x);
  p.y = FloatRows::of(y);
  p.weight = weight.defined() ? weight.data : nullptr;
  p.weight_bf16 = weight.defined() && weight.dtype == DType::bf16;
  p.eps = eps;
  if (p.x.num_rows == 0 || p.x.row_len == 0) return;  // nothing to write
  const int64_t blocks = (p.x.num_rows + kWarpsPerBlock - 1) / kWarpsPerBlock;
  DSV4_CHECK(blocks <= INT_MAX, where, ": x: expected at most ", int64_t{INT_MAX} * kWarpsPerBlock,
             " rows, got ", p.x.num_rows);
  rms_norm_kernel<<<static_cast<unsigned>(blocks), 32 * kWarpsPerBlock, 0, stream>>>(p);
  check_launch(where);
}

// residual ← residual + delta, then (if y) y = RMSNorm(residual): phase 1 reads the whole row
// (every lane forms the same fp32 sums), phase 2 writes lane l's elements only.
struct ResidualParams {
  FloatRows residual, delta, y;
  bool has_delta, has_y;
  const void* weight;
  bool weight_bf16;
  float eps;
};

__global__ void __launch_bounds__(32 * kWarpsPerBlock) residual_add_rms_norm_kernel(
    const ResidualParams p) {
  const int64_t row = static_cast<int64_t>(blockIdx.x) * kWarpsPerBlock + threadIdx.x / 32;
  if (row >= p.residual.num_rows) return;
  const int lane = static_cast<int>(threadIdx.x % 32);
  const int64_t r_off = p.residual.row_offset(row), n = p.residual.row_len;
  const int64_t d_off = p.has_delta ? p.delta.row_offset(row) : 0;
  auto sum = [&](int64_t i) {
    const float r = p.residual.load(r_off, i);
    return p.has_delta ? r + p.delta.load(d_off, i) : r;
  };
  float inv = 0.0f;
  if (p.has_y) inv = warp_rms_inverse(sum, n, p.eps);
  const int64_t y_off = p.has_y ? p.y.row_offset(row) : 0;
  for (int64_t i = lane; i < n; i += 32) {
    const float h = sum(i);
    if (p.has_delta) p.residual.store(r_off, i, h);
    if (p.has_y) {
      const float w = p.weight != nullptr ? load_float(p.weight, p.weight_bf16, i) : 1.0f;
      p.y.store(y_off, i, cpu::rms_apply(h, inv, w));
    }
  }
}

}  // namespace

void residual_add_rms_norm(const TensorView& residual, const TensorView& delta,
                           const TensorView& weight, float eps, const TensorView& y,
                           Stream stream) {
  constexpr const char* kWhere = "residual_add_rms_norm";
  ResidualParams p;
  p.residual = FloatRows::of(residual);
  p.has_delta = delta.defined();
  p.has_y = y.defined();
  if (p.has_delta) p.delta = FloatRows::of(delta);
  if (p.has_y) p.y = FloatRows::of(y);
  p.weight = weight.defined() ? weight.data : nullptr;
  p.weight_bf16 = weight.defined() && weight.dtype == DType::bf16;
  p.eps = eps;
  if (p.residual.num_rows == 0 || p.residual.row_len == 0 || (!p.has_delta && !p.has_y)) return;
  const int64_t blocks = (p.residual.num_rows + kWarpsPerBlock - 1) / kWarpsPerBlock;
  DSV4_CHECK(blocks <= INT_MAX, kWhere, ": residual: too many rows (", p.residual.num_rows, ")");
  residual_add_rms_norm_kernel<<<static_cast<unsigned>(blocks), 32 * kWarpsPerBlock, 0, stream>>>(p);
  check_launch(kWhere);
}

void rms_norm(const TensorView& x, const TensorView& weight, float eps, const TensorView& y,
              Stream stream) {
  launch_rms_norm("rms_norm", x, weight, eps, y, stream);
}

void fused_qkv_rms_norm(const TensorView& q_in, const TensorView& wq, const TensorView& kv_in,
                        const TensorView& wkv, float eps, const TensorView& q_out,
                        const TensorView& kv_out, Stream stream) {
  // Two launches of the one kernel on the same stream: the two norms are independent (the op
  // has checked that neither output overlaps the other branch).
  launch_rms_norm("fused_qkv_rms_norm", q_in, wq, eps, q_out, stream);
  launch_rms_norm("fused_qkv_rms_norm", kv_in, wkv, eps, kv_out, stream);
}

}  // namespace dsv4::cuda

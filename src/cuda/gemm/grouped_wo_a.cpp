// Host side of the CUDA grouped_wo_a: the CUDA-only dtype and scale-layout rules, then one
// strided-batched cuBLASLt matmul over the G groups (bf16 / fp32); for FP8, one launch of the
// skinny GEMM over all G groups where it is preferred (decode sizes, skinny_gemm.h) or forced,
// else one block-scaled cuBLASLt matmul per group (matmul_xwT runs block-scaled FP8 one matrix
// per call) with the G of them side by side on fanned-out streams: one group's GEMM
// (T × o_lora_rank outputs) fills only a few SMs, so back to back the eight of V4 cost eight GEMM
// latencies.
#include "cuda/gemm/grouped_wo_a.h"

#include <algorithm>

#include "cuda/common/stream_fanout.h"
#include "cuda/gemm/cublaslt_matmul.h"
#include "cuda/gemm/skinny_gemm.h"
#include "dsv4/status.h"

namespace dsv4::cuda {

void grouped_wo_a(const TensorView& o, const TensorView& o_scale, const TensorView& wo_a,
                  const TensorView& wo_a_scale, const TensorView& z, const TensorView& workspace,
                  Stream stream) {
  // Qualified: rt::grouped_wo_a_on_path takes the same arguments, and argument-dependent lookup finds it.
  cuda::grouped_wo_a_on_path(rt::GemmChoice{}, o, o_scale, wo_a, wo_a_scale, z, workspace, stream);
}

void grouped_wo_a_on_path(const rt::GemmChoice& choice, const TensorView& o, const TensorView& o_scale,
                          const TensorView& wo_a, const TensorView& wo_a_scale, const TensorView& z,
                          const TensorView& workspace, Stream stream) {
  constexpr const char* kOp = "grouped_wo_a";
  check_matmul_dtypes(kOp, "o", o, "o_scale", o_scale, "wo_a", wo_a, "wo_a_scale", wo_a_scale, "z", z);
  const int64_t workspace_bytes = check_matmul_workspace(kOp, workspace);
  const int64_t G = wo_a.shape[0], L = wo_a.shape[1], Dg = wo_a.shape[2];
  MatmulXwT p;
  p.ab_dtype = o.dtype;
  p.y_dtype = z.dtype;
  p.T = o.shape[0];
  p.N = L;
  p.K = Dg;
  p.y_ld = z.strides[0];
  p.workspace = workspace.data;
  p.workspace_bytes = workspace_bytes;
  p.x_name = "o";
  p.w_name = "wo_a";
  p.y_name = "z";
  const int64_t ab = static_cast<int64_t>(dtype_size(o.dtype)), zb = static_cast<int64_t>(dtype_size(z.dtype));
  if (o.dtype != DType::fp8_e4m3) {
    DSV4_CHECK(choice.path != rt::GemmPath::skinny, kOp, ": the skinny GEMM (forced) takes FP8 groups only, got ",
               dtype_name(o.dtype));
    p.batch = G;
    p.x = {o.data, o.strides[0], Dg};  // group g: columns [g·Dg, (g+1)·Dg) of every row of o
    p.w = {wo_a.data, wo_a.strides[1], wo_a.strides[0]};
    p.y = z.data;
    p.y_batch_stride = L;  // group g: columns [g·L, (g+1)·L) of z
    matmul_xwT(kOp, p, stream);
    return;
  }
  check_act_scale_layout(kOp, "o_scale", o_scale);
  check_weight_scale_layout(kOp, "wo_a_scale", wo_a_scale.shape[1], wo_a_scale.shape[2],
                            wo_a_scale.strides[1], wo_a_scale.strides[2], Dg);
  // Group g's activation scales are blocks [g·Dg/128, (g+1)·Dg/128) of o_scale's T-major layout:
  // a T-major block of their own, g·(Dg/128)·T floats in.
  const int64_t scale_blocks = Dg / 128;
  SkinnyGemm skinny;
  skinny.batch = G;
  skinny.T = p.T;
  skinny.N = L;
  skinny.K = Dg;
  skinny.x = o.data;
  skinny.x_ld = o.strides[0];
  skinny.x_batch_stride = Dg;  // fp8: one byte per element
  skinny.x_scale = static_cast<const float*>(o_scale.data);
  skinny.x_scale_batch_stride = scale_blocks * o_scale.strides[1];
  skinny.w = wo_a.data;
  skinny.w_ld = wo_a.strides[1];
  skinny.w_batch_stride = wo_a.strides[0];
  skinny.w_scale = static_cast<const float*>(wo_a_scale.data);
  skinny.w_scale_ld = wo_a_scale.strides[1];
  skinny.w_scale_batch_stride = wo_a_scale.strides[0];
  skinny.y = z.data;
  skinny.y_dtype = z.dtype;
  skinny.y_ld = z.strides[0];
  skinny.y_batch_stride = L;
  skinny.workspace = workspace.data;
  skinny.workspace_bytes = workspace_bytes;
  skinny.splits = choice.skinny_splits;
  skinny.token_tile = choice.skinny_token_tile;
  if (p.T > 0 && runs_on_skinny_gemm(kOp, choice.path, skinny)) {
    MatmulXwT group0 = p;  // the rules each group's cuBLASLt call would check
    group0.x = {o.data, o.strides[0], 0};
    group0.x_scale = skinny.x_scale;
    group0.w = {wo_a.data, wo_a.strides[1], 0};
    group0.w_scale = skinny.w_scale;
    check_matmul(kOp, group0);
    skinny_gemm(skinny, stream);
    return;
  }
  // Each stream of the fan-out gets its own slice of the cuBLASLt workspace (256-byte aligned).
  const int64_t streams = std::min<int64_t>(G, kMaxFanout);
  const int64_t slice = workspace_bytes / streams / 256 * 256;
  run_fanned_out(kOp, stream, static_cast<int>(G), [&](int g, Stream group_stream) {
    MatmulXwT q = p;
    q.x = {static_cast<const char*>(o.data) + g * Dg * ab, o.strides[0], 0};
    q.x_scale = static_cast<const float*>(o_scale.data) + g * scale_blocks * o_scale.strides[1];
    q.w = {static_cast<const char*>(wo_a.data) + g * wo_a.strides[0] * ab, wo_a.strides[1], 0};
    q.w_scale = static_cast<const float*>(wo_a_scale.data) + g * wo_a_scale.strides[0];
    q.y = static_cast<char*>(z.data) + g * L * zb;
    q.workspace = slice > 0 ? static_cast<char*>(workspace.data) + (g % streams) * slice : nullptr;
    q.workspace_bytes = slice;
    matmul_xwT(kOp, q, group_stream);
  });
}

}  // namespace dsv4::cuda

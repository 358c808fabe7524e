#include "cuda/gemm/cublaslt_matmul.h"

#include <cuda_runtime.h>

#include "cuda/common/check.h"
#include "cuda/gemm/cublaslt_plan.h"
#include "dsv4/status.h"

namespace dsv4::cuda {
namespace {

// The leading dimension passed to cuBLASLt: a one-row matrix's ld is never used, but cuBLASLt
// still wants ld >= the row length; with more rows the caller's ld must cover a row.
int64_t leading_dim(const char* where, const char* name, int64_t ld, int64_t rows, int64_t row_len) {
  if (rows <= 1) return row_len;
  if (ld < row_len)
    fail(where, ": ", name, ": expected a row stride >= ", row_len,
         " elements on CUDA (cuBLASLt needs rows that do not overlap), got ", ld);
  return ld;
}

}  // namespace

void check_matmul_dtypes(const char* where, const char* x_name, const TensorView& x,
                         const char* x_scale_name, const TensorView& x_scale, const char* w_name,
                         const TensorView& w, const char* w_scale_name, const TensorView& w_scale,
                         const char* y_name, const TensorView& y) {
  if (x.dtype != w.dtype)
    fail(where, ": ", x_name, ".dtype and ", w_name, ".dtype: expected the same dtype on CUDA (bf16 and "
         "bf16, fp32 and fp32, or fp8_e4m3 and fp8_e4m3: cuBLASLt multiplies like operands), got ",
         dtype_name(x.dtype), " and ", dtype_name(w.dtype),
         x.dtype == DType::fp8_e4m3 || w.dtype == DType::fp8_e4m3
             ? " (quantize the activation with quantize_act_fp8, block 128, for an fp8 weight)"
             : "");
  if (x.dtype == DType::fp32 && y.dtype != DType::fp32)
    fail(where, ": ", y_name, ".dtype: expected fp32 on CUDA when ", x_name, " and ", w_name,
         " are fp32, got ", dtype_name(y.dtype));
  if (x.dtype != DType::fp8_e4m3) return;
  // The caller has validated the scale shapes (1 × 64 / 1 × 128 and 128 × 128 blocks).
  const auto require_fp32 = [where](const char* name, const TensorView& s, const char* how) {
    if (s.dtype != DType::fp32)
      fail(where, ": ", name, ".dtype: expected fp32 on CUDA (cuBLASLt's block-scaled FP8 modes take fp32 "
           "scales), got ", dtype_name(s.dtype), ": ", how);
  };
  require_fp32(x_scale_name, x_scale, "have quantize_act_fp8 write fp32 scales");
  require_fp32(w_scale_name, w_scale,
               "convert the checkpoint's UE8M0 scales once, at load (cuda_weight_scale in weights.h)");
  if (x_scale.shape[x_scale.ndim - 1] * 128 != x.shape[x.ndim - 1])
    fail(where, ": ", x_scale_name, ".shape[1]: expected ", x_name, ".shape[1] / 128 = ",
         x.shape[x.ndim - 1] / 128.0, " on CUDA (cuBLASLt scales activations per 1 × 128 block), got ",
         x_scale.shape[x_scale.ndim - 1]);
}

void check_act_scale_layout(const char* where, const char* name, const TensorView& scale) {
  const int64_t T = scale.shape[0], blocks = scale.shape[1];
  if (T == 0) return;  // nothing is read
  if ((T > 1 && scale.strides[0] != 1) || (blocks > 1 && scale.strides[1] != T))
    fail(where, ": ", name, ": expected cuBLASLt's 1x128 scale layout on CUDA, strides {1, ", T,
         "} (the transpose of a contiguous [", blocks, ", ", T,
         "] buffer; quantize_act_fp8 writes any strides), got strides {", scale.strides[0], ", ",
         scale.strides[1], "}");
}

void check_weight_scale_layout(const char* where, const char* name, int64_t rows, int64_t cols,
                               int64_t row_stride, int64_t col_stride, int64_t K) {
  const int64_t padded = fp8_weight_scale_row_stride(K);
  if ((cols > 1 && col_stride != 1) || (rows > 1 && row_stride != padded))
    fail(where, ": ", name, ": expected cuBLASLt's 128x128 scale layout on CUDA, rows of ", cols,
         " scales ", padded, " apart (padded to a multiple of 4; cuda_weight_scale in weights.h makes it), got strides {",
         row_stride, ", ", col_stride, "}");
}

int64_t check_matmul_workspace(const char* where, const TensorView& workspace) {
  if (!workspace.defined()) return 0;
  check_dtype(where, "workspace", workspace, DType::uint8);
  check_ndim(where, "workspace", workspace, 1);
  check_device(where, "workspace", workspace, Device::cuda);
  if (workspace.shape[0] > 1 && workspace.strides[0] != 1)
    fail_expected(where, "workspace.stride(0)", "1 (contiguous bytes)", workspace.strides[0]);
  if (reinterpret_cast<uintptr_t>(workspace.data) % 256 != 0)
    fail(where, ": workspace: expected a 256-byte aligned address, got ", workspace.data);
  return workspace.shape[0];
}

void check_matmul(const char* where, const MatmulXwT& p) {
  leading_dim(where, p.x_name, p.x.ld, p.T, p.K);
  leading_dim(where, p.w_name, p.w.ld, p.N, p.K);
  leading_dim(where, p.y_name, p.y_ld, p.T, p.N);
  if (p.ab_dtype != DType::fp8_e4m3) return;
  DSV4_CHECK(p.x_scale != nullptr && p.w_scale != nullptr, where, ": FP8 matmuls take both scales");
  // cuBLASLt (13.1, sm90) reads the 1x128 activation scales [K/128, T] with rows T apart and
  // offers no algorithm unless those rows are 16-byte aligned (measured: T = 4, 8, 12, 16, 228
  // run; 1, 2, 3, 5, 15, 17, 227 do not; bench/probes/cublaslt_blockscale_probe.cu).
  if (p.T % kFp8GemmRowMultiple != 0)
    fail(where, ": ", p.x_name, ".shape[0]: expected a multiple of ", kFp8GemmRowMultiple,
         " rows for an FP8 block-scaled GEMM on CUDA (cuBLASLt needs the 1x128 activation "
         "scales' rows 16-byte aligned); pad the rows (the layer pads its steps), got ", p.T);
  if (reinterpret_cast<uintptr_t>(p.x_scale) % 16 != 0 || reinterpret_cast<uintptr_t>(p.w_scale) % 16 != 0)
    fail(where, ": the block scales of ", p.x_name, " and ", p.w_name,
         ": expected 16-byte aligned addresses on CUDA (cuBLASLt reads them as vectors), got ", p.x_scale,
         " and ", p.w_scale);
}

void matmul_xwT(const char* where, const MatmulXwT& p, Stream stream) {
  if (p.batch == 0 || p.T == 0 || p.N == 0) return;
  const int64_t ab = static_cast<int64_t>(dtype_size(p.ab_dtype));
  const int64_t yb = static_cast<int64_t>(dtype_size(p.y_dtype));
  const int64_t y_ld = leading_dim(where, p.y_name, p.y_ld, p.T, p.N);
  if (p.K == 0) {  // empty sums: y = 0 (all-zero bytes are +0 in bf16 and fp32)
    for (int64_t b = 0; b < p.batch; ++b)
      DSV4_CUDA_CHECK(where, cudaMemset2DAsync(static_cast<char*>(p.y) + b * p.y_batch_stride * yb,
                                               static_cast<size_t>(y_ld * yb), 0,
                                               static_cast<size_t>(p.N * yb),
                                               static_cast<size_t>(p.T), stream));
    return;
  }
  MatmulKey key;
  DSV4_CUDA_CHECK(where, cudaGetDevice(&key.device));
  key.ab = p.ab_dtype;
  key.y = p.y_dtype;
  key.batch = p.batch;
  key.T = p.T;
  key.N = p.N;
  key.K = p.K;
  key.x_ld = leading_dim(where, p.x_name, p.x.ld, p.T, p.K);
  key.w_ld = leading_dim(where, p.w_name, p.w.ld, p.N, p.K);
  key.y_ld = y_ld;
  if (p.batch > 1) {
    key.x_batch_stride = p.x.batch_stride;
    key.w_batch_stride = p.w.batch_stride;
    key.y_batch_stride = p.y_batch_stride;
  }
  key.x_align = alignment_bytes(p.x.data, key.x_ld * ab, key.x_batch_stride * ab);
  key.w_align = alignment_bytes(p.w.data, key.w_ld * ab, key.w_batch_stride * ab);
  key.y_align = alignment_bytes(p.y, y_ld * yb, key.y_batch_stride * yb);
  key.workspace_bytes = p.workspace != nullptr ? p.workspace_bytes : 0;
  if (p.ab_dtype == DType::fp8_e4m3) {
    DSV4_CHECK(p.batch == 1, where, ": FP8 matmuls take no batch");
    check_matmul(where, p);
  }
  MatmulPlan& plan = cached_matmul_plan(where, key, p.x_scale, p.w_scale, p.x_name, p.w_name, p.y_name);
  plan.run(where, p.x.data, p.x_scale, p.w.data, p.w_scale, p.y, key.workspace_bytes > 0 ? p.workspace : nullptr,
           stream);
}

}  // namespace dsv4::cuda

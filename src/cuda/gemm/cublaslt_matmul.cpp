#include "cuda/gemm/cublaslt_matmul.h"

#include <cublasLt.h>
#include <cuda_runtime.h>

#include <string>

#include "cuda/common/check.h"
#include "cuda/gemm/cublaslt_handle.h"
#include "dsv4/status.h"

namespace dsv4::cuda {
namespace {

// Owns one cuBLASLt descriptor; destroyed on every exit path (the calls below may throw).
template <typename Handle, cublasStatus_t (*Destroy)(Handle)>
class LtDescriptor {
 public:
  LtDescriptor() = default;
  LtDescriptor(const LtDescriptor&) = delete;
  LtDescriptor& operator=(const LtDescriptor&) = delete;
  ~LtDescriptor() {
    if (handle_ != nullptr) Destroy(handle_);
  }
  Handle* out() { return &handle_; }
  Handle get() const { return handle_; }

 private:
  Handle handle_ = nullptr;
};
using MatmulDesc = LtDescriptor<cublasLtMatmulDesc_t, cublasLtMatmulDescDestroy>;
using Layout = LtDescriptor<cublasLtMatrixLayout_t, cublasLtMatrixLayoutDestroy>;
using Preference = LtDescriptor<cublasLtMatmulPreference_t, cublasLtMatmulPreferenceDestroy>;

cudaDataType_t cuda_data_type(DType t) { return t == DType::bf16 ? CUDA_R_16BF : CUDA_R_32F; }

// The largest power of two (at most 256, cuBLASLt's default assumption) dividing the address and
// every byte step from it that the kernel takes: the alignment every row of every batch has.
uint32_t alignment_bytes(const void* data, int64_t ld_bytes, int64_t batch_stride_bytes) {
  const uint64_t bits = static_cast<uint64_t>(reinterpret_cast<uintptr_t>(data)) |
                        static_cast<uint64_t>(ld_bytes) | static_cast<uint64_t>(batch_stride_bytes) |
                        uint64_t{256};
  return static_cast<uint32_t>(bits & (~bits + 1));
}

// The leading dimension passed to cuBLASLt: a one-row matrix's ld is never used, but cuBLASLt
// still wants ld >= the row length; with more rows the caller's ld must cover a row.
int64_t leading_dim(const char* where, const char* name, int64_t ld, int64_t rows, int64_t row_len) {
  if (rows <= 1) return row_len;
  if (ld < row_len)
    fail(where, ": ", name, ": expected a row stride >= ", row_len,
         " elements on CUDA (cuBLASLt needs rows that do not overlap), got ", ld);
  return ld;
}

// A column-major cuBLASLt layout (rows × cols, ld) with an optional strided batch.
void make_layout(Layout& layout, const char* where, DType t, int64_t rows, int64_t cols, int64_t ld,
                 int64_t batch, int64_t batch_stride) {
  check_cublas(cublasLtMatrixLayoutCreate(layout.out(), cuda_data_type(t), static_cast<uint64_t>(rows),
                                          static_cast<uint64_t>(cols), ld),
               where, "cublasLtMatrixLayoutCreate");
  if (batch <= 1) return;
  const int32_t count = static_cast<int32_t>(batch);
  check_cublas(cublasLtMatrixLayoutSetAttribute(layout.get(), CUBLASLT_MATRIX_LAYOUT_BATCH_COUNT,
                                                &count, sizeof(count)),
               where, "cublasLtMatrixLayoutSetAttribute(BATCH_COUNT)");
  check_cublas(cublasLtMatrixLayoutSetAttribute(layout.get(), CUBLASLT_MATRIX_LAYOUT_STRIDED_BATCH_OFFSET,
                                                &batch_stride, sizeof(batch_stride)),
               where, "cublasLtMatrixLayoutSetAttribute(STRIDED_BATCH_OFFSET)");
}

void set_preference(const Preference& pref, const char* where, cublasLtMatmulPreferenceAttributes_t attr,
                    const void* value, size_t bytes) {
  check_cublas(cublasLtMatmulPreferenceSetAttribute(pref.get(), attr, value, bytes), where,
               "cublasLtMatmulPreferenceSetAttribute");
}

}  // namespace

void check_matmul_dtypes(const char* where, const char* x_name, const TensorView& x,
                         const char* w_name, const TensorView& w, const char* y_name,
                         const TensorView& y) {
  const auto reject_fp8 = [where](const char* name, const TensorView& t) {
    if (t.dtype == DType::fp8_e4m3)
      fail(where, ": ", name, ".dtype: fp8_e4m3 is not supported on CUDA yet (FP8 tensor-core GEMMs "
           "are a later step): dequantize block-scaled FP8 tensors once with dequantize_fp8_blocks "
           "into bf16 and pass those");
  };
  reject_fp8(x_name, x);
  reject_fp8(w_name, w);
  if (x.dtype != w.dtype)
    fail(where, ": ", x_name, ".dtype and ", w_name, ".dtype: expected the same dtype on CUDA (bf16 and "
         "bf16, or fp32 and fp32), got ", dtype_name(x.dtype), " and ", dtype_name(w.dtype));
  if (x.dtype == DType::fp32 && y.dtype != DType::fp32)
    fail(where, ": ", y_name, ".dtype: expected fp32 on CUDA when ", x_name, " and ", w_name,
         " are fp32, got ", dtype_name(y.dtype));
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
  const int64_t x_ld = leading_dim(where, p.x_name, p.x.ld, p.T, p.K);
  const int64_t w_ld = leading_dim(where, p.w_name, p.w.ld, p.N, p.K);

  // cuBLASLt is column-major: a row-major T × N matrix y with row stride y_ld is the column-major
  // N × T matrix yᵀ with leading dimension y_ld. So compute yᵀ = w · xᵀ = op(A) · op(B) with
  // A = w stored as the column-major K × N matrix wᵀ (transposed back: op T) and B = x stored
  // as the column-major K × T matrix xᵀ (op N) — the "TN" GEMM every cuBLASLt kernel family has.
  MatmulDesc desc;
  check_cublas(cublasLtMatmulDescCreate(desc.out(), CUBLAS_COMPUTE_32F, CUDA_R_32F), where,
               "cublasLtMatmulDescCreate");
  const cublasOperation_t trans_a = CUBLAS_OP_T, trans_b = CUBLAS_OP_N;
  check_cublas(cublasLtMatmulDescSetAttribute(desc.get(), CUBLASLT_MATMUL_DESC_TRANSA, &trans_a,
                                              sizeof(trans_a)),
               where, "cublasLtMatmulDescSetAttribute(TRANSA)");
  check_cublas(cublasLtMatmulDescSetAttribute(desc.get(), CUBLASLT_MATMUL_DESC_TRANSB, &trans_b,
                                              sizeof(trans_b)),
               where, "cublasLtMatmulDescSetAttribute(TRANSB)");

  Layout a, b, d;
  make_layout(a, where, p.ab_dtype, p.K, p.N, w_ld, p.batch, p.w.batch_stride);
  make_layout(b, where, p.ab_dtype, p.K, p.T, x_ld, p.batch, p.x.batch_stride);
  make_layout(d, where, p.y_dtype, p.N, p.T, y_ld, p.batch, p.y_batch_stride);

  Preference pref;
  check_cublas(cublasLtMatmulPreferenceCreate(pref.out()), where, "cublasLtMatmulPreferenceCreate");
  const uint64_t workspace_bytes = 0;
  set_preference(pref, where, CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES, &workspace_bytes,
                 sizeof(workspace_bytes));
  const uint32_t align_a = alignment_bytes(p.w.data, w_ld * ab, p.w.batch_stride * ab);
  const uint32_t align_b = alignment_bytes(p.x.data, x_ld * ab, p.x.batch_stride * ab);
  const uint32_t align_d = alignment_bytes(p.y, y_ld * yb, p.y_batch_stride * yb);
  set_preference(pref, where, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_A_BYTES, &align_a, sizeof(align_a));
  set_preference(pref, where, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_B_BYTES, &align_b, sizeof(align_b));
  set_preference(pref, where, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_C_BYTES, &align_d, sizeof(align_d));
  set_preference(pref, where, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_D_BYTES, &align_d, sizeof(align_d));

  const cublasLtHandle_t handle = cublaslt_handle();
  cublasLtMatmulHeuristicResult_t best{};
  int found = 0;
  const cublasStatus_t status = cublasLtMatmulAlgoGetHeuristic(
      handle, desc.get(), a.get(), b.get(), d.get(), d.get(), pref.get(), 1, &best, &found);
  if (status != CUBLAS_STATUS_SUCCESS || found < 1)
    fail(where, ": no cuBLASLt algorithm for ", p.y_name, " [", p.T, ", ", p.N, "] = ", p.x_name, " [",
         p.T, ", ", p.K, "] · ", p.w_name, " [", p.N, ", ", p.K, "]ᵀ (batch ", p.batch, ", ",
         dtype_name(p.ab_dtype), " → ", dtype_name(p.y_dtype), ", row strides ", x_ld, " / ", w_ld,
         " / ", y_ld, ", alignments ", align_b, " / ", align_a, " / ", align_d,
         " bytes, no workspace): ",
         status != CUBLAS_STATUS_SUCCESS ? cublasLtGetStatusString(status) : "heuristic returned none");

  // beta = 0: C (= D) is not read, so a poisoned or uninitialized y is fine.
  const float alpha = 1.0f, beta = 0.0f;
  check_cublas(cublasLtMatmul(handle, desc.get(), &alpha, p.w.data, a.get(), p.x.data, b.get(), &beta,
                              p.y, d.get(), p.y, d.get(), &best.algo, nullptr, 0, stream),
               where, "cublasLtMatmul");
}

}  // namespace dsv4::cuda

#include "cuda/gemm/cublaslt_plan.h"

#include <functional>
#include <memory>
#include <unordered_map>

#include "cuda/gemm/cublaslt_handle.h"
#include "dsv4/status.h"

namespace dsv4::cuda {
namespace {

cudaDataType_t cuda_data_type(DType t) {
  switch (t) {
    case DType::bf16: return CUDA_R_16BF;
    case DType::fp8_e4m3: return CUDA_R_8F_E4M3;
    default: return CUDA_R_32F;
  }
}

using Preference = LtDescriptor<cublasLtMatmulPreference_t, cublasLtMatmulPreferenceDestroy>;

template <typename T>
void set_pref(const char* where, const Preference& pref, cublasLtMatmulPreferenceAttributes_t attr,
              const T& value) {
  check_cublas(cublasLtMatmulPreferenceSetAttribute(pref.get(), attr, &value, sizeof(value)), where,
               "cublasLtMatmulPreferenceSetAttribute");
}

template <typename T>
void set_desc(const char* where, cublasLtMatmulDesc_t desc, cublasLtMatmulDescAttributes_t attr,
              const T& value, const char* what) {
  check_cublas(cublasLtMatmulDescSetAttribute(desc, attr, &value, sizeof(value)), where, what);
}

// A column-major cuBLASLt layout (rows × cols, ld) with an optional strided batch.
template <typename Layout>
void make_layout(Layout& layout, const char* where, DType t, int64_t rows, int64_t cols, int64_t ld,
                 int64_t batch, int64_t batch_stride) {
  check_cublas(cublasLtMatrixLayoutCreate(layout.out(), cuda_data_type(t), static_cast<uint64_t>(rows),
                                          static_cast<uint64_t>(cols), ld),
               where, "cublasLtMatrixLayoutCreate");
  if (batch <= 1) return;
  const int32_t count = static_cast<int32_t>(batch);
  check_cublas(cublasLtMatrixLayoutSetAttribute(layout.get(), CUBLASLT_MATRIX_LAYOUT_BATCH_COUNT, &count,
                                                sizeof(count)),
               where, "cublasLtMatrixLayoutSetAttribute(BATCH_COUNT)");
  check_cublas(cublasLtMatrixLayoutSetAttribute(layout.get(), CUBLASLT_MATRIX_LAYOUT_STRIDED_BATCH_OFFSET,
                                                &batch_stride, sizeof(batch_stride)),
               where, "cublasLtMatrixLayoutSetAttribute(STRIDED_BATCH_OFFSET)");
}

}  // namespace

size_t MatmulKeyHash::operator()(const MatmulKey& k) const {
  size_t h = 0;
  const auto mix = [&h](uint64_t v) { h ^= std::hash<uint64_t>{}(v) + 0x9e3779b97f4a7c15ull + (h << 6) + (h >> 2); };
  mix(static_cast<uint64_t>(k.device));
  mix(static_cast<uint64_t>(k.ab) << 8 | static_cast<uint64_t>(k.y));
  for (int64_t v : {k.batch, k.T, k.N, k.K, k.x_ld, k.w_ld, k.y_ld, k.x_batch_stride, k.w_batch_stride,
                    k.y_batch_stride, k.workspace_bytes})
    mix(static_cast<uint64_t>(v));
  mix(static_cast<uint64_t>(k.x_align) | static_cast<uint64_t>(k.w_align) << 16 |
      static_cast<uint64_t>(k.y_align) << 32);
  return h;
}

uint32_t alignment_bytes(const void* data, int64_t ld_bytes, int64_t batch_stride_bytes) {
  const uint64_t bits = static_cast<uint64_t>(reinterpret_cast<uintptr_t>(data)) |
                        static_cast<uint64_t>(ld_bytes) | static_cast<uint64_t>(batch_stride_bytes) |
                        uint64_t{256};
  return static_cast<uint32_t>(bits & (~bits + 1));
}

MatmulPlan::MatmulPlan(const char* where, const MatmulKey& key, const float* x_scale,
                       const float* w_scale, const char* x_name, const char* w_name,
                       const char* y_name)
    : key_(key), handle_(cublaslt_handle()) {
  check_cublas(cublasLtMatmulDescCreate(desc_.out(), CUBLAS_COMPUTE_32F, CUDA_R_32F), where,
               "cublasLtMatmulDescCreate");
  set_desc(where, desc_.get(), CUBLASLT_MATMUL_DESC_TRANSA, CUBLAS_OP_T, "cublasLtMatmulDescSetAttribute(TRANSA)");
  set_desc(where, desc_.get(), CUBLASLT_MATMUL_DESC_TRANSB, CUBLAS_OP_N, "cublasLtMatmulDescSetAttribute(TRANSB)");
  const bool fp8 = key.ab == DType::fp8_e4m3;
  if (fp8) {
    const int32_t a_mode = CUBLASLT_MATMUL_MATRIX_SCALE_BLK128x128_32F;
    const int32_t b_mode = CUBLASLT_MATMUL_MATRIX_SCALE_VEC128_32F;
    set_desc(where, desc_.get(), CUBLASLT_MATMUL_DESC_A_SCALE_MODE, a_mode, "cublasLtMatmulDescSetAttribute(A_SCALE_MODE)");
    set_desc(where, desc_.get(), CUBLASLT_MATMUL_DESC_B_SCALE_MODE, b_mode, "cublasLtMatmulDescSetAttribute(B_SCALE_MODE)");
    // The heuristic wants the scale pointers present; run() sets each call's own.
    set_desc(where, desc_.get(), CUBLASLT_MATMUL_DESC_A_SCALE_POINTER, w_scale, "cublasLtMatmulDescSetAttribute(A_SCALE_POINTER)");
    set_desc(where, desc_.get(), CUBLASLT_MATMUL_DESC_B_SCALE_POINTER, x_scale, "cublasLtMatmulDescSetAttribute(B_SCALE_POINTER)");
  }
  make_layout(a_, where, key.ab, key.K, key.N, key.w_ld, key.batch, key.w_batch_stride);
  make_layout(b_, where, key.ab, key.K, key.T, key.x_ld, key.batch, key.x_batch_stride);
  make_layout(d_, where, key.y, key.N, key.T, key.y_ld, key.batch, key.y_batch_stride);

  Preference pref;
  check_cublas(cublasLtMatmulPreferenceCreate(pref.out()), where, "cublasLtMatmulPreferenceCreate");
  set_pref(where, pref, CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES, static_cast<uint64_t>(key.workspace_bytes));
  // No reduction through atomics (CUBLASLT_REDUCTION_SCHEME_INPLACE): its order varies run to run.
  set_pref(where, pref, CUBLASLT_MATMUL_PREF_REDUCTION_SCHEME_MASK,
           static_cast<uint32_t>(CUBLASLT_REDUCTION_SCHEME_NONE | CUBLASLT_REDUCTION_SCHEME_COMPUTE_TYPE |
                                 CUBLASLT_REDUCTION_SCHEME_OUTPUT_TYPE));
  set_pref(where, pref, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_A_BYTES, key.w_align);
  set_pref(where, pref, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_B_BYTES, key.x_align);
  set_pref(where, pref, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_C_BYTES, key.y_align);
  set_pref(where, pref, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_D_BYTES, key.y_align);

  cublasLtMatmulHeuristicResult_t best{};
  int found = 0;
  const cublasStatus_t status = cublasLtMatmulAlgoGetHeuristic(
      handle_, desc_.get(), a_.get(), b_.get(), d_.get(), d_.get(), pref.get(), 1, &best, &found);
  if (status != CUBLAS_STATUS_SUCCESS || found < 1)
    fail(where, ": no cuBLASLt algorithm for ", y_name, " [", key.T, ", ", key.N, "] = ", x_name, " [",
         key.T, ", ", key.K, "] · ", w_name, " [", key.N, ", ", key.K, "]ᵀ (batch ", key.batch, ", ",
         dtype_name(key.ab), fp8 ? " with 1x128 / 128x128 fp32 block scales" : "", " → ", dtype_name(key.y),
         ", row strides ", key.x_ld, " / ", key.w_ld, " / ", key.y_ld, ", alignments ", key.x_align, " / ",
         key.w_align, " / ", key.y_align, " bytes, workspace ", key.workspace_bytes, " bytes",
         fp8 ? "; FP8 block scaling needs an sm90 GPU and K, row strides and pointers multiples of 16 bytes" : "",
         "): ", status != CUBLAS_STATUS_SUCCESS ? cublasLtGetStatusString(status) : "heuristic returned none");
  algo_ = best.algo;
}

void MatmulPlan::run(const char* where, const void* x, const float* x_scale, const void* w,
                     const float* w_scale, void* y, void* workspace, cudaStream_t stream) {
  if (key_.ab == DType::fp8_e4m3) {
    set_desc(where, desc_.get(), CUBLASLT_MATMUL_DESC_A_SCALE_POINTER, w_scale, "cublasLtMatmulDescSetAttribute(A_SCALE_POINTER)");
    set_desc(where, desc_.get(), CUBLASLT_MATMUL_DESC_B_SCALE_POINTER, x_scale, "cublasLtMatmulDescSetAttribute(B_SCALE_POINTER)");
  }
  // beta = 0: C (= D) is not read, so a poisoned or uninitialized y is fine.
  const float alpha = 1.0f, beta = 0.0f;
  check_cublas(cublasLtMatmul(handle_, desc_.get(), &alpha, w, a_.get(), x, b_.get(), &beta, y, d_.get(), y,
                              d_.get(), &algo_, workspace, static_cast<size_t>(key_.workspace_bytes), stream),
               where, "cublasLtMatmul");
}

MatmulPlan& cached_matmul_plan(const char* where, const MatmulKey& key, const float* x_scale,
                               const float* w_scale, const char* x_name, const char* w_name,
                               const char* y_name) {
  thread_local std::unordered_map<MatmulKey, std::unique_ptr<MatmulPlan>, MatmulKeyHash> plans;
  const auto it = plans.find(key);
  if (it != plans.end()) return *it->second;
  auto plan = std::make_unique<MatmulPlan>(where, key, x_scale, w_scale, x_name, w_name, y_name);
  if (plans.size() >= kMaxCachedPlans) plans.clear();
  return *plans.emplace(key, std::move(plan)).first->second;
}

}  // namespace dsv4::cuda

// CUDA implementation of src/runtime/ceiling_gemm.h: the plain cuBLASLt matmul (no block scales,
// unlike cuda/gemm/cublaslt_matmul.h, whose FP8 path is the layer's block-scaled GEMM).
#include "runtime/ceiling_gemm.h"

#include <cublasLt.h>

#include <cstdint>
#include <string>
#include <utility>

#include "cuda/gemm/cublaslt_handle.h"
#include "cuda/gemm/cublaslt_plan.h"
#include "dsv4/status.h"

namespace dsv4::rt {

struct CeilingGemm::Plan {
  using Desc = cuda::LtDescriptor<cublasLtMatmulDesc_t, cublasLtMatmulDescDestroy>;
  using Layout = cuda::LtDescriptor<cublasLtMatrixLayout_t, cublasLtMatrixLayoutDestroy>;
  using Preference =
      cuda::LtDescriptor<cublasLtMatmulPreference_t, cublasLtMatmulPreferenceDestroy>;

  std::string where;
  cublasLtHandle_t handle = nullptr;
  Desc desc;
  Layout a_layout, b_layout, d_layout;
  cublasLtMatmulAlgo_t algo{};
  const void* a = nullptr;
  const void* b = nullptr;
  void* d = nullptr;
  void* workspace = nullptr;
  uint64_t workspace_bytes = 0;
};

CeilingGemm::CeilingGemm(const char* where, const TensorView& a, const TensorView& b,
                         const TensorView& d, const TensorView& workspace)
    : plan_(std::make_unique<Plan>()) {
  check_defined(where, "a", a);
  check_ndim(where, "a", a, 2);
  const int64_t n = a.size(0);
  for (const auto& [name, t] : {std::pair<const char*, const TensorView&>{"a", a},
                                std::pair<const char*, const TensorView&>{"b", b},
                                std::pair<const char*, const TensorView&>{"d", d}}) {
    check_defined(where, name, t);
    check_shape(where, name, t, {n, n});
    check_contiguous(where, name, t);
    check_device(where, name, t, Device::cuda);
  }
  if (a.dtype != DType::bf16 && a.dtype != DType::fp8_e4m3)
    fail_expected(where, "a.dtype", "bf16 or fp8_e4m3", dtype_name(a.dtype));
  check_dtype(where, "b", b, a.dtype);
  check_dtype(where, "d", d, DType::bf16);
  check_defined(where, "workspace", workspace);
  check_dtype(where, "workspace", workspace, DType::uint8);
  check_ndim(where, "workspace", workspace, 1);
  check_contiguous(where, "workspace", workspace);
  check_device(where, "workspace", workspace, Device::cuda);

  Plan& p = *plan_;
  p.where = where;
  p.a = a.data;
  p.b = b.data;
  p.d = d.data;
  p.workspace = workspace.data;
  p.workspace_bytes = static_cast<uint64_t>(workspace.numel());
  const cudaDataType_t ab = a.dtype == DType::fp8_e4m3 ? CUDA_R_8F_E4M3 : CUDA_R_16BF;
  using cuda::check_cublas;
  check_cublas(cublasLtMatmulDescCreate(p.desc.out(), CUBLAS_COMPUTE_32F, CUDA_R_32F), where,
               "cublasLtMatmulDescCreate");
  const cublasOperation_t transa = CUBLAS_OP_T, transb = CUBLAS_OP_N;
  check_cublas(cublasLtMatmulDescSetAttribute(p.desc.get(), CUBLASLT_MATMUL_DESC_TRANSA, &transa,
                                              sizeof transa),
               where, "TRANSA");
  check_cublas(cublasLtMatmulDescSetAttribute(p.desc.get(), CUBLASLT_MATMUL_DESC_TRANSB, &transb,
                                              sizeof transb),
               where, "TRANSB");
  const uint64_t rows = static_cast<uint64_t>(n);
  check_cublas(cublasLtMatrixLayoutCreate(p.a_layout.out(), ab, rows, rows, n), where, "layout a");
  check_cublas(cublasLtMatrixLayoutCreate(p.b_layout.out(), ab, rows, rows, n), where, "layout b");
  check_cublas(cublasLtMatrixLayoutCreate(p.d_layout.out(), CUDA_R_16BF, rows, rows, n), where,
               "layout d");
  Plan::Preference pref;
  check_cublas(cublasLtMatmulPreferenceCreate(pref.out()), where, "cublasLtMatmulPreferenceCreate");
  check_cublas(cublasLtMatmulPreferenceSetAttribute(pref.get(),
                                                    CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES,
                                                    &p.workspace_bytes, sizeof p.workspace_bytes),
               where, "workspace preference");
  p.handle = cuda::cublaslt_handle();
  cublasLtMatmulHeuristicResult_t best{};
  int found = 0;
  const cublasStatus_t status =
      cublasLtMatmulAlgoGetHeuristic(p.handle, p.desc.get(), p.a_layout.get(), p.b_layout.get(),
                                     p.d_layout.get(), p.d_layout.get(), pref.get(), 1, &best, &found);
  if (status != CUBLAS_STATUS_SUCCESS || found < 1)
    fail(where, ": cuBLASLt has no ", dtype_name(a.dtype), " GEMM of ", n, "^3");
  p.algo = best.algo;
}

CeilingGemm::~CeilingGemm() = default;

void CeilingGemm::run(Stream stream) const {
  const Plan& p = *plan_;
  const float alpha = 1.0f, beta = 0.0f;
  cuda::check_cublas(cublasLtMatmul(p.handle, p.desc.get(), &alpha, p.a, p.a_layout.get(), p.b,
                                    p.b_layout.get(), &beta, p.d, p.d_layout.get(), p.d,
                                    p.d_layout.get(), &p.algo, p.workspace, p.workspace_bytes,
                                    stream),
                     p.where.c_str(), "cublasLtMatmul");
}

}  // namespace dsv4::rt

#include "cuda/gemm/cublaslt_handle.h"

#include <mutex>
#include <unordered_map>

#include "cuda/common/check.h"
#include "dsv4/status.h"

namespace dsv4::cuda {

void check_cublas(cublasStatus_t status, const char* where, const char* what) {
  if (status != CUBLAS_STATUS_SUCCESS)
    fail(where, ": ", what, ": ", cublasLtGetStatusString(status), " (cuBLAS status ",
         static_cast<int>(status), ")");
}

cublasLtHandle_t cublaslt_handle() {
  constexpr const char* kWhere = "cublaslt_handle";
  int device = 0;
  DSV4_CUDA_CHECK(kWhere, cudaGetDevice(&device));
  static std::mutex mutex;
  static std::unordered_map<int, cublasLtHandle_t> handles;  // never destroyed (see header)
  const std::lock_guard<std::mutex> lock(mutex);
  const auto it = handles.find(device);
  if (it != handles.end()) return it->second;
  cublasLtHandle_t handle = nullptr;
  check_cublas(cublasLtCreate(&handle), kWhere, "cublasLtCreate");
  handles.emplace(device, handle);
  return handle;
}

}  // namespace dsv4::cuda

#include "cuda/common/tma.h"

#include <cuda_runtime.h>
#include <cudaTypedefs.h>

#include "cuda/common/check.h"
#include "dsv4/status.h"

namespace dsv4::cuda {
namespace {

PFN_cuTensorMapEncodeTiled_v12000 encode_fn(const char* where) {
  static PFN_cuTensorMapEncodeTiled_v12000 fn = [where] {
    void* ptr = nullptr;
    cudaDriverEntryPointQueryResult status{};
    check_cuda(cudaGetDriverEntryPointByVersion("cuTensorMapEncodeTiled", &ptr, 12000, cudaEnableDefault, &status),
               where, "cudaGetDriverEntryPointByVersion(cuTensorMapEncodeTiled)");
    DSV4_CHECK(ptr != nullptr && status == cudaDriverEntryPointSuccess, where,
               ": the CUDA driver does not provide cuTensorMapEncodeTiled");
    return reinterpret_cast<PFN_cuTensorMapEncodeTiled_v12000>(ptr);
  }();
  return fn;
}

CUtensorMap make_tensor_map_sw128(const char* where, CUtensorMapDataType type, const void* base, int rank,
                                  const uint64_t* dims, const uint64_t* strides_bytes, const uint32_t* box) {
  DSV4_CHECK(rank >= 1 && rank <= 5, where, ": tensor map rank: expected 1..5, got ", rank);
  CUtensorMap map{};
  cuuint32_t elem_strides[5] = {1, 1, 1, 1, 1};
  const CUresult res = encode_fn(where)(
      &map, type, static_cast<cuuint32_t>(rank), const_cast<void*>(base), dims, strides_bytes, box, elem_strides,
      CU_TENSOR_MAP_INTERLEAVE_NONE, CU_TENSOR_MAP_SWIZZLE_128B, CU_TENSOR_MAP_L2_PROMOTION_L2_256B,
      CU_TENSOR_MAP_FLOAT_OOB_FILL_NONE);
  DSV4_CHECK(res == CUDA_SUCCESS, where, ": cuTensorMapEncodeTiled failed (CUresult ", static_cast<int>(res), ")");
  return map;
}

}  // namespace

CUtensorMap make_tensor_map_bf16_sw128(const char* where, const void* base, int rank, const uint64_t* dims,
                                       const uint64_t* strides_bytes, const uint32_t* box) {
  return make_tensor_map_sw128(where, CU_TENSOR_MAP_DATA_TYPE_BFLOAT16, base, rank, dims, strides_bytes, box);
}

CUtensorMap make_tensor_map_u8_sw128(const char* where, const void* base, int rank, const uint64_t* dims,
                                     const uint64_t* strides_bytes, const uint32_t* box) {
  return make_tensor_map_sw128(where, CU_TENSOR_MAP_DATA_TYPE_UINT8, base, rank, dims, strides_bytes, box);
}

}  // namespace dsv4::cuda

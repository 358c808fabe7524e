// Host-side CUDA error checks shared by every CUDA op.
//
// Errors become dsv4::Error (the project's one exception type) naming the op and the failing call,
// so a bad launch surfaces at the API call that caused it instead of at a later synchronize.
#pragma once

#include <cuda_runtime.h>

#include "dsv4/status.h"

namespace dsv4::cuda {

// Throws dsv4::Error("<where>: <what>: <cuda error string>") when `err` is not cudaSuccess.
inline void check_cuda(cudaError_t err, const char* where, const char* what) {
  if (err != cudaSuccess) {
    fail(where, ": ", what, ": ", cudaGetErrorName(err), " (", cudaGetErrorString(err), ")");
  }
}

}  // namespace dsv4::cuda

// DSV4_CUDA_CHECK(where, call): evaluates a CUDA runtime call and throws on failure.
#define DSV4_CUDA_CHECK(where, call) ::dsv4::cuda::check_cuda((call), (where), #call)

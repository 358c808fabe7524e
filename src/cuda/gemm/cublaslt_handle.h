// The cuBLASLt handle of the current CUDA device, shared by every dense projection.
//
// Created on first use per device (cublasLtCreate costs a few host allocations, so not per call)
// under a mutex, then handed out to any thread: cuBLASLt handles may be used concurrently from
// several host threads because every cublasLtMatmul call takes its own descriptors, workspace and
// stream. Handles live until process exit and are never destroyed: destroying them from a static
// destructor could run after the CUDA runtime has shut down.
//
// "Current device" is cudaGetDevice(): like every kernel launch of the library, the caller makes
// the device that holds the tensors current before calling an op.
#pragma once

#include <cublasLt.h>

namespace dsv4::cuda {

cublasLtHandle_t cublaslt_handle();

// Throws dsv4::Error("<where>: <what>: <status name>") unless status is CUBLAS_STATUS_SUCCESS.
void check_cublas(cublasStatus_t status, const char* where, const char* what);

}  // namespace dsv4::cuda

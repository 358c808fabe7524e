// y = x · wᵀ for row-major operands through one cuBLASLt matmul (optionally a strided batch):
// the GEMM behind the CUDA linear and grouped_wo_a.
//
// Operand types (what cuBLASLt multiplies without a conversion pass): x and w both bf16 (y bf16
// or fp32) or both fp32 (y fp32). Compute type CUBLAS_COMPUTE_32F in both cases — bf16 products
// are exact in fp32 and accumulated in fp32 on the tensor cores; fp32 operands use full fp32
// FMAs, never TF32, so they round like the CPU reference (up to the order of the additions).
// FP8 operands are rejected (check_matmul_dtypes): FP8 tensor-core GEMMs with block scales are a
// later step; until then block-scaled weights are dequantized once with dequantize_fp8_blocks.
//
// Each call builds its descriptors, asks the heuristic for its best algorithm and launches it on
// the caller's stream: host work only, no device allocation, no synchronization (capturable in a
// CUDA graph). Workspace is zero: algorithms that need one (split-K reductions through a
// workspace, stream-K fix-ups) are never chosen, which also keeps the result independent of any
// scratch state. The heuristic is told the real alignment of every pointer, leading dimension
// and batch stride (the default would assume 256 bytes), so column windows and padded rows are
// safe. Same problem, same alignments, same GPU and toolkit → same algorithm → same bits.
#pragma once

#include <cstdint>

#include "dsv4/ops.h"

namespace dsv4::cuda {

// A row-major matrix in device memory: element (r, c) of batch b at
// data + b * batch_stride + r * ld + c (elements).
struct MatmulOperand {
  const void* data = nullptr;
  int64_t ld = 0;
  int64_t batch_stride = 0;
};

struct MatmulXwT {
  DType ab_dtype = DType::bf16;  // x and w: bf16 or fp32
  DType y_dtype = DType::bf16;   // bf16 or fp32 (fp32 when ab_dtype is fp32)
  int64_t batch = 1;
  int64_t T = 0, N = 0, K = 0;
  MatmulOperand x;  // [batch ×] T × K
  MatmulOperand w;  // [batch ×] N × K
  void* y = nullptr;  // [batch ×] T × N, rows y_ld apart, batches y_batch_stride apart
  int64_t y_ld = 0;
  int64_t y_batch_stride = 0;
  const char* x_name = "x";  // argument names for error messages
  const char* w_name = "w";
  const char* y_name = "y";
};

// The dtype rules above for x, w and y of a CUDA GEMM op; throws dsv4::Error naming the op and
// the argument (an FP8 operand's message points to dequantize_fp8_blocks).
void check_matmul_dtypes(const char* where, const char* x_name, const TensorView& x,
                         const char* w_name, const TensorView& w, const char* y_name,
                         const TensorView& y);

// Enqueues y = x · wᵀ for every batch on `stream`. T, N or batch 0 → nothing; K = 0 → y = 0.
// Leading dimensions must cover a row (ld >= K for x and w, y_ld >= N) wherever a matrix has more
// than one row (else dsv4::Error naming `where`); a one-row matrix's ld is not used.
void matmul_xwT(const char* where, const MatmulXwT& p, Stream stream);

}  // namespace dsv4::cuda

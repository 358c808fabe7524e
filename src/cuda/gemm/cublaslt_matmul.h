// y = x · wᵀ for row-major operands through one cuBLASLt matmul (optionally a strided batch):
// the GEMM behind the CUDA linear and grouped_wo_a.
//
// Operand types (what cuBLASLt multiplies without a conversion pass), compute type
// CUBLAS_COMPUTE_32F (fp32 accumulation) in every case:
//   x, w bf16 → y bf16 or fp32: bf16 products are exact in fp32;
//   x, w fp32 → y fp32: full fp32 FMAs, never TF32, so they round like the CPU reference (up to
//     the order of the additions);
//   x, w fp8_e4m3 → y bf16 or fp32, with DeepSeek's block scales: x one fp32 scale per row and
//     128 columns (CUBLASLT_MATMUL_MATRIX_SCALE_VEC128_32F), w one per 128 × 128 block
//     (CUBLASLT_MATMUL_MATRIX_SCALE_BLK128x128_32F), applied to the fp32 partial sum of each
//     128-deep slice of K. sm90 (Hopper) only, cuBLAS >= 12.9; batch 1.
//
// Plans: the descriptors and the algorithm of a problem (shape, dtypes, row / batch strides, the
// alignment of every pointer, workspace size) are built and chosen by cuBLASLt's heuristic once
// per host thread and cached (cublaslt_plan.h); a repeated call only sets the scale pointers and
// enqueues on the caller's stream: no heuristic query, no device allocation, no synchronization
// (capturable in a CUDA graph). The heuristic is told the real alignment of every pointer,
// leading dimension and batch stride (the default would assume 256 bytes), so column windows and
// padded rows are safe. Workspace: none unless the caller hands one over (MatmulXwT::workspace);
// with one, cuBLASLt may pick split-K / stream-K algorithms (what decode-sized problems need to
// fill the GPU), never one that reduces with atomics, so results stay deterministic. Same
// problem, alignments, workspace size, GPU and toolkit → same algorithm → same bits.
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
  DType ab_dtype = DType::bf16;  // x and w: bf16, fp32 or fp8_e4m3
  DType y_dtype = DType::bf16;   // bf16 or fp32 (fp32 when ab_dtype is fp32)
  int64_t batch = 1;             // 1 for fp8_e4m3
  int64_t T = 0, N = 0, K = 0;
  MatmulOperand x;  // [batch ×] T × K
  MatmulOperand w;  // [batch ×] N × K
  // fp8_e4m3 only, both required: fp32 block scales in device memory, 16-byte aligned, in
  // cuBLASLt's layouts (which have no leading dimension of their own):
  //   x_scale: the scale of x[t][128·kb .. 128·kb + 127] at x_scale[kb · T + t];
  //   w_scale: the scale of the 128 × 128 block (nb, kb) of w at
  //            w_scale[nb · fp8_weight_scale_row_stride(K) + kb].
  const float* x_scale = nullptr;
  const float* w_scale = nullptr;
  void* y = nullptr;  // [batch ×] T × N, rows y_ld apart, batches y_batch_stride apart
  int64_t y_ld = 0;
  int64_t y_batch_stride = 0;
  void* workspace = nullptr;  // optional, device memory (256-byte aligned), workspace_bytes long
  int64_t workspace_bytes = 0;
  const char* x_name = "x";  // argument names for error messages
  const char* w_name = "w";
  const char* y_name = "y";
};

// The CUDA dtype rules for x, w and y of a GEMM op (above); throws dsv4::Error naming the op and
// the argument. For fp8_e4m3 operands, also the scale rules of linear / grouped_wo_a on CUDA: fp32
// scales (a ue8m0 one names the conversion to do once, at load), 1 × 128 activation blocks.
void check_matmul_dtypes(const char* where, const char* x_name, const TensorView& x,
                         const char* x_scale_name, const TensorView& x_scale, const char* w_name,
                         const TensorView& w, const char* w_scale_name, const TensorView& w_scale,
                         const char* y_name, const TensorView& y);

// The FP8 block scales of an op's arguments must already be in the layouts of MatmulXwT (cuBLASLt
// reads them without a leading dimension of its own); each throws dsv4::Error naming the argument
// and the layout expected:
//   activations, a [T, K/128] view: element (t, kb) at kb · T + t, i.e. strides {1, T} — the
//     transpose of a contiguous [K/128, T] buffer (quantize_act_fp8 writes any strides);
//   weights, one matrix's [ceil(N/128), ceil(K/128)] grid: element (nb, kb) at
//     nb · fp8_weight_scale_row_stride(K) + kb (rows padded to a multiple of 4 scales).
void check_act_scale_layout(const char* where, const char* name, const TensorView& scale);
void check_weight_scale_layout(const char* where, const char* name, int64_t rows, int64_t cols,
                               int64_t row_stride, int64_t col_stride, int64_t K);

// A workspace argument of linear / grouped_wo_a on CUDA: undefined (none) or 1-d uint8 on the
// device, 256-byte aligned. Returns its size in bytes (0 for none).
int64_t check_matmul_workspace(const char* where, const TensorView& workspace);

// The rules matmul_xwT enforces on a problem, alone: rows that do not overlap (ld >= the row
// length wherever a matrix has more than one row); for FP8 also T a multiple of
// kFp8GemmRowMultiple and 16-byte aligned scales. The callers that run a problem on the skinny
// kernel instead check them too, so a problem is accepted or refused the same whichever kernel
// runs it. Throws dsv4::Error.
void check_matmul(const char* where, const MatmulXwT& p);

// Enqueues y = x · wᵀ for every batch on `stream`. T, N or batch 0 → nothing; K = 0 → y = 0.
// Leading dimensions must cover a row (ld >= K for x and w, y_ld >= N) wherever a matrix has more
// than one row (else dsv4::Error naming `where`); a one-row matrix's ld is not used.
void matmul_xwT(const char* where, const MatmulXwT& p, Stream stream);

}  // namespace dsv4::cuda

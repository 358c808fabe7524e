// The GEMM for decode-sized problems (sm_90a): y[b] = x[b] · w[b]ᵀ for a few dozen to a few
// hundred rows of x (tokens), optionally batched (grouped_wo_a's G groups in one launch), on
//   fp8 e4m3 operands with DeepSeek's block scales (x one fp32 per row and 128 columns, w one per
//     128 × 128 block): the layer's projections;
//   bf16 operands: the compressors' projections (fp32 out).
//
// Why not cuBLASLt there: its kernels tile the output 128 × 128 (or pick small tiles that still
// walk all of K), so a decode GEMM (a few rows, N of 256 … 8192) has a few dozen CTAs, each
// reading its weight rows over the whole of K alone — measured on the H200 at 10-22 µs per V4
// projection whatever T is, where reading the weight once takes 1-4 µs. This kernel tiles N by
// 64 and splits K over more CTAs (partial sums in the caller's workspace, added in split order
// by a second kernel, so results are deterministic), which spreads the weight read over the GPU.
// One CTA covers up to 128 tokens (token tiles of 16, 32, 64 or 128), so up to 128 tokens read
// each weight tile once.
//
// Numerics: fp8 — every 128-deep slice of K is one fp32 wgmma accumulation (4 steps of 32)
// started from zero, then scaled by w_scale · x_scale and added to an fp32 total, slice by slice,
// as cuBLASLt and the CPU reference do; bf16 — exact products summed in fp32 by the tensor cores.
// The order of the additions differs from both (the CPU/CUDA GEMM tolerances cover it). For a
// given number of K splits, a result does not depend on the token tile or on T's other tokens.
#pragma once

#include <cstdint>

#include "dsv4/ops.h"
#include "runtime/gemm_path.h"

namespace dsv4::cuda {

// The most rows of x (tokens) the automatic path (linear, grouped_wo_a) runs on this kernel; the
// one place the limit lives (skinny_gemm_preferred). Measured on the H200 (V4-Flash layer, graph
// replay): at 1-4 tokens it runs wo_a in 17 µs against 56 µs for cuBLASLt's eight fanned-out
// groups, and wq_a / wkv / wo_b in 12-20 µs against 16-33 µs; at 128 tokens the kernel of then
// (32-token tiles, each K block's product waited on before its scaling) lost (wo_a 48 µs against
// 30, wo_b 46 against 26). With the pipelined scaling and 64-token tiles it wins at 64 tokens
// on wq_a / wkv / grouped wo_a and loses on wq_b / wo_b, and at 128 tokens it wins only on the
// grouped wo_a against cuBLASLt's groups one after another (bench/RESULTS.md, 2026-11-27); the
// layer fans those groups out over streams, against which it was not yet timed, so the limit
// stays.
inline constexpr int64_t kSkinnyMaxTokens = 32;

struct SkinnyGemm {
  DType ab_dtype = DType::fp8_e4m3;  // x and w: fp8_e4m3 (block-scaled) or bf16
  int64_t batch = 1, T = 0, N = 0, K = 0;
  // x: [batch ×] T × K, rows x_ld elements apart, batches x_batch_stride elements apart.
  const void* x = nullptr;
  int64_t x_ld = 0, x_batch_stride = 0;
  // fp8 only: the scale of x[b][t][128·kb …] at x_scale[b · x_scale_batch_stride + kb · T + t].
  const float* x_scale = nullptr;
  int64_t x_scale_batch_stride = 0;
  // w: [batch ×] N × K, rows w_ld elements apart.
  const void* w = nullptr;
  int64_t w_ld = 0, w_batch_stride = 0;
  // fp8 only: block (nb, kb) at w_scale[b · w_scale_batch_stride + nb · w_scale_ld + kb].
  const float* w_scale = nullptr;
  int64_t w_scale_ld = 0, w_scale_batch_stride = 0;
  // y: bf16 or fp32 [batch ×] T × N, rows y_ld elements apart, batches y_batch_stride elements.
  void* y = nullptr;
  DType y_dtype = DType::bf16;
  int64_t y_ld = 0, y_batch_stride = 0;
  // Optional device workspace (256-byte aligned) for the split-K partial sums; without enough of
  // it K is not split.
  void* workspace = nullptr;
  int64_t workspace_bytes = 0;
  // For benchmarks and tests (0: the kernel's own choice). token_tile: the tokens per CTA, 16, 32,
  // 64 or 128 (more tokens take several tiles, each reading the weights again). splits: the number
  // of K splits asked for; fewer run where K has fewer blocks or the workspace holds fewer partial
  // sums (none without a workspace).
  int token_tile = 0;
  int64_t splits = 0;
};

// Whether the kernel can run the problem: fp8 or bf16 operands, T ≥ 1, N a multiple of 64, K a
// positive multiple of one 128-byte row (128 fp8 or 64 bf16 values), x and w rows and batches
// 16-byte aligned (TMA), batch ≤ 65535, token_tile 0 / 16 / 32 / 64 / 128, splits ≥ 0.
bool skinny_gemm_fits(const SkinnyGemm& g);

// Whether the automatic path runs the problem here: it fits, T ≤ kSkinnyMaxTokens, and cuBLASLt
// would have fewer output tiles (batch · ⌈N/128⌉) than the GPU has SMs.
bool skinny_gemm_preferred(const SkinnyGemm& g);

// The choice of a linear / grouped_wo_a call named `op`: automatic → skinny_gemm_preferred;
// skinny → true, or dsv4::Error naming `op` and the problem when the kernel does not fit it;
// cublaslt → false.
bool runs_on_skinny_gemm(const char* op, rt::GemmPath path, const SkinnyGemm& g);

// Enqueues the GEMM on `stream` (a problem skinny_gemm_fits accepts): no allocation, no
// synchronization, capturable in a CUDA graph.
void skinny_gemm(const SkinnyGemm& g, Stream stream);

}  // namespace dsv4::cuda

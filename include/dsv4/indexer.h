// Which compressed entries a query sees (docs/spec.md §5): the C4A lightning indexer (query preparation,
// scores, top-k, as separate ops so GPU scoring can be judged by top-k recall against the
// scores of this reference) and the C128A plan (every emitted entry, in order).
//
// Indexer, per token t at position p of request q:
//   q_I = qr · wq_bᵀ → [H_I, 128]; RoPE (the layer's YaRN rope) on the last rope_dims of each
//   head at position p; Hadamard rotation (Sylvester order, scale 128^-0.5); FP8 e4m3 with one
//   power-of-two scale per (token, head) row — the same quantizer as the key side
//   (fp8_block.h), so both operands of the score are fp8 · 2^k.
//   w = (x · weights_projᵀ) · 128^-0.5 · H_I^-0.5   (fp32, [H_I]).
//   score_j = Σ_h w_h · ReLU(q̂_h · k̂_j) over the request's indexer keys k̂_j (dequantized), for
//   j < (p+1) div r; entries j >= (p+1) div r get −inf.
//   top-min(index_topk, (p+1) div r) by score, ties → lowest j first; unused slots −1. Written
//   descending by score or ascending by j (TopkOrder): the same set.
// The rotation is orthonormal, so it leaves q·k unchanged and only spreads values before FP8.
// All indices here are request-local entry numbers.
#pragma once

#include <cstdint>

#include "dsv4/config.h"
#include "dsv4/indexer_key_cache.h"
#include "dsv4/ops.h"
#include "dsv4/tensor.h"

namespace dsv4 {

// Devices: every tensor of a call on the CPU (reference) or every one on CUDA (kernels on
// `stream`); mixed devices are an error. Index values (positions, token_to_req, block table
// entries) are range-checked on the CPU only; the CUDA kernels never read or write out of bounds
// and mark what an out-of-range value makes unusable, as each op below states.

// Queries of the indexer.
//   qr [T, q_lora] (the normed low-rank query): bf16/fp32, or fp8_e4m3 with qr_scale [T, q_lora/128]
//   (its FP8 quantization for an FP8 wq_b, as production feeds it; see dsv4::linear); wq_b
//   [H_I·128, q_lora] bf16/fp32, or fp8_e4m3 with wq_b_scale (per 128×128 block, see
//   dsv4::linear); x [T, dim] bf16/fp32; weights_proj [H_I, dim] bf16/fp32; positions [T]
//   int32/int64; cos_sin fp32 [max_pos, R].
//   Outputs: q_fp8 [T, H_I, 128] fp8_e4m3, q_scale [T, H_I] fp32 (powers of two),
//   weights [T, H_I] fp32 (already scaled by 128^-0.5 · H_I^-0.5).
//   workspace: 1-d uint8 [>= indexer_query_workspace_bytes(T, H_I)], 16-byte aligned, on the device
//   of qr: the fp32 projection qr·wq_bᵀ lives there on CUDA. Ignored (may be undefined) on CPU.
// CUDA: qr·wq_bᵀ follows dsv4::linear's CUDA rules (qr and wq_b both bf16, both fp32, or both
// fp8_e4m3 with fp32 scales in cuBLASLt's layouts); weights_proj must have the dtype of x; a
// position outside [0, max_pos) gives that token's rows codes 0 and q_scale NaN (its scores
// become NaN).
void indexer_query(const TensorView& qr, const TensorView& qr_scale, const TensorView& wq_b,
                   const TensorView& wq_b_scale, const TensorView& x,
                   const TensorView& weights_proj, const TensorView& positions,
                   const TensorView& cos_sin, const TensorView& q_fp8, const TensorView& q_scale,
                   const TensorView& weights, const TensorView& workspace,
                   Stream stream = nullptr);
// Bytes of indexer_query's workspace: T · index_heads · head_dim fp32 values.
int64_t indexer_query_workspace_bytes(int64_t T, int index_heads, int head_dim = 128);

// Scores of every visible entry.
//   q_fp8 [T, H_I, 128] fp8_e4m3, q_scale [T, H_I] fp32, weights [T, H_I] fp32 (indexer_query);
//   positions [T] int32/int64; token_to_req [T] int32; keys + key_block_table int32 [R, max_blocks]
//   (entry j of request q at key_block_table[q][j / B]·B + j % B); ratio (4).
//   scores [T, N] fp32: column j < (p+1) div r gets score_j, the others −inf. N must be >=
//   (p+1) div r for every token, and every visible entry's slot must be mapped.
//   Accumulation, CPU: fp32 over the 128 products (each exact) in the fixed order of
//   indexer_math::dot128, scales applied after, fp32 over heads h = 0..H_I−1 (deterministic).
//   CUDA: FP8 tensor cores (wgmma e4m3·e4m3 → fp32, sm_90a): each head's 128 products are summed
//   by the MMA, which on Hopper aligns the products of each 32-deep step (and the running sum) to
//   the largest of them keeping ~13 fraction bits, truncating; then
//   score = k_scale · Σ_h (w_h · q_scale_h) · ReLU(dot_h) in fp32 (ReLU commutes with the positive
//   power-of-two scales). Tolerance against the exact formula, per score:
//     |Δ| <= 2^-5 · M_j,  M_j = Σ_h |w_h| · q_scale_h · k_scale_j · Σ_d |q̂_h,d · k̂_j,d|
//   (4 steps × 33 aligned terms × 2^-13 < 2^-5.9 per head, rounded up; ReLU is 1-Lipschitz, so
//   a dot that changes sign near 0 moves the score by no more than the dot's error). Typical
//   errors are far smaller: a bit-level model of that accumulator on Gaussian fp8 operands gives
//   an RMS of Δ / M_j near 2^-18, and the GPU tests bound it by 2^-12 (a wrong row, head or
//   dimension pairing gives ~2^-6). So the two backends' top-k can differ between entries whose
//   scores lie that close (near-ties); the same scores give the same top-k.
//   Deterministic on one GPU: no atomics, the launch shape depends only on the shapes.
// CUDA: H_I <= 256 (padded to 64, 128 or 256 heads inside); q_fp8 and keys.data 4-byte aligned
// with strides (q_fp8: both leading ones; keys: the row stride) multiples of 4 (16 is faster). A
// token whose token_to_req is out of range, or a visible entry whose block is unmapped, scores
// NaN; columns from (p+1) div r (clamped to N) on are −inf.
void indexer_scores(const TensorView& q_fp8, const TensorView& q_scale, const TensorView& weights,
                    const TensorView& positions, const TensorView& token_to_req,
                    const IndexerKeyCacheView& keys, const TensorView& key_block_table, int ratio,
                    const TensorView& scores, Stream stream = nullptr);

// The order indexer_topk writes a row's selection in. The selected set is the same either way.
//   score:  descending score (ties → lowest index first; NaN ranks below −inf), as torch.topk's
//           sorted=True reads.
//   column: ascending index. Sparse attention over the selection does not depend on its order
//           (beyond fp32 rounding), and on CUDA this skips the sort: a row whose visible entries
//           all fit in K is 0, 1, …, count−1 without reading its scores.
enum class TopkOrder { score, column };

// Top-k of each row: indices [T, K] int32 receives the min(K, (p+1) div r) visible entries with
// the highest scores (among equal scores the lowest indices; NaN ranks below −inf), in `order`,
// then −1.
//   scores [T, N] fp32 (N >= (p+1) div r), positions [T] int32/int64, ratio >= 1;
//   lens (optional) [T] int32 = number of valid slots.
// CUDA: K <= 4096 and N < 2^31; the visible count is clamped to [0, N]. Needs no workspace and
// works for any N (one block per row: a radix select of the count-th key, then an ordered
// compaction that leaves the selection in column order, both over the row's keys held in
// registers when it has at most 3072 (128-thread launch) or 4096 visible entries, else re-read per
// pass; TopkOrder::score then sorts it with a stable block radix sort); the same indices as the
// CPU, bit for bit, in either order.
void indexer_topk(const TensorView& scores, const TensorView& positions, int ratio,
                  const TensorView& indices, const TensorView& lens = {}, Stream stream = nullptr,
                  TopkOrder order = TopkOrder::score);

// C128A planning: indices [T, K] int32 = 0, 1, ..., (p+1) div r − 1, then −1 (K must be >= that
// count for every token); lens (optional) [T] int32 = the count. CUDA: the count is clamped to
// [0, K].
void compressed_prefix_indices(const TensorView& positions, int ratio, const TensorView& indices,
                               const TensorView& lens = {}, Stream stream = nullptr);

}  // namespace dsv4

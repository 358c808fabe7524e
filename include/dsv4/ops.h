// The ops of the DeepSeek-V4 attention layer (docs/spec.md §2–§8), one signature each.
//
// Every op takes views (dsv4::TensorView), writes caller-provided outputs, never allocates device
// memory and never synchronizes. The backend is chosen by where the tensors live: all CPU →
// the CPU reference; all CUDA → the CUDA kernel (when built with CUDA), launched on `stream`.
// Mixing devices is an error. Every op validates shapes, dtypes and strides at entry and throws
// dsv4::Error (naming op, argument, expected and actual) before writing anything.
// Outputs: strides >= 0, no two elements at one address (no broadcast / overlapping rows; a view
// with no elements always passes), and no memory shared with another argument — except where an
// op documents an in-place form (the very same view as its input: rms_norm, apply_rope,
// local_to_global_slots). The rule covers every input: index tensors (positions, slots), tables
// and scales are read while outputs are written, so one lying inside an output is refused. The
// same holds for kv_quantize / kv_dequantize (kv_layout.h) and the index utilities (indexing.h).
// Size and position checks are computed without overflow (checked_math.h): a value so large that
// the check's own arithmetic would wrap is an error, not a pass.
//
// Conventions: T tokens, H heads, D = 512 head dim, R = 64 rope dims (the LAST R of D),
// N = D - R nope dims. Accumulation is fp32. lse values are natural-log unless stated.
#pragma once

#include <cstdint>

#include "dsv4/config.h"
#include "dsv4/kv_layout.h"
#include "dsv4/tensor.h"

struct CUstream_st;

namespace dsv4 {

using Stream = CUstream_st*;  // == cudaStream_t; nullptr = default stream

// ================================ dense projections ===========================================
// y [T, N] = x [T, K] · Wᵀ, W [N, K].
//   x: bf16 or fp32; or fp8_e4m3 with x_scale [T, K/block] (ue8m0 or fp32, any strides; block =
//      K/x_scale.shape[1] ∈ {64, 128}) — the production path that quantizes activations first.
//   w: bf16 / fp32; or fp8_e4m3 with w_scale [ceil(N/128), ceil(K/128)] (ue8m0 or fp32): the
//      real weight is fp8(w) * scale of its 128×128 block.
//   y: bf16 or fp32 (rounded once from the fp32 accumulator).
// CUDA (cuBLASLt, fp32 accumulation, cached plans: no heuristic query after a shape's first call,
//   no allocation, graph-capturable): x and w both bf16 (y bf16 or fp32), both fp32 (y fp32; true
//   fp32, no TF32), or both fp8_e4m3 on FP8 tensor cores (sm90; y bf16 or fp32) with fp32 scales
//   in cuBLASLt's layouts —
//     x_scale: 1 × 128 blocks, strides {1, T}: the transpose of a contiguous [K/128, T] buffer
//       (quantize_act_fp8 writes it), 16-byte aligned;
//     w_scale: rows fp8_weight_scale_row_stride(K) apart (the checkpoint's grid with each row
//       padded to a multiple of 4 scales, present in memory), 16-byte aligned
//       (cuda_weight_scale in weights.h converts a checkpoint's scales once).
//   An fp8 operand with a bf16 one, or ue8m0 scales, throw dsv4::Error. Rows of x and w must not
//   overlap (row stride >= K when there are several rows). Results match the CPU up to the order
//   of the fp32 additions (FP8: per 128-deep slice of K, each slice's sum times its two scales).
void linear(const TensorView& x, const TensorView& x_scale, const TensorView& w,
            const TensorView& w_scale, const TensorView& y, Stream stream = nullptr);
// The same with a cuBLASLt workspace (CUDA; ignored on the CPU): uint8 [bytes] on the device,
// 256-byte aligned, used only by this call on `stream`. With one, cuBLASLt may split K across
// thread blocks (never with atomics: results stay deterministic), which decode-sized problems
// need to fill the GPU. kGemmWorkspaceBytes is enough for every V4 projection.
void linear(const TensorView& x, const TensorView& x_scale, const TensorView& w,
            const TensorView& w_scale, const TensorView& y, const TensorView& workspace,
            Stream stream);
inline constexpr int64_t kGemmWorkspaceBytes = int64_t{32} << 20;
// Per-batch projections, each batch with a weight of its own (the absorbed MLA's per-head W_UK and
// W_UV, include/dsv4/sparse_mla_layer.h): y[b] = x[b] · w[b]ᵀ for b < B.
//   x [B, T, K], w [B, N, K], y [B, T, N]: any non-negative strides with a contiguous last dim, so
//   the heads of a [T, H, d] activation are the batch without a copy (x's batch stride d, its row
//   stride H·d); y's elements distinct and disjoint from x and w.
//   x, w: bf16 or fp32 (CUDA: both bf16, y bf16 or fp32, or both fp32, y fp32 — linear's CUDA
//   rules); y: bf16 or fp32, rounded once from the fp32 accumulator.
// CPU: batch b is linear's GEMM on (x[b], w[b]), so the result is bit-identical to B linear calls.
// CUDA: one strided-batched cuBLASLt matmul (linear's plan cache: the first call of a shape picks
//   the plan, so it is made before any graph capture); workspace as linear's.
void batched_linear(const TensorView& x, const TensorView& w, const TensorView& y,
                    Stream stream = nullptr);
void batched_linear(const TensorView& x, const TensorView& w, const TensorView& y,
                    const TensorView& workspace, Stream stream);

// CUDA FP8 block-scaled GEMMs (linear, grouped_wo_a with FP8 operands) take row counts T that are
// multiples of this: cuBLASLt reads the [K/128, T] activation scales with 16-byte aligned rows.
inline constexpr int64_t kFp8GemmRowMultiple = 4;

// Row stride (in scales) of an FP8 weight's 128×128 block scales as the CUDA GEMMs take them:
// ceil(K/128) rounded up to a multiple of 4 (16 bytes), K the weight's columns.
inline int64_t fp8_weight_scale_row_stride(int64_t K) { return ((K + 127) / 128 + 3) / 4 * 4; }

// FP8 activation quantization: per row, per block of `block` (64 or 128) values, scale
// 2^ceil(log2(max(amax/448, 1e-4))) (UE8M0); xq = fp8(x / scale).
//   x [T, K] bf16/fp32, xq [T, K] fp8_e4m3, scale [T, K/block] ue8m0 or fp32 (the power of two) at
//   any strides (the CUDA GEMMs take the transpose of a contiguous [K/block, T] buffer).
//   CPU and CUDA produce the same codes and scales, bit for bit (shared dtype.h rules).
void quantize_act_fp8(const TensorView& x, int block, const TensorView& xq,
                      const TensorView& scale, Stream stream = nullptr);

// Block-scaled FP8 → bf16 / fp32: y = fp8(x) · the scale of its block_rows × block_cols block.
//   x fp8_e4m3 [R, C] or [G, R, C]; scale ue8m0 or fp32 [ceil(R/block_rows), ceil(C/block_cols)]
//   (with the same leading G for 3-d x); y bf16 or fp32 with x's shape (disjoint from x, scale).
//   Row strides allowed on every argument (last dim contiguous).
// Uses: FP8 tensors for a backend or test that wants them dense (the CUDA GEMMs take FP8 operands
// directly), and FP8 activations with 1×128 blocks turned back into bf16 before a bf16 GEMM.
// Rounding: the product is formed once in fp32 and rounded once to y's dtype, identically on
// CPU and CUDA. With UE8M0 or power-of-two fp32 scales the result is EXACT in bf16 and fp32 (an
// e4m3 value has at most 4 significant bits; times 2^k it is still representable) while it stays
// a normal float (|y| ≥ 2^-126; below that the CUDA kernel, built with flush-to-zero, gives ±0
// where the CPU keeps the subnormal). With an arbitrary fp32 scale the product rounds in fp32
// and, for a bf16 y, once more to bf16.
void dequantize_fp8_blocks(const TensorView& x, const TensorView& scale, int block_rows,
                           int block_cols, const TensorView& y, Stream stream = nullptr);

// ================================ norms =======================================================
// RMSNorm over the last dim: y = x * rsqrt(mean(x²) + eps) * weight. weight undefined → no
// weight (the per-head q norm). x, y: [..., D] bf16/fp32 (y may alias x); weight [D] bf16/fp32.
void rms_norm(const TensorView& x, const TensorView& weight, float eps, const TensorView& y,
              Stream stream = nullptr);

// Summation order (CPU and CUDA alike, so both give the same bits): chunks of 8 consecutive
// elements dealt round-robin to 32 partial sums, then a butterfly over the partials
// (src/math/rms_norm.h) — the order one warp computes with 16-byte loads.

// The fused q/kv RMSNorm after the low-rank projections: q_out = RMSNorm(q_in; wq),
// kv_out = RMSNorm(kv_in; wkv). Shapes [T, q_lora] and [T, D].
void fused_qkv_rms_norm(const TensorView& q_in, const TensorView& wq, const TensorView& kv_in,
                        const TensorView& wkv, float eps, const TensorView& q_out,
                        const TensorView& kv_out, Stream stream = nullptr);
// The same, also writing the normed q quantized for an FP8 wq_b (quantize_act_fp8 of q_out's
// values, block 128, in the same pass): q_fp8 [T, q_lora] fp8_e4m3, q_scale [T, q_lora/128]
// ue8m0 / fp32 at any strides (the CUDA GEMMs' layout: the transpose of a contiguous
// [q_lora/128, T] buffer). q_out may be undefined when only the FP8 q is needed; the quantized
// values are then the normed row rounded to bf16. Bit-identical on CPU and CUDA.
void fused_qkv_rms_norm(const TensorView& q_in, const TensorView& wq, const TensorView& kv_in,
                        const TensorView& wkv, float eps, const TensorView& q_out,
                        const TensorView& kv_out, const TensorView& q_fp8,
                        const TensorView& q_scale, Stream stream);

// The residual stream between layers (vLLM's fused_add_rms_norm): residual ← residual + delta
// (fp32, in place), then y = RMSNorm(residual; weight, eps) of the updated rows, in one pass.
//   residual [T, D] fp32 (updated in place), delta [T, D] bf16/fp32 or undefined (no add),
//   weight [D] bf16/fp32 or undefined (no weight), y [T, D] bf16/fp32 or undefined (add only).
//   y must not overlap residual or delta; delta must not overlap residual.
// CPU and CUDA give the same bits (fp32 add, then rms_norm's summation order and rounding).
void residual_add_rms_norm(const TensorView& residual, const TensorView& delta,
                           const TensorView& weight, float eps, const TensorView& y,
                           Stream stream = nullptr);

// ================================ RoPE =========================================================
// cos/sin table for positions [0, max_pos): fp32 [max_pos, R] = [cos(p f_0..f_{R/2-1}) |
// sin(...)], frequencies per docs/spec.md §3 (YaRN when cfg.yarn). Host tensor.
HostTensor build_rope_cache(const RopeConfig& cfg, int64_t max_pos);
// The R/2 frequencies f_i (double) of docs/spec.md §3.
void rope_frequencies(const RopeConfig& cfg, double* freqs /* [R/2] */);

// GPT-J interleaved RoPE on the last R dims of each head: pairs (2i, 2i+1) rotate by p·f_i
// (inverse: by −p·f_i). x, y: [T, D] or [T, H, D] bf16/fp32 (y may alias x; the first D−R dims
// are copied). positions [T] int64/int32, every p in [0, cos_sin.shape[0]) (checked on CPU; on
// CUDA the values cannot be read on the host: rows of a token whose position is outside the
// table are left unwritten). cos_sin from build_rope_cache (on the device of x).
void apply_rope(const TensorView& x, const TensorView& positions, const TensorView& cos_sin,
                bool inverse, const TensorView& y, Stream stream = nullptr);

// The output projection's input in one pass (vLLM's fused_inv_rope_fp8_quant): inverse RoPE on
// the last R dims of each head of o [T, H, D] bf16 (row strides allowed) at positions[t], each
// value rounded to bf16 (what apply_rope writes into a bf16 o), then FP8 e4m3 per 1×block of the
// flattened row (quantize_act_fp8's rule) into o_fp8 [T, H·D] (row stride allowed) and o_scale
// [T, H·D/block] ue8m0 / fp32 at any strides (the CUDA GEMMs' layout: the transpose of a
// contiguous [H·D/block, T] buffer). block 64 or 128 dividing D. positions [T] int32/int64 in
// [0, cos_sin.shape[0]) (checked on CPU; on CUDA a token whose position is outside the table is
// left unwritten). Bit-identical on CPU and CUDA. Saves apply_rope's and quantize_act_fp8's
// passes over o: it reads o once and writes a quarter of its bytes.
void inv_rope_fp8_quant(const TensorView& o, const TensorView& positions, const TensorView& cos_sin,
                        int block, const TensorView& o_fp8, const TensorView& o_scale,
                        Stream stream = nullptr);

// ================================ fused KV insert ============================================
// The fused "q head-norm + q RoPE + kv RoPE + FP8 quant + paged insert" (vLLM
// fused_qnorm_rope_kv_insert):
//   q [T, H, D] bf16, in place: q ← rms_norm(q, no weight, eps) per head, then RoPE on q[..., N:].
//   kv [T, D] bf16 (already RMS-normed), in place: RoPE on kv[N:], then the token is written to
//   `cache` at slot_mapping[t] (int64 or int32 [T]; -1 = don't store) in the cache's layout, and
//   kv is overwritten with exactly what the cache now holds (dequantized), so the caller can
//   attend to the current chunk with the cached values. A token with slot -1 gets the same
//   quantize-dequantize (kv always holds what the cache would hold). D must be the layout's dim
//   (512; 576 for V32_FP8). Slots must be -1 or in [0, cache.num_slots()) and distinct, positions
//   in [0, cos_sin.shape[0]) — checked on CPU before anything is written. On CUDA these values
//   cannot be read on the host: a slot outside the cache acts as -1, a token whose position is
//   outside the table is skipped (q, kv and cache untouched), and when two tokens share a slot
//   the bytes it ends up holding are unspecified. CPU and CUDA results are bit-identical.
void qnorm_rope_kv_insert(const TensorView& q, const TensorView& kv, const TensorView& positions,
                          const TensorView& cos_sin, float eps, const KvCacheView& cache,
                          const TensorView& slot_mapping, Stream stream = nullptr);
// The optional FP8 query output of the insert (the FlashInfer port's STORE_Q_FP8, which the
// port's per-tensor FP8 decode consumes with bmm1_scale = softmax_scale · q_scale · kv_scale).
// Allowed with any cache layout (the port uses it with FP8_PER_TENSOR).
struct Fp8QueryOutput {
  // [T, H, D] fp8_e4m3, q's shape, any non-negative strides with a contiguous last dim (no two
  // elements at one address; no byte shared with q, kv, the cache or the read inputs).
  // Undefined: no FP8 query (q_scale must then stay 1).
  TensorView q_fp8;
  // The FP8 query's dequantization scale (vLLM's _q_scale): a finite value > 0 whose largest
  // query, bf16(448 · q_scale), is finite.
  float q_scale = 1.0f;
};
// The same, also writing the FP8 query: after the head norm and RoPE (fp32), per value
//   q_fp8 = e4m3(q · (1 / q_scale))   (fp8_block.h fp8_encode_scaled: the reciprocal once, as the
//                                      cache's per-tensor encoder; saturating at ±448),
//   q     = bf16(fp8 · q_scale)       (in place: what the FP8 query means, as kv is overwritten
//                                      with what the cache holds),
// so a caller attending with the bf16 q (the prefill path) sees exactly the FP8 decode's query
// (sparse_decode attends an FP8 q as bf16(fp8 · q_scale), SparseDecodeArgs::q_scale). CPU and
// CUDA write the same bytes; on CUDA a skipped token (position outside the table) leaves its q_fp8
// rows untouched too.
void qnorm_rope_kv_insert(const TensorView& q, const TensorView& kv, const TensorView& positions,
                          const TensorView& cos_sin, float eps, const KvCacheView& cache,
                          const TensorView& slot_mapping, const Fp8QueryOutput& fp8_query,
                          Stream stream = nullptr);

// ================================ sparse attention ===========================================
// Contract (docs/spec.md §6): for each query row (b, s, h): over the valid gathered rows k_i,
//   P_i = scale · q·k_i,  lse = ln Σ exp(P_i),  out = Σ exp(P_i − lse) · k_i[:d_v];
//   (sparse_decode with an FP8 query: q = bf16(fp8 · q_scale), see SparseDecodeArgs::q_scale);
//   with a sink σ_h: out ← out · exp(lse) / (exp(lse) + exp(σ_h)). lse excludes the sink.
//   No valid row: out = 0, lse = +inf.
//   k_i is the cached row as the tensor cores take it: each value decoded in fp32 (kv_layout.h)
//   and rounded to bf16 — exact for MODEL1 (power-of-two scales) and BF16; for FP8_PER_TENSOR
//   and V32_FP8 (fp32 scales) bf16(fp8 · scale), on both backends.
//
// Strides (FlashMLA's rules): q, kv, indices, out, lse and max_logits may have any strides whose
// last dim is contiguous (e.g. q [b, s_q, H, d] whose [b, s_q] do not merge, a transposed or
// sliced indices view, out a slice of a wider buffer). topk_length and attn_sink are contiguous
// vectors. Caches: any block stride >= the layout's block bytes, bytes dense within a block
// (check_kv_cache). CUDA moves rows in 16-byte pieces (cp.async, vector stores, TMA, whose
// descriptors take strides in multiples of 16 bytes), so there the strides of q's and out's
// leading dims (those of size > 1) and kv's row stride must be multiples of 8 elements, with
// 16-byte aligned base pointers; the error names the offending stride. No op copies an input.
// (16 bytes are 8 elements of a bf16 q or out, 16 of an FP8 q.)
struct SparseDecodeArgs {
  // [b, s_q, H, d_qk] bf16, or fp8_e4m3 (an FP8 query of scale q_scale, e.g. qnorm_rope_kv_insert's
  // q_fp8); d_qk = 512 (MODEL1, BF16, FP8_PER_TENSOR) or 576 (V32), with any cache layout.
  TensorView q;
  KvCacheView k_cache;          // main scope
  TensorView indices;           // [b, s_q, topk] int32 global slots; -1 = invalid
  TensorView topk_length;       // optional [b] int32: only the first topk_length[b] slots count
  KvCacheView extra_k_cache;    // optional second scope (extra_k_cache.data undefined = none)
  TensorView extra_indices;     // [b, s_q, extra_topk] int32
  TensorView extra_topk_length; // optional [b] int32
  TensorView attn_sink;         // optional [H] fp32
  float softmax_scale = 0.0f;   // 0 → d_qk^-0.5; else |softmax_scale| in [8.2e-39, 2.35e38]
  // An FP8 q's dequantization scale. The decode attends with the bf16 query the codes mean,
  // bf16(fp8 · q_scale) (fp8_block.h fp8_decode_scaled, then one bf16 rounding): exactly the q
  // that qnorm_rope_kv_insert leaves beside its q_fp8, which a prefill attends with, so the two
  // paths see one query. Logits: softmax_scale · (bf16(q_fp8 · q_scale) · k) — the FlashInfer
  // port's softmax_scale · q_scale · (q_fp8 · k) (its bmm1_scale) exactly for a power-of-two
  // q_scale, within one bf16 rounding of each query value (2^-9 relative) otherwise. (Folding the
  // scale into the logits left each FP8 decode ~2e-3 away from the prefill's bf16 query, which the
  // layer's FP8 activation rounding amplified to 2-3e-2: measured on the tiny model at 0.6.)
  // The conversion happens as the kernels load q; their tensor-core math is unchanged. A finite
  // value > 0 whose largest query bf16(448 · q_scale) is finite; 1 for a bf16 q (any other value
  // is refused).
  float q_scale = 1.0f;
  int d_v = 512;
  TensorView out;               // [b, s_q, H, d_v] bf16
  TensorView lse;               // [b, s_q, H] fp32 (natural log, of the logits above)
};

// Split-KV plan: depends only on shapes (b, s_q, H, topk + extra_topk) and the SM count, so it
// can be made once per step and reused by every layer of that shape (CUDA-graph friendly).
// Split s covers slots [s * split_len, (s + 1) * split_len) of the concatenated index list
// (main scope's topk slots, then the extra scope's). num_splits is chosen so that
// b * s_q * ceil(H / 64) * num_splits roughly fills num_sms, without empty splits.
struct DecodeSchedule {
  int num_splits = 1;           // splits per (b, s_q) row over the concatenated index list
  int split_len = 0;            // index slots per split (a multiple of kDecodeTile)
  int64_t workspace_bytes = 0;  // partial o (fp32) + partial lse for all splits
};
inline constexpr int kDecodeTile = 64;  // split_len granularity (the kernels' KV tile)
// Throws dsv4::Error for b < 0, s_q < 1, h < 1, topk_total < 0, num_sms < 1 or d_v < 1.
DecodeSchedule make_decode_schedule(int b, int s_q, int h, int topk_total, int num_sms = 132,
                                    int d_v = 512);

// Whole decode: partial attention per split into `workspace`, then the combine.
// workspace: uint8 [>= schedule.workspace_bytes] on the device of q, 16-byte aligned, holding
// partial_o fp32 [b, s_q, H, num_splits, d_v] from byte 0 and partial_lse fp32
// [b, s_q, H, num_splits] right after it. The schedule must cover topk + extra_topk
// (num_splits * split_len >= it, split_len a positive multiple of kDecodeTile).
// Index values (CPU only; a pass over the indices): each counted slot (the first topk_length[b]
// of each scope) must be -1 or a slot of its cache, else dsv4::Error; topk_length values must
// lie in [0, topk]. Duplicate indices count once per occurrence.
void sparse_decode(const SparseDecodeArgs& args, const DecodeSchedule& schedule,
                   const TensorView& workspace, Stream stream = nullptr);

// The combine step alone: partial_o [b, s_q, H, splits, d_v] fp32, partial_lse [b, s_q, H,
// splits] fp32 (contiguous; −inf for an empty split) → out [b, s_q, H, d_v] bf16, lse [b, s_q, H]
// (strided, the rules above); applies the sink (optional [H] fp32) and the no-valid-key
// convention.
void sparse_attention_combine(const TensorView& partial_o, const TensorView& partial_lse,
                              const TensorView& attn_sink, const TensorView& out,
                              const TensorView& lse, Stream stream = nullptr);

struct SparsePrefillArgs {
  TensorView q;            // [s_q, H, d_qk] bf16, d_qk 512 or 576
  TensorView kv;           // [s_kv, 1, d_qk] bf16 (K = V: the first d_v dims are V)
  TensorView indices;      // [s_q, 1, topk] int32; -1 and >= s_kv are invalid
  TensorView topk_length;  // optional [s_q] int32
  TensorView attn_sink;    // optional [H] fp32
  float softmax_scale = 0.0f;  // 0 → d_qk^-0.5; else |softmax_scale| in [8.2e-39, 2.35e38]
  int d_v = 512;
  TensorView out;          // [s_q, H, d_v] bf16
  TensorView max_logits;   // [s_q, H] fp32, natural units (scale · q·k); -inf when no valid key
  TensorView lse;          // [s_q, H] fp32, natural log; +inf when no valid key
  // Optional int32 [>= 1] scratch on the device of q (CUDA; the CPU backend leaves it alone),
  // disjoint from every other argument: the kernel's persistent CTAs, which take their (token,
  // head group) items round-robin, then take the launch's last items from an atomic counter in
  // it (zeroed on the stream before the launch) as they finish, which keeps every SM busy to the
  // launch's end. A launch of fewer than eight rounds of items (at most 7 per SM) does without it
  // and leaves it untouched. Results are bit-identical either way. Its contents on entry do not
  // matter. One launch at a time per scratch: two launches in flight on different streams need two.
  TensorView work_counter;
};
// Index values are never errors (masked as FlashMLA does); on CPU, topk_length values outside
// [0, topk] are (dsv4::Error before any output is written).
void sparse_prefill(const SparsePrefillArgs& args, Stream stream = nullptr);

// ================================ prefill gather =============================================
// Dequantize-and-gather (vLLM dequantize_and_gather_k_cache): for prefill request r, rows
// [seq_lens[r] - g, seq_lens[r]) of its cache (g = gather_lens[r], or seq_lens[r] when
// gather_lens is undefined) are dequantized to workspace[r, offset + j] for j < g.
//   workspace [R, M, d] bf16 (d = the layout's dim), block_table [R, max_blocks] int32,
//   seq_lens [R] int32 (entries), gather_lens [R] int32 optional. Rows not written keep their
//   contents. An entry whose block is -1 or beyond the table, gather_lens[r] outside
//   [0, seq_lens[r]], or offset + g > M is an error (CPU validation). On CUDA these values cannot
//   be read on the host: the kernel skips (leaves untouched) every such row — a request with
//   seq_lens[r] < 0 or gather_lens[r] outside [0, seq_lens[r]], rows j >= M - offset, and entries
//   whose block is -1, beyond the table or outside the cache. Bit-identical to the CPU otherwise.
void dequantize_and_gather(const KvCacheView& cache, const TensorView& block_table,
                           const TensorView& seq_lens, const TensorView& gather_lens,
                           int64_t offset, const TensorView& workspace, Stream stream = nullptr);

// ================================ output path ================================================
// Grouped low-rank output projection: view o [T, H*D] as G groups of H*D/G;
// z[:, g*L:(g+1)*L] = o_g · wo_a_gᵀ with wo_a [G, L, H*D/G] (bf16, or fp8 with wo_a_scale
// [G, ceil(L/128), ceil(H*D/G/128)] ue8m0/fp32). o: bf16/fp32, or fp8 with o_scale [T, H*D/128]
// (the production path: inv_rope_fp8_quant or quantize_act_fp8 first; 1×64 blocks [T, H*D/64]
// also accepted on the CPU; any strides; a scale block may not straddle two groups).
// z [T, G*L] bf16/fp32.
// CUDA, with linear's CUDA dtype and scale-layout rules (wo_a_scale per group: rows
//   fp8_weight_scale_row_stride(H*D/G) apart): bf16 / fp32 operands as one strided-batched
//   cuBLASLt matmul over the G groups; FP8 operands as one block-scaled FP8 matmul per group
//   (cuBLASLt's block-scaled modes take no batch), enqueued in group order — each group's block
//   of o_scale must start 16-byte aligned: (H*D/G/128) · T a multiple of 4, which every H*D/G
//   that is a multiple of 512 gives.
void grouped_wo_a(const TensorView& o, const TensorView& o_scale, const TensorView& wo_a,
                  const TensorView& wo_a_scale, const TensorView& z, Stream stream = nullptr);
// The same with a cuBLASLt workspace (see linear's).
void grouped_wo_a(const TensorView& o, const TensorView& o_scale, const TensorView& wo_a,
                  const TensorView& wo_a_scale, const TensorView& z, const TensorView& workspace,
                  Stream stream);

}  // namespace dsv4

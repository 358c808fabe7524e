// The DeepSeek-V3.2 lightning indexer's row preparation (its queries and its keys), the part that
// differs from V4's indexer (indexer.h). Scoring and top-k are shared with V4: indexer_scores and
// indexer_topk with ratio 1 (every earlier token of the request, and the token itself, is an entry)
// over the same FP8 key cache (indexer_key_cache.h).
//
// Per token at position p (DeepSeek-V3.2's inference/model.py, Indexer.forward):
//   query rows q = qr · wq_bᵀ → [I, d]; key k = LayerNorm(x · wkᵀ; k_norm, k_norm_bias) → [d];
//   RoPE on the FIRST R dims of each row, in halves (NeoX style, unlike the MLA's interleaved
//   pairs): (v_i, v_{i+R/2}) rotates by p·f_i with the layer's frequencies (build_rope_cache);
//   Hadamard rotation of the d dims (Sylvester order, scale d^-0.5);
//   FP8 e4m3 with one power-of-two scale per row (fp8_block.h: the V4 indexer's quantizer).
//   The indexer weights are w = (x · weights_projᵀ) · I^-0.5 · d^-0.5, as for V4 (the quantize
//   step's second form scales them).
#pragma once

#include "dsv4/indexer_key_cache.h"
#include "dsv4/ops.h"
#include "dsv4/tensor.h"

namespace dsv4 {

// Queries: x [T, n, d] bf16/fp32 (row strides allowed), d = 128; positions [T] int32/int64 in
// [0, cos_sin.shape[0]); cos_sin fp32 [max_pos, R] (R <= d). Outputs codes [T, n, d] fp8_e4m3
// and scales [T, n] fp32 (powers of two), disjoint from the inputs. CPU and CUDA, bit-identical;
// on CUDA position values are not read on the host: a row whose position is outside the table
// gets zero codes and a NaN scale (the CPU refuses it).
void sparse_mla_indexer_quantize(const TensorView& x, const TensorView& positions,
                                 const TensorView& cos_sin, const TensorView& codes,
                                 const TensorView& scales, Stream stream = nullptr);
// The same, also finishing the indexer's head weights in place (the layer's queries and weights
// are ready for indexer_scores after this one call, as indexer_query leaves V4's): weights
// [T, n] fp32 (x · weights_projᵀ, row stride allowed; undefined: none) ← weights · w_scale, one
// fp32 multiply each, w_scale = indexer_math::indexer_weight_scale(n) = fp32(1 / sqrt(n · d)).
// Every row's weight is scaled, its position valid or not. weights must not overlap the other
// arguments.
void sparse_mla_indexer_quantize(const TensorView& x, const TensorView& positions,
                                 const TensorView& cos_sin, const TensorView& codes,
                                 const TensorView& scales, const TensorView& weights, Stream stream);

// Keys: k [T, d] bf16/fp32 (the projection x · wkᵀ), LayerNorm (fp32, biased variance, eps) with
// weight and bias [d] bf16/fp32, then the query rows' RoPE, rotation and FP8, written to the key
// cache at slot_mapping[t] (int32/int64 [T]; -1 = don't store). Slots must be -1 or inside the
// cache and distinct, positions inside the table: checked before anything is written on the CPU.
// CUDA (bit-identical): those values are not read on the host; a key whose slot is outside the
// cache or whose position is outside the table is not stored, and keys sharing a slot race.
void sparse_mla_indexer_key_insert(const TensorView& k, const TensorView& norm_weight,
                                   const TensorView& norm_bias, float eps,
                                   const TensorView& positions, const TensorView& cos_sin,
                                   const IndexerKeyCacheView& keys, const TensorView& slot_mapping,
                                   Stream stream = nullptr);

}  // namespace dsv4

// The unbatched float64 reference of one attention layer (docs/spec.md §2–§6): a second, deliberately
// plain implementation used by `dsv4 run --check` and the layer tests to judge the batched path.
//
// It runs ONE request's tokens at positions 0..L-1 in double precision, straight from the formulas
// (no caches, no batching, no split-KV). Arithmetic is double; it rounds only where the production
// path stores data in a narrower format, because an FP8 step amplifies any earlier difference (a
// value that lands on the other side of an FP8 rounding boundary moves by a whole FP8 ulp, 6–12%):
// bf16 activations (normed q_lora and kv, q — FP8 over per-tensor FP8 caches, see ReferenceOptions
// — the attention output before and after inverse RoPE), the KV cache contents (nope dims FP8 e4m3
// in blocks of 64 with UE8M0 scales, rope dims bf16 — what MODEL1 stores — for SWA rows and
// compressed entries alike), the indexer's FP8 q / key rows (one power-of-two scale per 128
// values), when fp8_activations is set the FP8 (UE8M0, 1x128) quantization of o before wo_a, and
// when fp8_gemm_activations is set the same quantization of the input of every other projection
// whose weight is FP8 (x before wq_a / wkv, the bf16 normed q before wq_b and the indexer's wq_b,
// the bf16 z before wo_b). What remains between the two is fp32-vs-double accumulation, which flips
// one of these roundings only rarely.
#pragma once

#include <vector>

#include "dsv4/config.h"
#include "dsv4/kv_layout.h"
#include "dsv4/weights.h"

namespace dsv4 {

struct ReferenceOptions {
  bool fp8_activations = true;       // AttentionOptions::fp8_activations
  bool fp8_gemm_activations = true;  // AttentionOptions::fp8_gemm_activations
  // The layer's SWA / compressed cache layout (LayerCacheOptions::layout): what a cached row
  // hands back. MODEL1_FP8: nope dims FP8 in blocks of 64, rope dims bf16. BF16: every dim bf16
  // (the SWA rows unquantized, as the FlashInfer port's full-width cache). FP8_PER_TENSOR: every
  // dim FP8 e4m3 at the cache's scale, kv_scale. Compressed entries hold the model's values
  // with their nope dims FP8-rounded in blocks of 64 (docs/spec.md §4), rope dims as computed,
  // then the layout's encoding of all dims (MODEL1's own rope rounding is bf16). The V3.2
  // reference ignores it (its own layout).
  // With FP8_PER_TENSOR the layer's queries are FP8 too (LayerCacheOptions::q_scale): after the
  // head norm and RoPE, q ← bf16(e4m3(q / q_scale) · q_scale), what both its FP8 decode and its
  // bf16 prefill attend with (the decode without the bf16 rounding: within it).
  KvLayout kv_layout = KvLayout::model1_fp8;
  float kv_scale = 1.0f;  // LayerCacheOptions::kv_scale (FP8_PER_TENSOR only)
  float q_scale = 1.0f;   // LayerCacheOptions::q_scale (FP8_PER_TENSOR only)
};

// x: [L, dim] row-major; returns y [L, dim].
std::vector<double> reference_attention_layer(const ModelConfig& cfg, int layer,
                                              const AttentionWeights& w,
                                              const std::vector<double>& x,
                                              const ReferenceOptions& opts = {});

}  // namespace dsv4

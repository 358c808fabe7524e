// The cost model of `dsv4 bench layer`: per op of one layer step, the FLOPs and the fewest HBM
// bytes the op must move, and from them its floor under measured ceilings,
//   floor = max(fp8 FLOPs / fp8 ceiling + bf16 FLOPs / bf16 ceiling, bytes / copy ceiling).
//
// Ops are keyed by the names the layer passes to its OpTimer (src/layer/attention.cpp,
// compressed_scope.cpp). A name the table does not know has no cost (op_cost returns nullopt), so
// the bench reports it as unmodeled instead of counting it as free. Adding an op is one table
// entry in layer_cost_model.cpp.
//
// What is counted (see the table for each op):
//   - FLOPs: the tensor-core work only (GEMMs, attention, indexer scores), split by the rate it
//     can run at: GEMMs whose weight the checkpoint stores in FP8 (wq_a, wkv, wq_b, wo_a, wo_b,
//     indexer wq_b) count at the FP8 rate when the weights are FP8 (the layer's target: FP8
//     tensor-core GEMMs), the bf16-stored ones (compressor wkv/wgate, indexer weights_proj) and
//     the attention itself at the bf16 rate, indexer scores at the FP8 rate. Sparse attention
//     counts the rows a token really attends (SWA min(W, p + 1), compressed entries visible to it,
//     C4A capped at top-k), not padded index slots: the floor is the least work.
//   - Bytes: each op's inputs read once and outputs written once, at the dtypes the CUDA layer
//     passes between its ops today (the constants below), weights at their stored bytes (FP8:
//     1 byte per parameter + one scale per 128x128 block; bf16: 2), KV rows read once per request
//     (a prefill request's rows are shared by its tokens), indexer keys once per request.
//     Temporaries inside an op (the compressor's fp32 projection rows, the indexer query's fp32
//     projection) are not counted: a fused op need not move them.
//   - Host work (planning, uploads of step metadata) costs nothing here: the floor is GPU work.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "dsv4/batch.h"
#include "dsv4/config.h"

namespace dsv4::bench {

// Bytes per element of the tensors the CUDA layer passes between ops (attention.cpp): the low-rank
// query and kv leave their GEMMs in fp32, q / o / z / x in bf16, y in fp32.
struct ActivationBytes {
  static constexpr int x = 2;          // layer input (bf16 on the GPU)
  static constexpr int gemm_out = 4;   // wq_a / wkv outputs (fp32), before the fused norm
  static constexpr int normed = 2;     // qr_n, kv after the norm (bf16)
  static constexpr int q = 2;          // q / o [T, H, D] (bf16)
  static constexpr int z = 2;          // wo_a output (bf16 on CUDA)
  static constexpr int y = 4;          // layer output (fp32)
  static constexpr int fp8 = 1;        // quantized o, indexer q
  static constexpr int scale = 4;      // fp32 activation scales
  static constexpr int index = 4;      // int32 index lists
  static constexpr int position = 8;   // int64 positions / slots
  static constexpr int score = 4;      // fp32 indexer scores
};

// Ceilings measured in the same run (hw_ceilings.h).
struct Ceilings {
  double fp8_tflops = 0;   // FP8 e4m3 tensor-core GEMM
  double bf16_tflops = 0;  // bf16 tensor-core GEMM
  double copy_gbps = 0;    // device-to-device copy, bytes read + written
};

struct OpCost {
  double flop_fp8 = 0;   // tensor-core FLOPs at the FP8 rate
  double flop_bf16 = 0;  // tensor-core FLOPs at the bf16 rate
  double bytes = 0;      // fewest bytes through HBM
  double flop() const { return flop_fp8 + flop_bf16; }
  // max(compute time, memory time) in µs; throws dsv4::Error if a needed ceiling is not > 0.
  double floor_us(const Ceilings& c) const;
  // "fp8", "bf16" (the larger FLOP share's rate) or "memory": what bounds the floor.
  std::string bound(const Ceilings& c) const;
};

// Everything the model needs about one step of one layer, reduced from the config and the plan.
struct StepShape {
  // Config.
  int dim = 0, heads = 0, head_dim = 0, rope_dims = 0, v_head_dim = 0, q_lora = 0;
  int o_groups = 0, o_lora = 0, window = 0, index_heads = 0, index_head_dim = 0, index_topk = 0;
  int ratio = 0;               // 0 (SWA), 4 (C4A), 128 (C128A)
  int kv_token_bytes = 0;      // bytes of one cached KV row (MODEL1_FP8: 584)
  int index_key_bytes = 0;     // bytes of one indexer key row (132)
  bool fp8_weights = true;     // checkpoint-FP8 weights stored as FP8 (else bf16)
  // The step.
  int64_t tokens = 0, requests = 0;
  int64_t decodes = 0;         // tokens of the decode-like requests (attended one by one)
  int64_t prefill_tokens = 0;  // tokens of prefill chunks
  int64_t prefill_requests = 0;
  double decode_rows = 0;      // Σ over decode tokens of attended rows (SWA + compressed)
  double prefill_rows = 0;     // Σ over prefill tokens of attended rows
  double decode_slots = 0;     // index slots per decode token (W + compressed top-k width)
  double prefill_slots = 0;    // index slots per prefill token
  double gathered_rows = 0;    // Σ over prefill requests of the rows gathered for it once
  double visible = 0;          // Σ over tokens of compressed entries visible to it (C4A: keys scored)
  double topk_scores_read = 0; // C4A: that Σ over the tokens that see more than index_topk entries
                               // (the layer's column-order top-k reads no other token's scores)
  double topk_width = 0;       // compressed slots per token (C4A: index_topk, C128A: max visible)
  double key_rows = 0;         // Σ over requests of indexer keys read (visible at its last token)
  double emitted = 0;          // compressed entries the step emits (all requests)
  double ring_reads = 0;       // compressor ring rows read back from earlier steps
  double ring_writes = 0;      // compressor ring rows saved for later steps

  static StepShape make(const ModelConfig& cfg, LayerKind kind, const BatchPlan& plan,
                        bool fp8_weights);
};

// The op's cost, or nullopt when the table has no entry for `op`.
std::optional<OpCost> op_cost(std::string_view op, const StepShape& s);
// Every op name the table knows (sorted).
std::vector<std::string> modeled_ops();

// Bytes of a [rows, cols] linear weight: FP8 1 byte per parameter + a 128x128 block's scale
// (UE8M0, 1 byte, as the checkpoint stores it), else 2 (bf16).
double weight_bytes(int64_t rows, int64_t cols, bool fp8);

}  // namespace dsv4::bench

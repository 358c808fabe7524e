// The CPU backend's table: the reference kernels of src/cpu/, one row per op with what each
// supports. Selected for tensors in host memory; always built.
#include "cpu/kernels.h"
#include "ops/backend.h"

namespace dsv4::ops {

namespace {

// Every CPU kernel accepts any strides whose last dim is contiguous (outputs: distinct elements)
// and runs synchronously on the calling thread (OpenMP inside); none is graph-capturable.
constexpr const char* kRows = "row-strided (last dim contiguous)";

const OpRow kRowsTable[] = {
    row(kLinear, &cpu::linear,
        {"x, w: bf16, fp32, fp8_e4m3 (+ ue8m0/fp32 block scales: x 1x64 or 1x128, w 128x128); "
         "y: bf16, fp32", kRows, "any T, N, K", false, "mixed operand dtypes allowed"}),
    row(kBatchedLinear, &cpu::batched_linear,
        {"x, w: bf16, fp32; y: bf16, fp32", kRows, "any B, T, N, K", false,
         "linear's GEMM per batch (bit-identical to B linear calls)"}),
    row(kGroupedWoA, &cpu::grouped_wo_a,
        {"o, wo_a: bf16, fp32, fp8_e4m3 (+ scales); z: bf16, fp32", kRows, "any G, L, H*D/G",
         false, ""}),
    row(kQuantizeActFp8, &cpu::quantize_act_fp8,
        {"x: bf16, fp32 -> fp8_e4m3 + ue8m0/fp32 scales", kRows, "block 64 or 128", false,
         "bit-identical to CUDA"}),
    row(kDequantizeFp8Blocks, &cpu::dequantize_fp8_blocks,
        {"fp8_e4m3 + ue8m0/fp32 scales -> bf16, fp32", kRows, "[R, C] or [G, R, C], any blocks",
         false, ""}),
    row(kRmsNorm, &cpu::rms_norm,
        {"bf16, fp32", kRows, "any D", false, "in place allowed; bit-identical to CUDA"}),
    row(kFusedQkvRmsNorm, &cpu::fused_qkv_rms_norm,
        {"bf16, fp32 (+ fp8_e4m3 q output)", kRows, "any q_lora, D", false,
         "bit-identical to CUDA"}),
    row(kResidualAddRmsNorm, &cpu::residual_add_rms_norm,
        {"residual fp32; delta, weight, y: bf16, fp32", kRows, "any D", false,
         "bit-identical to CUDA"}),
    row(kApplyRope, &cpu::apply_rope,
        {"bf16, fp32; positions int32, int64", kRows, "[T, D] or [T, H, D], even R <= D", false,
         "positions checked against the table"}),
    row(kInvRopeFp8Quant, &cpu::inv_rope_fp8_quant,
        {"o bf16 -> fp8_e4m3 + ue8m0/fp32 scales", kRows, "block 64 or 128 dividing D", false,
         "bit-identical to CUDA"}),
    row(kQnormRopeKvInsert, &cpu::qnorm_rope_kv_insert,
        {"q, kv bf16; optional q_fp8 fp8_e4m3 (q_scale)", "caches: MODEL1_FP8, V32_FP8, BF16, FP8_PER_TENSOR", "D = the layout's dim",
         false, "slots and positions checked"}),
    row(kKvQuantize, &cpu::kv_quantize,
        {"values bf16, fp32", "caches: MODEL1_FP8, V32_FP8, BF16, FP8_PER_TENSOR", "D = the layout's dim",
         false, "host utility; slots checked and distinct"}),
    row(kKvDequantize, &cpu::kv_dequantize,
        {"out bf16, fp32", "caches: MODEL1_FP8, V32_FP8, BF16, FP8_PER_TENSOR", "D = the layout's dim",
         false, "host utility; slot -1 gives zeros"}),
    row(kDequantizeAndGather, &cpu::dequantize_and_gather,
        {"cache -> bf16 workspace", "caches: MODEL1_FP8, V32_FP8, BF16, FP8_PER_TENSOR",
         "any block size", false, "lengths and block tables checked"}),
    row(kSparsePrefill, &cpu::sparse_prefill,
        {"q, kv bf16; out bf16; lse, max_logits fp32", kRows, "d_qk 512 or 576, any d_v <= d_qk, any H, topk",
         false, "sink, topk_length"}),
    row(kSparseDecode, &cpu::sparse_decode,
        {"q bf16 or fp8_e4m3 (q_scale); out bf16; lse fp32", "caches: MODEL1_FP8, V32_FP8, BF16, FP8_PER_TENSOR; two scopes",
         "d_qk = the layout's dim, any d_v <= d_qk, any H", false,
         "sink, topk_length; indices checked"}),
    row(kSparseAttentionCombine, &cpu::sparse_attention_combine,
        {"partials fp32 -> out bf16, lse fp32", kRows, "any d_v, splits", false, "sink"}),
    row(kLocalToGlobalSlots, &cpu::local_to_global_slots,
        {"int32", "rows contiguous", "any block size", false, "invalid entries -> -1"}),
    row(kSwaWindowIndices, &cpu::swa_window_indices,
        {"int32 (positions int32, int64)", "rows contiguous", "any window, block size", false,
         "window blocks checked"}),
    row(kCombineTopkSwaIndices, &cpu::combine_topk_swa_indices,
        {"int32", "rows contiguous", "ratio 0, 4 or 128", false, "metadata and top-k checked"}),
    row(kIndexerQuery, &cpu::indexer_query_rows,
        {"qr, wq_b: bf16, fp32, fp8_e4m3 (+ scales); x, weights_proj: bf16, fp32", kRows,
         "head dim 128, any H_I", false, "projections through linear"}),
    row(kIndexerScores, &cpu::indexer_scores,
        {"q fp8_e4m3 + fp32 scales; scores fp32", "FP8 indexer key cache", "head dim 128, any H_I",
         false, "fixed summation order"}),
    row(kIndexerTopk, &cpu::indexer_topk,
        {"scores fp32 -> int32 indices", kRows, "any N, K", false,
         "ties -> lowest index; score or column order"}),
    row(kCompressedPrefixIndices, &cpu::compressed_prefix_indices,
        {"int32", kRows, "any ratio", false, ""}),
    row(kCompressorProject, &cpu::compressor_add_ape,
        {"x, wkv, wgate: bf16, fp32 (mixed allowed); rows fp32", kRows, "D 512 or 128, ratio 4 or 128",
         false, "projections through linear"}),
    row(kCompressorUpdateAndEmit, &cpu::compressor_update_and_emit,
        {"rows fp32; norm weight bf16, fp32",
         "outputs: MODEL1_FP8, BF16, FP8_PER_TENSOR caches or the FP8 indexer key cache",
         "D 512 or 128, ratio 4 or 128", false, "runs and slots checked"}),
    row(kSyntheticHidden, &cpu::synthetic_hidden,
        {"ids, positions int64 -> bf16, fp32", kRows, "any dim", false, "bit-identical to CUDA"}),
    row(kSparseMlaIndexerQuantize, &cpu::sparse_mla_indexer_quantize,
        {"x: bf16, fp32 -> fp8_e4m3 codes + fp32 power-of-two scales", kRows, "d 128, rope <= d",
         false, "V3.2 indexer queries (NeoX-style RoPE, Hadamard, FP8 per row)"}),
    row(kSparseMlaIndexerKeyInsert, &cpu::sparse_mla_indexer_key_insert,
        {"k, norm weight / bias: bf16, fp32", "FP8 indexer key cache", "d 128, rope <= d", false,
         "V3.2 indexer keys (LayerNorm, then the queries' row steps); slots checked"}),
};

}  // namespace

const BackendDecl& cpu_backend() {
  static const BackendDecl decl{"cpu",         "CPU", Device::cpu, "tensors in host memory",
                                /*dispatched_from_cpp=*/true, /*built=*/true, "", kRowsTable};
  return decl;
}

}  // namespace dsv4::ops

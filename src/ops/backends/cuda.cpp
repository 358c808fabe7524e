// The CUDA backend's table: the kernels and launchers of src/cuda/, one row per op with what each
// supports. Selected for tensors in CUDA device memory. Declared whether or not the build has
// CUDA, so `dsv4 info --ops` lists it either way; without CUDA its ops throw "not built".
#include "ops/backend.h"

#if defined(DSV4_WITH_CUDA)
#include "cuda/attention/sparse_decode.h"
#include "cuda/attention/sparse_prefill.h"
#include "cuda/common/synthetic_hidden.h"
#include "cuda/compressor/compressor.h"
#include "cuda/gemm/batched_linear.h"
#include "cuda/gemm/dequantize_fp8_blocks.h"
#include "cuda/gemm/grouped_wo_a.h"
#include "cuda/gemm/linear.h"
#include "cuda/index/indexing.h"
#include "cuda/indexer/indexer.h"
#include "cuda/indexer/sparse_mla_indexer.h"
#include "cuda/kv/dequantize_and_gather.h"
#include "cuda/kv/qnorm_rope_kv_insert.h"
#include "cuda/norm/rms_norm.h"
#include "cuda/oproj/inv_rope_fp8_quant.h"
#include "cuda/oproj/quantize_act_fp8.h"
#include "cuda/rope/apply_rope.h"
// A kernel's address where it is compiled; nullptr (the row is declared only) where it is not.
#define DSV4_CUDA_KERNEL(fn) (&(fn))
#else
#define DSV4_CUDA_KERNEL(fn) nullptr
#endif

namespace dsv4::ops {

namespace {

#if defined(DSV4_WITH_CUDA)
// The scores kernel with its default tiling (the launcher also takes a tiling for benchmarks).
void indexer_scores_default_tiling(const TensorView& q_fp8, const TensorView& q_scale,
                                   const TensorView& weights, const TensorView& positions,
                                   const TensorView& token_to_req, const IndexerKeyCacheView& keys,
                                   const TensorView& key_block_table, int ratio,
                                   const TensorView& scores, Stream stream) {
  cuda::indexer_scores(q_fp8, q_scale, weights, positions, token_to_req, keys, key_block_table,
                       ratio, scores, stream);
}
#endif

// Every CUDA kernel is launched on the caller's stream, allocates nothing, never synchronizes and
// reads no index value on the host (invalid ones are skipped as each op documents), so each may
// be captured into a CUDA graph; the cuBLASLt ops pick their plan on a shape's first call, so
// that call is made before capture.
constexpr const char* kRows16 = "last dim contiguous; 16-byte aligned rows";

const OpRow kRowsTable[] = {
    row(kLinear, DSV4_CUDA_KERNEL(cuda::linear),
        {"x, w both bf16 (y bf16, fp32), both fp32 (true fp32), or both fp8_e4m3 with fp32 "
         "1x128 / 128x128 scales in cuBLASLt's layouts (sm90)",
         "row-strided, rows not overlapping", "FP8: T a multiple of 4", true,
         "cuBLASLt; plan cached per shape (first call before capture)"}),
    row(kBatchedLinear, DSV4_CUDA_KERNEL(cuda::batched_linear),
        {"x, w both bf16 (y bf16, fp32) or both fp32 (true fp32)", "any strides, last dim contiguous",
         "any B, T, N, K", true, "one strided-batched cuBLASLt matmul; plan cached per shape"}),
    row(kGroupedWoA, DSV4_CUDA_KERNEL(cuda::grouped_wo_a),
        {"linear's dtype rules per group", "row-strided", "FP8: group width a multiple of 512",
         true, "bf16/fp32: one strided-batched matmul; FP8: one matmul per group"}),
    row(kQuantizeActFp8, DSV4_CUDA_KERNEL(cuda::quantize_act_fp8),
        {"x: bf16, fp32 -> fp8_e4m3 + ue8m0/fp32 scales", "row-strided", "block 64 or 128", true,
         "bit-identical to the CPU"}),
    row(kDequantizeFp8Blocks, DSV4_CUDA_KERNEL(cuda::dequantize_fp8_blocks),
        {"fp8_e4m3 + ue8m0/fp32 scales -> bf16, fp32", "row-strided", "[R, C] or [G, R, C]", true,
         "subnormal results flush to zero"}),
    row(kRmsNorm, DSV4_CUDA_KERNEL(cuda::rms_norm),
        {"bf16, fp32", "row-strided", "any D", true, "in place allowed; bit-identical to the CPU"}),
    row(kFusedQkvRmsNorm, DSV4_CUDA_KERNEL(cuda::fused_qkv_rms_norm),
        {"bf16, fp32 (+ fp8_e4m3 q output)", "row-strided", "any q_lora, D", true,
         "bit-identical to the CPU"}),
    row(kResidualAddRmsNorm, DSV4_CUDA_KERNEL(cuda::residual_add_rms_norm),
        {"residual fp32; delta, weight, y: bf16, fp32", "row-strided", "any D", true,
         "bit-identical to the CPU"}),
    row(kApplyRope, DSV4_CUDA_KERNEL(cuda::apply_rope),
        {"bf16, fp32; positions int32, int64", "row-strided", "[T, D] or [T, H, D]", true,
         "rows with an out-of-table position left unwritten"}),
    row(kInvRopeFp8Quant, DSV4_CUDA_KERNEL(cuda::inv_rope_fp8_quant),
        {"o bf16 -> fp8_e4m3 + ue8m0/fp32 scales", kRows16, "block 64 or 128 dividing D", true,
         "bit-identical to the CPU"}),
    row(kQnormRopeKvInsert, DSV4_CUDA_KERNEL(cuda::qnorm_rope_kv_insert),
        {"q, kv bf16; optional q_fp8 fp8_e4m3 (q_scale)", "caches: MODEL1_FP8, V32_FP8, BF16, FP8_PER_TENSOR",
         "D = the layout's dim", true, "slot outside the cache acts as -1"}),
    row(kDequantizeAndGather, DSV4_CUDA_KERNEL(cuda::dequantize_and_gather),
        {"cache -> bf16 workspace", "caches: MODEL1_FP8, V32_FP8, BF16, FP8_PER_TENSOR",
         "any block size", true, "invalid rows skipped"}),
    row(kSparsePrefill, DSV4_CUDA_KERNEL(cuda::sparse_prefill),
        {"q, kv bf16; out bf16; lse, max_logits fp32", kRows16, "d_qk 512 or 576, d_v 512, any H",
         true, "sm90a (CuTe, WGMMA); sink, topk_length"}),
    row(kSparseDecode, DSV4_CUDA_KERNEL(cuda::sparse_decode),
        {"q bf16 or fp8_e4m3 (q_scale); out bf16; lse fp32", "caches: MODEL1_FP8, BF16, FP8_PER_TENSOR (d_qk 512), V32_FP8 (576); two scopes",
         "d_v 512, heads in groups of 64", true, "sm90a; split-KV + combine, fused dequant (BF16 without a cluster: cp.async)"}),
    row(kSparseAttentionCombine, DSV4_CUDA_KERNEL(cuda::sparse_attention_combine),
        {"partials fp32 -> out bf16, lse fp32", kRows16, "d_v 512", true, "sink"}),
    row(kLocalToGlobalSlots, DSV4_CUDA_KERNEL(cuda::local_to_global_slots),
        {"int32", "rows contiguous", "any block size", true, "invalid entries -> -1"}),
    row(kSwaWindowIndices, DSV4_CUDA_KERNEL(cuda::swa_window_indices),
        {"int32 (positions int32, int64)", "rows contiguous", "any window, block size", true,
         "unmapped blocks -> -1"}),
    row(kCombineTopkSwaIndices, DSV4_CUDA_KERNEL(cuda::combine_topk_swa_indices),
        {"int32", "rows contiguous", "ratio 0, 4 or 128", true, "invalid entries -> -1"}),
    row(kIndexerQuery, DSV4_CUDA_KERNEL(cuda::indexer_query_rows),
        {"qr, wq_b: linear's CUDA rules; x, weights_proj: bf16, fp32", "row-strided; workspace",
         "head dim 128, any H_I", true, "projections through linear, q in the caller's workspace"}),
    row(kIndexerScores, DSV4_CUDA_KERNEL(indexer_scores_default_tiling),
        {"q fp8_e4m3 + fp32 scales; scores fp32", "FP8 indexer key cache (4-byte aligned)",
         "head dim 128; H_I 64, 128 or 256", true, "tensor-core sums (tolerance in indexer.h)"}),
    row(kIndexerTopk, DSV4_CUDA_KERNEL(cuda::indexer_topk),
        {"scores fp32 -> int32 indices", "row-strided", "any N, K", true,
         "ties -> lowest index; column order: no sort"}),
    row(kCompressedPrefixIndices, DSV4_CUDA_KERNEL(cuda::compressed_prefix_indices),
        {"int32", "row-strided", "any ratio", true, ""}),
    row(kCompressorProject, DSV4_CUDA_KERNEL(cuda::compressor_add_ape),
        {"x, wkv, wgate: one dtype (bf16 or fp32); rows fp32", "row-strided, rows not overlapping",
         "D 512 or 128, ratio 4 or 128", true, "projections through linear"}),
    row(kCompressorUpdateAndEmit, DSV4_CUDA_KERNEL(cuda::compressor_update_and_emit),
        {"rows fp32; norm weight bf16, fp32",
         "outputs: MODEL1_FP8, BF16, FP8_PER_TENSOR caches or the FP8 indexer key cache",
         "D 512 or 128, ratio 4 or 128", true, "entries bit-identical to the CPU"}),
    row(kSyntheticHidden, DSV4_CUDA_KERNEL(cuda::synthetic_hidden),
        {"ids, positions int64 -> bf16, fp32", "row-strided", "any dim", true,
         "bit-identical to the CPU"}),
    row(kSparseMlaIndexerQuantize, DSV4_CUDA_KERNEL(cuda::sparse_mla_indexer_quantize),
        {"x: bf16, fp32 -> fp8_e4m3 codes + fp32 power-of-two scales", "row-strided",
         "d 128, rope <= d", false,
         "bit-identical to the CPU; a position outside the table: zero codes, NaN scale"}),
    row(kSparseMlaIndexerKeyInsert, DSV4_CUDA_KERNEL(cuda::sparse_mla_indexer_key_insert),
        {"k, norm weight / bias: bf16, fp32", "FP8 indexer key cache (4-byte aligned)",
         "d 128, rope <= d", false,
         "bit-identical to the CPU; keys with slot -1, outside the cache or the table not stored"}),
};

}  // namespace

const BackendDecl& cuda_backend() {
#if defined(DSV4_WITH_CUDA)
  constexpr bool kBuilt = true;
#else
  constexpr bool kBuilt = false;
#endif
  static const BackendDecl decl{"cuda",
                                "CUDA",
                                Device::cuda,
                                "tensors in CUDA device memory",
                                /*dispatched_from_cpp=*/true,
                                kBuilt,
                                "configure with DSV4_CUDA=ON on a machine with nvcc",
                                kRowsTable};
  return decl;
}

}  // namespace dsv4::ops

// The Triton backend's table: the portable GPU kernels of the Python package
// (python/dsv4attn/triton/, registered in its registry.py under these op names). The C++ front
// doors never dispatch to it — a caller selects it in Python (backend="triton" or
// DSV4_BACKEND=triton) — so its rows declare features only, for `dsv4 info --ops`.
#include "ops/backend.h"

namespace dsv4::ops {

namespace {

// Every Triton op runs on the tensors' GPU stream (CUDA or ROCm; CPU tensors under Triton's
// interpreter), reads no index value on the host, and matches the CPU reference within the
// tolerances of tests/python/test_triton_*.py (not bit for bit). Graph capture is not declared:
// Triton's first launch of a shape compiles and autotunes.
constexpr const char* kGpus = "sm80+, gfx942 (MI300), XPU where Triton runs";

const OpRow kRowsTable[] = {
    row(kLinear, nullptr,
        {"bf16, fp32; fp8_e4m3 + scales dequantized to bf16 first", "row-strided", "any", false,
         "torch GEMM (cuBLAS / hipBLASLt)"}),
    row(kGroupedWoA, nullptr,
        {"bf16, fp32; fp8_e4m3 + scales dequantized", "row-strided", "any G", false,
         "one batched torch GEMM"}),
    row(kQuantizeActFp8, nullptr,
        {"bf16, fp32 -> fp8_e4m3 + ue8m0/fp32 scales", "row-strided", "block 64 or 128", false,
         kGpus}),
    row(kDequantizeFp8Blocks, nullptr,
        {"fp8_e4m3 + ue8m0/fp32 scales -> bf16, fp32", "row-strided", "weights 128x128, activations 1x128",
         false, kGpus}),
    row(kRmsNorm, nullptr, {"bf16, fp32", "row-strided", "any D", false, "in place allowed"}),
    row(kFusedQkvRmsNorm, nullptr, {"bf16, fp32", "row-strided", "any q_lora, D", false, kGpus}),
    row(kApplyRope, nullptr,
        {"bf16, fp32; positions int32, int64", "row-strided", "[T, D] or [T, H, D]", false, kGpus}),
    row(kInvRopeFp8Quant, nullptr,
        {"o bf16 -> fp8_e4m3 + ue8m0/fp32 scales", "row-strided", "block 64 or 128", false, kGpus}),
    row(kQnormRopeKvInsert, nullptr,
        {"q, kv bf16", "caches: MODEL1_FP8, V32_FP8, BF16, FP8_PER_TENSOR", "D = the layout's dim",
         false, kGpus}),
    row(kKvDequantize, nullptr,
        {"out fp32", "caches: MODEL1_FP8, V32_FP8, BF16, FP8_PER_TENSOR", "D = the layout's dim",
         false, "slot -1 or outside the cache gives zeros"}),
    row(kDequantizeAndGather, nullptr,
        {"cache -> bf16 workspace", "caches: MODEL1_FP8, V32_FP8, BF16, FP8_PER_TENSOR",
         "any block size", false, kGpus}),
    row(kSparsePrefill, nullptr,
        {"q, kv bf16; out bf16; lse, max_logits fp32", "row-strided", "d_qk 512 or 576, any H",
         false, "sink, topk_length"}),
    row(kSparseDecode, nullptr,
        {"q bf16; out bf16; lse fp32", "caches: MODEL1_FP8, V32_FP8, BF16, FP8_PER_TENSOR; two scopes",
         "any H", false, "split-KV with fused dequant + combine"}),
    row(kSparseAttentionCombine, nullptr,
        {"partials fp32 -> out bf16, lse fp32", "row-strided", "any d_v", false, "sink"}),
    row(kLocalToGlobalSlots, nullptr,
        {"int32", "rows contiguous", "any block size", false, "invalid entries -> -1"}),
    row(kSwaWindowIndices, nullptr,
        {"int32 (positions int32, int64)", "rows contiguous", "any window", false,
         "unmapped blocks -> -1"}),
    row(kCombineTopkSwaIndices, nullptr,
        {"int32", "rows contiguous", "ratio 0, 4 or 128", false, "invalid entries -> -1"}),
    row(kIndexerQuery, nullptr,
        {"bf16, fp32; fp8_e4m3 + scales", "row-strided", "head dim 128", false,
         "torch GEMMs, then RoPE + Hadamard + FP8 per head"}),
    row(kIndexerScores, nullptr,
        {"q fp8_e4m3 + fp32 scales; scores fp32", "FP8 indexer key cache", "head dim 128", false,
         kGpus}),
    row(kIndexerTopk, nullptr,
        {"scores fp32 -> int32 indices", "row-strided", "any N, K", false, "ties -> lowest index"}),
    row(kCompressedPrefixIndices, nullptr, {"int32", "row-strided", "any ratio", false, kGpus}),
    row(kCompressorProject, nullptr,
        {"bf16, fp32; rows fp32", "row-strided", "D 512 or 128, ratio 4 or 128", false,
         "torch GEMMs + the ape bias"}),
    row(kCompressorUpdateAndEmit, nullptr,
        {"rows fp32; norm weight bf16, fp32",
         "outputs: MODEL1_FP8, BF16, FP8_PER_TENSOR caches or the FP8 indexer key cache",
         "D 512 or 128, ratio 4 or 128", false, kGpus}),
};

}  // namespace

const BackendDecl& triton_backend() {
  static const BackendDecl decl{"triton",
                                "Triton",
                                Device::cuda,
                                "Python: backend=\"triton\" or DSV4_BACKEND=triton",
                                /*dispatched_from_cpp=*/false,
                                /*built=*/true,
                                "",
                                kRowsTable};
  return decl;
}

}  // namespace dsv4::ops

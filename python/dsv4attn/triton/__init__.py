"""dsv4attn.triton: the portable GPU backend, in Triton, for GPUs the Hopper kernels do not cover
(A100, L40S, RTX, Blackwell, AMD MI300 via ROCm, Intel XPU where Triton runs), and selectable on
any GPU (`DSV4_BACKEND=triton`, or `dsv4attn.Attention(..., backend="triton")`).

One module per kernel family; every op is registered in `registry` under the name (and, where
one exists, the signature) of its `torch.ops.dsv4` twin, so a caller can dispatch by name:

    kv_cache        dequantize_and_gather, kv_dequantize (+ the fused KV loads of every layout)
    kv_insert       qnorm_rope_kv_insert
    sparse_prefill  sparse_prefill
    sparse_decode   sparse_decode, sparse_attention_combine
    norm_rope       rms_norm, fused_qkv_rms_norm, apply_rope
    act_quant       quantize_act_fp8, inv_rope_fp8_quant, dequantize_fp8_blocks
    compressor      compressor_project (GEMMs via torch), compressor_update_and_emit
    indexer         indexer_query (GEMMs via torch), indexer_scores, indexer_topk,
                    compressed_prefix_indices
    indexing        local_to_global_slots, swa_window_indices, combine_topk_swa_indices
    gemm            linear, grouped_wo_a (torch: cuBLAS / hipBLASLt)
    layer           TritonAttention: the whole layer step on these ops

Tensors live on a GPU (CUDA or ROCm device); CPU tensors run under Triton's interpreter
(TRITON_INTERPRET=1, set before this package is imported), which the CPU tests use. The
backend never reads index values on the host: data the CPU reference rejects is treated as
invalid, as the CUDA backend does (ops.h). Results match the CPU reference within the
tolerances stated per op in tests/python/test_triton_*.py, not bit for bit (fp32 sums in a
different order, bf16 softmax weights in P.V).
"""
from . import registry
from .registry import get, rows

# Importing the op modules registers their ops.
from . import (  # noqa: E402,F401
    act_quant, compressor, gemm, indexer, indexing, kv_cache, kv_insert, norm_rope,
    sparse_decode, sparse_prefill)

__all__ = ["get", "registry", "rows"]

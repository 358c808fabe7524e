"""vLLM's DeepSeek-V4 attention ops, with vLLM's names, signatures and semantics, on dsv4attn.

    fused_q_kv_rmsnorm                                   -> (qr, kv) RMS-normed copies
    fused_deepseek_v4_qnorm_rope_kv_rope_quant_insert    q in place; kv unchanged; cache written
    dequantize_and_gather_k_cache                        paged MODEL1 cache -> bf16 workspace
    combine_topk_swa_indices                             -> (combined_indices, combined_lens)
    compute_global_topk_indices_and_lens                 -> (global_indices, topk_lens)
    fused_inv_rope_fp8_quant                             -> (o_fp8 [T, G, D], o_scale [T, G, D/128])
    deepseek_v4_fp8_einsum                               z[t, g] = o_g · wo_a_gᵀ (FP8 blocks)
    DeepseekCompressor, Indexer (vllm_modules.py)        vLLM's modules; caches written in place

Differences from vLLM, by design: tensors may be CPU tensors (the reference backend); the
UE8M0 scale floor is docs/spec.md §7's max(amax / 448, 1e-4) (vLLM's Triton kernel floors amax at 1e-10;
the two agree whenever a block's amax >= 0.0448); outputs are contiguous where vLLM returns
transposed views of TMA-friendly buffers (same shapes, same values), except
fused_inv_rope_fp8_quant's scales, which are such a transposed view (the CUDA FP8 GEMMs' layout).
The index utilities
(combine_topk_swa_indices, compute_global_topk_indices_and_lens) run the C++ ops on either
device: on CPU tensors they validate every index value (include/dsv4/indexing.h); on CUDA
tensors the kernels read no value on the host (no synchronization, CUDA-graph capturable) and
turn what the CPU rejects into -1 entries (length 0 rows for bad request metadata) instead. The FP8 einsum
runs on CUDA as block-scaled FP8 cuBLASLt GEMMs (one per group).
Paged caches are MODEL1_FP8 byte caches: [num_blocks, block_bytes] or FlashMLA's
[num_blocks, block_size, 584] view whose block stride is the padded MODEL1 block size.
"""
from __future__ import annotations

from typing import Optional, Tuple

import torch

from . import Error
from . import ops  # the torch.ops.dsv4.* ops, called through their fast callers (ops._fast_caller)
from ._args import INT32_MAX, float_arg, int_arg, optional_tensor_arg, tensor_arg
from .flash_mla import block_bytes_view, kv_cache_block_bytes

__all__ = [
    "CompressorMetadata", "DeepseekCompressor", "Indexer",
    "combine_topk_swa_indices", "compute_global_topk_indices_and_lens", "deepseek_v4_fp8_einsum",
    "dequantize_and_gather_k_cache", "fused_deepseek_v4_qnorm_rope_kv_rope_quant_insert",
    "fused_inv_rope_fp8_quant", "fused_q_kv_rmsnorm",
]

_LAYOUT = "model1_fp8"
_MODEL1_TOKEN_BYTES = 584


def _model1_blocks(where: str, k_cache: torch.Tensor, block_size: int) -> torch.Tensor:
    """uint8 [num_blocks, block_bytes] of a MODEL1 cache given 2-d, 3-d or 4-d.

    The C++ ops get the blocks as a dense [num_blocks, block_bytes] byte view of the same memory,
    so each block of the given view must be that memory: its block dims dense (a strided view
    such as big[:, ::2] would hand the op bytes outside it) and blocks block_bytes apart."""
    k_cache = tensor_arg(where, "k_cache", k_cache)
    if k_cache.dtype not in (torch.uint8, torch.int8, torch.float8_e4m3fn):
        raise Error(f"{where}: k_cache.dtype: expected uint8 (MODEL1_FP8 bytes), "
                    f"got {k_cache.dtype}")
    block_bytes = kv_cache_block_bytes(_LAYOUT, block_size)
    shape = list(k_cache.shape)
    if k_cache.dim() == 2:
        # vLLM's kv_cache.view(num_blocks, -1) has B * 584 columns (the padding lies beyond the
        # view, inside the row stride); a packed byte cache has the whole padded block.
        width = shape[1] if shape[1] in (block_bytes, block_size * _MODEL1_TOKEN_BYTES) else None
        expected_shape, dense_strides = [shape[0], width], [1]
    elif k_cache.dim() in (3, 4):
        expected_shape = [shape[0], block_size] + [1] * (k_cache.dim() - 3) + [_MODEL1_TOKEN_BYTES]
        dense_strides = [_MODEL1_TOKEN_BYTES] + [_MODEL1_TOKEN_BYTES] * (k_cache.dim() - 3) + [1]
    else:
        expected_shape, dense_strides = None, []
    if shape != expected_shape:
        raise Error(f"{where}: k_cache.shape: expected [num_blocks, {block_bytes}], "
                    f"[num_blocks, {block_size * _MODEL1_TOKEN_BYTES}] or "
                    f"[num_blocks, {block_size}, (1,) {_MODEL1_TOKEN_BYTES}], got {shape}")
    for d, want in enumerate(dense_strides, start=1):
        if shape[d] > 1 and k_cache.stride(d) != want:
            raise Error(f"{where}: k_cache.stride({d}): expected {want} (each block's bytes "
                        f"dense), got {k_cache.stride(d)} (strides {tuple(k_cache.stride())})")
    # The block stride is free (vLLM pads pages) as long as it holds a block and keeps rows
    # 16-byte aligned.
    block_stride = k_cache.stride(0) if k_cache.shape[0] > 1 else block_bytes
    if block_stride < block_bytes or block_stride % 16 != 0:
        raise Error(f"{where}: k_cache.stride(0): expected a block stride >= {block_bytes} (the "
                    f"MODEL1_FP8 block at block_size {block_size}) and a multiple of 16, "
                    f"got {k_cache.stride(0)}")
    return block_bytes_view(where, k_cache.view(torch.uint8), k_cache.shape[0], block_bytes,
                            block_stride)


def fused_q_kv_rmsnorm(qr: torch.Tensor, kv: torch.Tensor, q_weight: torch.Tensor,
                       kv_weight: torch.Tensor, eps: float) -> Tuple[torch.Tensor, torch.Tensor]:
    """(RMSNorm(qr; q_weight), RMSNorm(kv; kv_weight)), new tensors of the inputs' dtypes."""
    where = "fused_q_kv_rmsnorm"
    qr, kv = tensor_arg(where, "qr", qr), tensor_arg(where, "kv", kv)
    eps = float_arg(where, "eps", eps)
    q_out, kv_out = torch.empty_like(qr), torch.empty_like(kv)
    ops.fused_qkv_rms_norm(qr, q_weight, kv, kv_weight, eps, q_out, kv_out)
    return q_out, kv_out


def fused_deepseek_v4_qnorm_rope_kv_rope_quant_insert(
    q: torch.Tensor, kv: torch.Tensor, swa_kv_cache_2d: torch.Tensor, slot_mapping: torch.Tensor,
    positions: torch.Tensor, cos_sin_cache: torch.Tensor, eps: float, block_size: int,
) -> None:
    """q [T, H, D] bf16 in place: per-head RMSNorm (no weight) + GPT-J RoPE on the last R dims.
    kv [T, D] bf16: RoPE'd, FP8-quantized (UE8M0, MODEL1_FP8) and written to the paged cache at
    slot_mapping[t] (-1 = skip); kv itself is left unchanged (vLLM reads it only via the cache).
    cos_sin_cache: [max_pos, R] cos || sin (converted to fp32 if given in another dtype)."""
    where = "fused_deepseek_v4_qnorm_rope_kv_rope_quant_insert"
    kv = tensor_arg(where, "kv", kv)
    cos_sin_cache = tensor_arg(where, "cos_sin_cache", cos_sin_cache)
    eps = float_arg(where, "eps", eps)
    block_size = int_arg(where, "block_size", block_size, 1, INT32_MAX)
    if cos_sin_cache.dtype != torch.float32:
        cos_sin_cache = cos_sin_cache.float()
    cache = _model1_blocks(where, swa_kv_cache_2d, block_size)
    kv_scratch = kv.clone()  # the C++ op overwrites kv with the cached values; vLLM's doesn't
    # q, positions and slot_mapping go to the op as given: it rejects any of them inside memory
    # it writes (q, the cache) before writing.
    ops.qnorm_rope_kv_insert(q, kv_scratch, positions, cos_sin_cache, eps, cache,
                             _LAYOUT, block_size, 1.0, slot_mapping)


def dequantize_and_gather_k_cache(
    out: torch.Tensor, k_cache: torch.Tensor, seq_lens: torch.Tensor,
    gather_lens: Optional[torch.Tensor], block_table: torch.Tensor, block_size: int, offset: int,
) -> None:
    """For request r: entries [seq_lens[r] - g, seq_lens[r]) (g = gather_lens[r], or seq_lens[r]
    when None) of its paged cache, dequantized to bf16 into out[r, offset : offset + g].
    out [num_reqs, M, 512] bf16; block_table [num_reqs, max_blocks] int32; seq_lens int32."""
    where = "dequantize_and_gather_k_cache"
    block_size = int_arg(where, "block_size", block_size, 1, INT32_MAX)
    offset = int_arg(where, "offset", offset)
    cache = _model1_blocks(where, k_cache, block_size)
    ops.dequantize_and_gather(cache, _LAYOUT, block_size, 1.0, block_table,
                              seq_lens, gather_lens, offset, out)


def combine_topk_swa_indices(
    topk_indices: torch.Tensor, query_start_loc: torch.Tensor, seq_lens: torch.Tensor,
    gather_lens: torch.Tensor, window_size: int, compress_ratio: int, topk: int, M: int, N: int,
) -> Tuple[torch.Tensor, torch.Tensor]:
    """Indices into the prefill gather workspace (rows [r*M, (r+1)*M) per request: N compressed
    entries, then the gathered SWA tokens): each token's first `topk` request-local compressed
    indices, then its SWA window, packed and -1 padded. Returns (combined_indices
    [T, topk + window_size] int32, combined_lens [T] int32)."""
    # Scalars and shapes first (both paths; the CUDA one runs unchecked torch ops): nothing is
    # sliced or allocated from an unchecked value.
    where = "combine_topk_swa_indices"
    topk_indices = tensor_arg(where, "topk_indices", topk_indices)
    query_start_loc = tensor_arg(where, "query_start_loc", query_start_loc)
    if topk_indices.dim() != 2:
        raise Error(f"{where}: topk_indices.ndim: expected 2 ([T, K]), got {topk_indices.dim()}")
    T = topk_indices.shape[0]
    window_size = int_arg(where, "window_size", window_size, 1, INT32_MAX)
    compress_ratio = int_arg(where, "compress_ratio", compress_ratio, 0, INT32_MAX)
    topk = int_arg(where, "topk", topk, 0, topk_indices.shape[1])
    N = int_arg(where, "N", N, 0, INT32_MAX)
    M = int_arg(where, "M", M, 0)
    requests = max(query_start_loc.shape[0] - 1, 0) if query_start_loc.dim() == 1 else 0
    if requests * M > INT32_MAX:  # (Python ints: exact) every written row index is an int32
        raise Error(f"{where}: M: {requests} requests x {M} rows exceed the int32 index range")
    topk_cols = topk_indices[:, :topk] if topk > 0 else topk_indices.new_empty((T, 0))
    out = torch.empty((T, topk + window_size), dtype=torch.int32, device=topk_indices.device)
    lens = torch.empty((T,), dtype=torch.int32, device=topk_indices.device)
    ratio = compress_ratio if compress_ratio > 1 else 0  # vLLM writes 1 for SWA-only layers
    ops.combine_topk_swa_indices(topk_cols, query_start_loc, seq_lens, gather_lens,
                                 window_size, N, M, ratio, out, lens)
    return out, lens


def compute_global_topk_indices_and_lens(
    topk_indices: torch.Tensor, token_to_req_indices: torch.Tensor, block_table: torch.Tensor,
    block_size: int, is_valid_token: Optional[torch.Tensor] = None,
) -> Tuple[torch.Tensor, torch.Tensor]:
    """Request-local compressed entry numbers -> global cache slots
    (block_table[req][i // B] * B + i % B; -1 and entries beyond the table stay -1), and the
    number of valid slots per token. Tokens with is_valid_token False get all -1 and length 0."""
    where = "compute_global_topk_indices_and_lens"
    topk_indices = tensor_arg(where, "topk_indices", topk_indices)
    block_size = int_arg(where, "block_size", block_size, 1, INT32_MAX)
    is_valid_token = optional_tensor_arg(where, "is_valid_token", is_valid_token)
    global_indices = torch.empty_like(topk_indices, dtype=torch.int32)
    lens = torch.empty((topk_indices.shape[0],), dtype=torch.int32, device=topk_indices.device)
    ops.local_to_global_slots(topk_indices, token_to_req_indices, block_table,
                              block_size, global_indices, lens, False)
    if is_valid_token is not None:
        valid = is_valid_token.to(torch.bool)
        global_indices = torch.where(valid[:, None], global_indices,
                                     torch.full_like(global_indices, -1))
        lens = torch.where(valid, lens, torch.zeros_like(lens))
    return global_indices, lens


def fused_inv_rope_fp8_quant(
    o: torch.Tensor, positions: torch.Tensor, cos_sin_cache: torch.Tensor, n_groups: int,
    heads_per_group: int, nope_dim: int = 448, rope_dim: int = 64, quant_group_size: int = 128,
    tma_aligned_scales: bool = False,
) -> Tuple[torch.Tensor, torch.Tensor]:
    """Inverse RoPE on the last rope_dim dims of each head of o [T, H, D] (bf16, rounded back to
    bf16), then FP8 e4m3 quantization in blocks of quant_group_size with UE8M0 (power-of-two)
    scales, grouped for the wo_a einsum — one pass over o (torch.ops.dsv4.inv_rope_fp8_quant).
    Returns o_fp8 [T, n_groups, heads_per_group * D] float8_e4m3fn and o_scale
    [T, n_groups, heads_per_group * D / quant_group_size] fp32, a transposed view of a
    contiguous [H * D / quant_group_size, T] buffer as vLLM returns it (the layout the CUDA FP8
    GEMMs take); tma_aligned_scales: int32 with 4 UE8M0 bytes packed per element, little-endian,
    SM100's format."""
    where = "fused_inv_rope_fp8_quant"
    o = tensor_arg(where, "o", o)
    cos_sin_cache = tensor_arg(where, "cos_sin_cache", cos_sin_cache)
    n_groups = int_arg(where, "n_groups", n_groups, 1, INT32_MAX)
    heads_per_group = int_arg(where, "heads_per_group", heads_per_group, 1, INT32_MAX)
    nope_dim = int_arg(where, "nope_dim", nope_dim, 0, INT32_MAX)
    rope_dim = int_arg(where, "rope_dim", rope_dim, 0, INT32_MAX)
    quant_group_size = int_arg(where, "quant_group_size", quant_group_size)
    if o.dim() != 3:
        raise Error(f"{where}: o.ndim: expected 3 ([T, H, D]), got {o.dim()}")
    T, H, D = o.shape
    if H != n_groups * heads_per_group:
        raise Error(f"{where}: o.shape[1]: expected n_groups * heads_per_group = "
                    f"{n_groups * heads_per_group}, got {H}")
    if D != nope_dim + rope_dim or cos_sin_cache.shape[-1] != rope_dim:
        raise Error(f"{where}: head dims: expected D = nope_dim + rope_dim = "
                    f"{nope_dim + rope_dim} and cos_sin_cache.shape[-1] = {rope_dim}, "
                    f"got D = {D}, cos_sin_cache.shape[-1] = {cos_sin_cache.shape[-1]}")
    if quant_group_size not in (64, 128) or D % quant_group_size:
        raise Error(f"{where}: quant_group_size: expected 64 or 128 dividing D = {D}, "
                    f"got {quant_group_size}")
    if cos_sin_cache.dtype != torch.float32:
        cos_sin_cache = cos_sin_cache.float()
    blocks = H * D // quant_group_size
    o_fp8 = torch.empty((T, H * D), dtype=torch.float8_e4m3fn, device=o.device)
    scale = torch.empty((blocks, T), dtype=torch.float32, device=o.device).t()
    ops.inv_rope_fp8_quant(o, positions, cos_sin_cache, int(quant_group_size), o_fp8,
                           scale)
    d = heads_per_group * D
    o_fp8 = o_fp8.view(T, n_groups, d)
    scale = scale.view(T, n_groups, d // quant_group_size)
    if tma_aligned_scales:
        scale = _pack_ue8m0(scale.contiguous())
    return o_fp8, scale


def _pack_ue8m0(scale: torch.Tensor) -> torch.Tensor:
    """fp32 powers of two [..., n] -> int32 [..., ceil(n / 4)] of their UE8M0 bytes, 4 per int."""
    exponent_bytes = (scale.view(torch.int32) >> 23) & 0xFF
    n = exponent_bytes.shape[-1]
    pad = (-n) % 4
    if pad:
        exponent_bytes = torch.nn.functional.pad(exponent_bytes, (0, pad))
    grouped = exponent_bytes.view(*exponent_bytes.shape[:-1], -1, 4)
    shifts = torch.tensor([0, 8, 16, 24], dtype=torch.int32, device=scale.device)
    return (grouped << shifts).sum(-1, dtype=torch.int32)


def deepseek_v4_fp8_einsum(o_fp8: torch.Tensor, o_scale: torch.Tensor, wo_a: torch.Tensor,
                           wo_a_scale: torch.Tensor, z: torch.Tensor,
                           equation: str = "bhr,hdr->bhd", recipe=None) -> None:
    """vLLM's grouped wo_a GEMM: z[t, g, :] = (o_fp8[t, g] · o_scale) · (wo_a_g · wo_a_scale)ᵀ.

    o_fp8 [T, G, Dg] float8_e4m3fn with o_scale [T, G, Dg/128] fp32 (fused_inv_rope_fp8_quant's
    outputs); wo_a [G*L, Dg] (or [G, L, Dg]) float8_e4m3fn with wo_a_scale [G*L/128, Dg/128]
    (or [G, L/128, Dg/128]) fp32 or UE8M0 (the checkpoint's weight_scale_inv); z [T, G, L]
    bf16/fp32, written in place. `recipe` (DeepGEMM's scale granularity) is accepted and ignored:
    only fp32/UE8M0 scales per 1x128 (activations) and 128x128 (weights) blocks are taken."""
    where = "deepseek_v4_fp8_einsum"
    o_fp8, o_scale = tensor_arg(where, "o_fp8", o_fp8), tensor_arg(where, "o_scale", o_scale)
    wo_a, wo_a_scale = tensor_arg(where, "wo_a", wo_a), tensor_arg(where, "wo_a_scale", wo_a_scale)
    z = tensor_arg(where, "z", z)
    if not isinstance(equation, str) or equation.replace(" ", "") != "bhr,hdr->bhd":
        raise Error(f"deepseek_v4_fp8_einsum: equation: expected 'bhr,hdr->bhd', got {equation!r}")
    if o_fp8.dim() != 3 or z.dim() != 3:
        raise Error(f"deepseek_v4_fp8_einsum: o_fp8 / z: expected [T, G, Dg] / [T, G, L], got "
                    f"{list(o_fp8.shape)} / {list(z.shape)}")
    T, G, Dg = o_fp8.shape
    L = z.shape[2]
    if list(wo_a.shape) not in ([G * L, Dg], [G, L, Dg]):
        raise Error(f"{where}: wo_a.shape: expected [{G * L}, {Dg}] or [{G}, {L}, {Dg}] (from "
                    f"o_fp8 and z), got {list(wo_a.shape)}")
    if wo_a_scale.dim() not in (2, 3) or (wo_a_scale.dim() == 2 and wo_a_scale.shape[0] % G):
        raise Error(f"{where}: wo_a_scale.shape: expected [G * L / 128, Dg / 128] or "
                    f"[G, L / 128, Dg / 128] with G = {G}, got {list(wo_a_scale.shape)}")
    w = wo_a.view(G, L, Dg) if wo_a.dim() == 2 else wo_a
    ws = wo_a_scale.view(G, -1, wo_a_scale.shape[-1]) if wo_a_scale.dim() == 2 else wo_a_scale
    z_flat = z if z.is_contiguous() else torch.empty(z.shape, dtype=z.dtype, device=z.device)
    o2, o2_scale = o_fp8.reshape(T, G * Dg), o_scale.reshape(T, -1)
    if o_fp8.device.type == "cuda":
        # The CUDA FP8 GEMMs take fp32 scales in cuBLASLt's layouts: activation scales as the
        # transpose of a contiguous [blocks, T] buffer (what fused_inv_rope_fp8_quant returns),
        # weight scales with rows padded to a multiple of 4 (converted here; a serving engine
        # does it once at load).
        # Rows come in multiples of 4 there (kFp8GemmRowMultiple: cuBLASLt reads the activation
        # scales' rows 16-byte aligned): vLLM's token counts are any, so a ragged T is padded
        # with zero rows (scale 1) whose outputs are dropped.
        Tp = -(-T // 4) * 4
        if Tp != T:
            codes = o2.view(torch.uint8)  # fp8 through its bytes: cat need not know the dtype
            o2 = torch.cat([codes, codes.new_zeros(Tp - T, codes.shape[1])]).view(o2.dtype)
            o2_scale = torch.cat([o2_scale.float(), o2_scale.new_ones(Tp - T, o2_scale.shape[1],
                                                                      dtype=torch.float32)])
        if o2_scale.stride() != (1, Tp) and Tp > 1:
            o2_scale = o2_scale.t().contiguous().t()
        ws32 = ws.float()
        pad = (-ws32.shape[-1]) % 4
        ws_padded = torch.nn.functional.pad(ws32, (0, pad), value=1.0)[..., :ws32.shape[-1]]
        z_rows = z_flat.view(T, G * L) if Tp == T else \
            torch.empty(Tp, G * L, dtype=z.dtype, device=z.device)
        ops.grouped_wo_a(o2, o2_scale.float(), w, ws_padded, z_rows)
        if z_rows.shape[0] != T:
            z_flat.view(T, G * L).copy_(z_rows[:T])
    else:
        ops.grouped_wo_a(o2, o2_scale, w, ws, z_flat.view(T, G * L))
    if z_flat is not z:
        z.copy_(z_flat)


# vLLM's compressor and indexer modules (they use _model1_blocks above, imported lazily).
from .vllm_modules import CompressorMetadata, DeepseekCompressor, Indexer  # noqa: E402

"""Which compressed entries a query sees (include/dsv4/indexer.h, docs/spec.md §5), on the Triton
backend: the C4A lightning indexer (queries, scores, top-k) and the C128A prefix plan.

  indexer_query : q_I = qr wq_b^T and w = x weights_proj^T through torch GEMMs, then per
                  (token, head) RoPE on the last 64 dims, Hadamard rotation, FP8 with one
                  power-of-two scale; w *= 128^-0.5 * H_I^-0.5.
  indexer_scores: score_j = sum_h w_h * ReLU(q_h . k_j * q_scale_h * k_scale_j) over the
                  request's indexer keys (fp8 codes are exact in bf16: one bf16 tensor-core
                  product per tile), -inf for entries j >= (p+1) div r.
  indexer_topk  : top-min(K, visible) by score, descending, ties -> lowest index, NaN last:
                  each score becomes a unique int64 key (indexer_math.h topk_key, then the
                  column) and torch.topk selects the K smallest; then -1 padding and lengths.
  compressed_prefix_indices: 0, 1, ..., (p+1) div r - 1, then -1.
"""
from __future__ import annotations

import math
from typing import Optional

import torch
import triton
import triton.language as tl

from .._runtime import device_guard
from . import _checks as C
from ._attention_tile import mma
from ._formats import exp2_int, fp8_e4m3_to_f32, fp8_quantize, ue8m0_exponent
from ._pairs import block_amax, heads_per_program, pair_dims, rope_rotate
from .compressor import _HADAMARD_SCALE, hadamard
from .gemm import dequantized, matmul_f32
from .registry import op

_FP8 = torch.float8_e4m3fn
_KEY_DIM = 128
_INT64_MAX = 2 ** 63 - 1


@triton.jit
def _query_kernel(q_ptr, q_s0, pos_ptr, cs_ptr, cs_s0, max_pos, codes_ptr, codes_s0, codes_s1,
                  qs_ptr, qs_s0, w_ptr, w_s0, w_scale, had_scale, HI,
                  R_DIMS: tl.constexpr, HB: tl.constexpr):
    t = tl.program_id(0).to(tl.int64)
    h1 = tl.program_id(1) * HB + tl.arange(0, HB)
    h = h1[:, None, None]  # [HB, 2, 32] tiles: HB heads of 128 dims
    hm = h1 < HI
    p = tl.load(pos_ptr + t).to(tl.int64)
    ok = (p >= 0) & (p < max_pos)
    dims, _, pair = pair_dims(2)
    m = (h < HI) & (dims >= 0)
    src = q_ptr + t * q_s0 + h * 128
    even = tl.load(src + dims, mask=m, other=0.0)
    odd = tl.load(src + dims + 1, mask=m, other=0.0)
    even, odd = rope_rotate(even, odd, tl.where(ok, pair, -1 - R_DIMS),
                            cs_ptr + tl.where(ok, p, 0) * cs_s0, (128 - R_DIMS) // 2,
                            R_DIMS // 2, False)
    even, odd = hadamard(even, odd, had_scale, HB, 2, 7)
    k = ue8m0_exponent(tl.max(block_amax(even, odd), axis=1))  # [HB]
    ce, _ = fp8_quantize(even, k[:, None, None])
    co, _ = fp8_quantize(odd, k[:, None, None])
    # A position outside the table: codes 0 and a NaN scale (its scores become NaN), as on CUDA.
    ce = tl.where(ok, ce, 0)
    co = tl.where(ok, co, 0)
    dst = codes_ptr + t * codes_s0 + h * codes_s1
    tl.store(dst + dims, ce.to(tl.uint8), mask=m)
    tl.store(dst + dims + 1, co.to(tl.uint8), mask=m)
    tl.store(qs_ptr + t * qs_s0 + h1, tl.where(ok, exp2_int(k), float("nan")), mask=hm)
    w = tl.load(w_ptr + t * w_s0 + h1, mask=hm, other=0.0)
    tl.store(w_ptr + t * w_s0 + h1, w * w_scale, mask=hm)


@op("indexer_query", "indexer queries: torch GEMMs, then RoPE + Hadamard + FP8 per head",
    impl="triton+torch")
def indexer_query(qr: torch.Tensor, wq_b: torch.Tensor, wq_b_scale: Optional[torch.Tensor],
                  x: torch.Tensor, weights_proj: torch.Tensor, positions: torch.Tensor,
                  cos_sin: torch.Tensor, q_fp8: torch.Tensor, q_scale: torch.Tensor,
                  weights: torch.Tensor, workspace: Optional[torch.Tensor] = None) -> None:
    """indexer.h indexer_query: qr [T, q_lora], wq_b [H_I*128, q_lora] (bf16 / fp32, or fp8 with
    128x128 block scales), x [T, dim], weights_proj [H_I, dim], positions [T], cos_sin fp32
    [max_pos, 64] -> q_fp8 [T, H_I, 128] fp8_e4m3, q_scale [T, H_I] fp32, weights [T, H_I] fp32.
    workspace: optional fp32 [>= T * H_I * 128] for the projection (else allocated)."""
    name = "indexer_query"
    C.tensor(name, "qr", qr, (torch.bfloat16, torch.float32), ndim=2)
    T, q_lora = qr.shape
    C.tensor(name, "wq_b", wq_b, (torch.bfloat16, torch.float32, _FP8), ndim=2)
    if wq_b.shape[0] % _KEY_DIM or wq_b.shape[0] == 0 or wq_b.shape[1] != q_lora:
        C.fail(name, "wq_b.shape", f"[H_I x 128, {q_lora}]", list(wq_b.shape))
    HI = wq_b.shape[0] // _KEY_DIM
    C.tensor(name, "x", x, (torch.bfloat16, torch.float32), (T, -1))
    C.tensor(name, "weights_proj", weights_proj, (torch.bfloat16, torch.float32),
             (HI, x.shape[1]))
    C.tensor(name, "positions", positions, (torch.int32, torch.int64), (T,))
    C.tensor(name, "cos_sin", cos_sin, torch.float32, (-1, 64))
    C.tensor(name, "q_fp8", q_fp8, _FP8, (T, HI, _KEY_DIM))
    C.tensor(name, "q_scale", q_scale, torch.float32, (T, HI))
    C.tensor(name, "weights", weights, torch.float32, (T, HI))
    C.same_device(name, [("qr", qr), ("wq_b", wq_b), ("wq_b_scale", wq_b_scale), ("x", x),
                         ("weights_proj", weights_proj), ("positions", positions),
                         ("cos_sin", cos_sin), ("q_fp8", q_fp8), ("q_scale", q_scale),
                         ("weights", weights), ("workspace", workspace)])
    C.disjoint(name, [("q_fp8", q_fp8), ("q_scale", q_scale), ("weights", weights)],
               [("qr", qr), ("wq_b", wq_b), ("x", x), ("weights_proj", weights_proj),
                ("positions", positions), ("cos_sin", cos_sin), ("workspace", workspace)])
    if T == 0:
        return
    wb = dequantized(name, "wq_b", wq_b, wq_b_scale, 128, 128)
    q = matmul_f32(qr if qr.dtype == wb.dtype else qr.float(), wb if qr.dtype == wb.dtype
                   else wb.float())
    if workspace is not None:
        C.tensor(name, "workspace", workspace, torch.float32, ndim=1)
        if workspace.numel() < q.numel():
            C.fail(name, "workspace.numel()", f">= {q.numel()}", workspace.numel())
        q = workspace[:q.numel()].view(T, HI * _KEY_DIM).copy_(q)
    wp = weights_proj if weights_proj.dtype == x.dtype else weights_proj.to(x.dtype)
    weights.copy_(matmul_f32(x, wp))
    w_scale = 1.0 / math.sqrt(_KEY_DIM * HI)  # indexer_math.h indexer_weight_scale
    hb = heads_per_program(HI, 4)
    with device_guard(qr):
        _query_kernel[(T, triton.cdiv(HI, hb))](
            q, q.stride(0), positions, cos_sin, cos_sin.stride(0), cos_sin.shape[0],
            q_fp8.view(torch.uint8), q_fp8.stride(0), q_fp8.stride(1), q_scale, q_scale.stride(0),
            weights, weights.stride(0), w_scale, _HADAMARD_SCALE[_KEY_DIM], HI, R_DIMS=64,
            HB=hb, num_warps=4)


@triton.jit
def _scores_kernel(codes_ptr, codes_s0, codes_s1, qs_ptr, qs_s0, w_ptr, w_s0, pos_ptr, req_ptr,
                   keys_ptr, keys_f32, key_stride, key_block, key_blocks, tab_ptr, tab_s0,
                   tab_w, R, ratio, N, out_ptr, out_s0, HI,
                   BLOCK_H: tl.constexpr, BLOCK_N: tl.constexpr):
    t = tl.program_id(0).to(tl.int64)
    j = tl.program_id(1) * BLOCK_N + tl.arange(0, BLOCK_N)
    p = tl.load(pos_ptr + t).to(tl.int64)
    q = tl.load(req_ptr + t)
    visible = tl.where(p >= 0, (p + 1) // ratio, 0)
    vis = (j < visible) & (j < N)
    qok = (q >= 0) & (q < R)
    blk = tl.load(tab_ptr + tl.where(qok, q, 0).to(tl.int64) * tab_s0 + j // key_block,
                  mask=tl.where(qok, vis & (j // key_block < tab_w), False), other=-1).to(tl.int64)
    mapped = vis & (blk >= 0) & (blk < key_blocks)
    base = tl.where(mapped, blk, 0) * key_stride
    off = j % key_block
    d = tl.arange(0, 128)
    kc = tl.load(keys_ptr + (base + off * 128)[:, None] + d[None, :], mask=mapped[:, None],
                 other=0)
    ks = tl.load(keys_f32 + (base + key_block * 128 + off * 4) // 4, mask=mapped, other=0.0)
    h = tl.arange(0, BLOCK_H)
    hm = h < HI
    qc = tl.load(codes_ptr + t * codes_s0 + h[:, None] * codes_s1 + d[None, :],
                 mask=hm[:, None], other=0)
    # fp8 values are exact in bf16, and so is every product: only the fp32 sums round.
    dot = mma(fp8_e4m3_to_f32(qc).to(tl.bfloat16), tl.trans(fp8_e4m3_to_f32(kc).to(tl.bfloat16)))
    qs = tl.load(qs_ptr + t * qs_s0 + h, mask=hm, other=0.0)
    w = tl.load(w_ptr + t * w_s0 + h, mask=hm, other=0.0)
    s = dot * (qs[:, None] * ks[None, :])
    s = tl.where(s < 0.0, 0.0, s)
    score = tl.sum(tl.where(hm[:, None], w[:, None] * s, 0.0), axis=0)
    score = tl.where(vis, tl.where(mapped & qok, score, float("nan")), float("-inf"))
    tl.store(out_ptr + t * out_s0 + j, score, mask=j < N)


@op("indexer_scores", "indexer scores of every visible entry over the FP8 key cache")
def indexer_scores(q_fp8: torch.Tensor, q_scale: torch.Tensor, weights: torch.Tensor,
                   positions: torch.Tensor, token_to_req: torch.Tensor, keys: torch.Tensor,
                   key_block_size: int, key_block_table: torch.Tensor, ratio: int,
                   scores: torch.Tensor) -> None:
    """indexer.h indexer_scores: keys uint8 [blocks, key_block_size * 132] (the indexer key
    cache), key_block_table int32 [R, *], scores fp32 [T, N]. A token whose request is out of
    range or a visible entry whose block is unmapped scores NaN (as on CUDA)."""
    name = "indexer_scores"
    C.positive(name, "ratio", ratio)
    C.positive(name, "key_block_size", key_block_size)
    C.tensor(name, "q_fp8", q_fp8, _FP8, (-1, -1, _KEY_DIM))
    T, HI = q_fp8.shape[0], q_fp8.shape[1]
    C.tensor(name, "q_scale", q_scale, torch.float32, (T, HI))
    C.tensor(name, "weights", weights, torch.float32, (T, HI))
    C.tensor(name, "positions", positions, (torch.int32, torch.int64), (T,))
    C.tensor(name, "token_to_req", token_to_req, torch.int32, (T,))
    C.tensor(name, "keys", keys, torch.uint8, (-1, key_block_size * 132))
    C.contiguous(name, "keys", keys)
    C.tensor(name, "key_block_table", key_block_table, torch.int32, ndim=2)
    C.tensor(name, "scores", scores, torch.float32, (T, -1))
    C.same_device(name, [("q_fp8", q_fp8), ("q_scale", q_scale), ("weights", weights),
                         ("positions", positions), ("token_to_req", token_to_req),
                         ("keys", keys), ("key_block_table", key_block_table),
                         ("scores", scores)])
    C.disjoint(name, [("scores", scores)], [("q_fp8", q_fp8), ("keys", keys)])
    N = scores.shape[1]
    if T == 0 or N == 0:
        return
    flat = keys.view(-1)
    block_n = 64
    with device_guard(scores):
        _scores_kernel[(T, triton.cdiv(N, block_n))](
            q_fp8.view(torch.uint8), q_fp8.stride(0), q_fp8.stride(1), q_scale, q_scale.stride(0),
            weights, weights.stride(0), positions, token_to_req, flat, flat.view(torch.float32),
            keys.shape[1], key_block_size, keys.shape[0], key_block_table,
            key_block_table.stride(0), key_block_table.shape[1], key_block_table.shape[0], ratio,
            N, scores, scores.stride(0), HI, BLOCK_H=max(16, triton.next_power_of_2(HI)),
            BLOCK_N=block_n, num_warps=4)


@triton.jit
def _topk_keys_kernel(s_ptr, s_s0, pos_ptr, ratio, N, keys_ptr, keys_s0, NK,
                      BLOCK: tl.constexpr):
    t = tl.program_id(0).to(tl.int64)
    j = tl.program_id(1) * BLOCK + tl.arange(0, BLOCK)
    p = tl.load(pos_ptr + t).to(tl.int64)
    visible = tl.minimum(tl.where(p >= 0, (p + 1) // ratio, 0), N)
    s = tl.load(s_ptr + t * s_s0 + j, mask=j < visible, other=0.0)
    # indexer_math.h topk_key: ascending key = descending score, -0 == +0, NaN after -inf.
    u = s.to(tl.uint32, bitcast=True)
    u = tl.where((u & 0x7FFFFFFF) == 0, 0, u)
    asc = tl.where((u & 0x80000000) != 0, ~u, u | 0x80000000)
    key = tl.where((u & 0x7FFFFFFF) > 0x7F800000, 0xFFFFFFFF, ~asc)
    # Unique signed keys in the same order: (key - 2^31) << 32 | column.
    k64 = ((key.to(tl.int64) - 2147483648) << 32) | j.to(tl.int64)
    k64 = tl.where(j < visible, k64, 9223372036854775807)
    tl.store(keys_ptr + t * keys_s0 + j, k64, mask=j < NK)


@triton.jit
def _topk_finish_kernel(sel_ptr, sel_s0, pos_ptr, ratio, N, K, KS, idx_ptr, idx_s0, len_ptr,
                        len_s0, HAS_LENS: tl.constexpr, BLOCK: tl.constexpr):
    t = tl.program_id(0).to(tl.int64)
    p = tl.load(pos_ptr + t).to(tl.int64)
    count = tl.minimum(tl.minimum(tl.where(p >= 0, (p + 1) // ratio, 0), N), K)
    for k0 in range(0, K, BLOCK):
        k = k0 + tl.arange(0, BLOCK)
        sel = tl.load(sel_ptr + t * sel_s0 + k, mask=(k < count) & (k < KS), other=0)
        col = (sel & 0xFFFFFFFF).to(tl.int32)
        tl.store(idx_ptr + t * idx_s0 + k, tl.where(k < count, col, -1), mask=k < K)
    if HAS_LENS:
        tl.store(len_ptr + t * len_s0, count.to(tl.int32))


@op("indexer_topk", "top-k of the scores (descending, ties -> lowest index) + lengths",
    impl="triton+torch")
def indexer_topk(scores: torch.Tensor, positions: torch.Tensor, ratio: int,
                 indices: torch.Tensor, lens: Optional[torch.Tensor] = None) -> None:
    """indexer.h indexer_topk: indices [T, K] int32 = the min(K, visible) best columns of
    scores [T, N], then -1; lens [T] = that count (visible clamped to [0, N]). The selection is
    torch.topk over unique int64 keys (exact ties impossible, so deterministic)."""
    name = "indexer_topk"
    C.positive(name, "ratio", ratio)
    C.tensor(name, "scores", scores, torch.float32, ndim=2)
    T, N = scores.shape
    C.tensor(name, "positions", positions, (torch.int32, torch.int64), (T,))
    C.tensor(name, "indices", indices, torch.int32, (T, -1))
    C.optional(name, "lens", lens, torch.int32, (T,))
    C.same_device(name, [("scores", scores), ("positions", positions), ("indices", indices),
                         ("lens", lens)])
    C.disjoint(name, [("indices", indices), ("lens", lens)],
               [("scores", scores), ("positions", positions)])
    K = indices.shape[1]
    if T == 0:
        return
    NK = max(N, 1)
    keys = torch.empty((T, NK), dtype=torch.int64, device=scores.device)
    block = 1024
    with device_guard(scores):
        _topk_keys_kernel[(T, triton.cdiv(NK, block))](
            scores, scores.stride(0), positions, ratio, N, keys, keys.stride(0), NK, BLOCK=block,
            num_warps=4)
        KS = min(K, NK)
        sel = torch.topk(keys, KS, dim=1, largest=False, sorted=True).values if KS > 0 else keys
        if K == 0:
            if lens is not None:
                lens.zero_()
            return
        _topk_finish_kernel[(T,)](
            sel, sel.stride(0), positions, ratio, N, K, KS, indices, indices.stride(0), lens,
            lens.stride(0) if lens is not None else 0, HAS_LENS=lens is not None,
            BLOCK=min(1024, triton.next_power_of_2(K)), num_warps=4)


@triton.jit
def _prefix_kernel(pos_ptr, ratio, K, idx_ptr, idx_s0, len_ptr, len_s0, HAS_LENS: tl.constexpr,
                   BLOCK: tl.constexpr):
    t = tl.program_id(0).to(tl.int64)
    p = tl.load(pos_ptr + t).to(tl.int64)
    count = tl.minimum(tl.where(p >= 0, (p + 1) // ratio, 0), K)
    for k0 in range(0, K, BLOCK):
        k = k0 + tl.arange(0, BLOCK)
        tl.store(idx_ptr + t * idx_s0 + k, tl.where(k < count, k, -1), mask=k < K)
    if HAS_LENS:
        tl.store(len_ptr + t * len_s0, count.to(tl.int32))


@op("compressed_prefix_indices", "C128A plan: every emitted entry 0 .. (p+1) div r - 1, then -1")
def compressed_prefix_indices(positions: torch.Tensor, ratio: int, indices: torch.Tensor,
                              lens: Optional[torch.Tensor] = None) -> None:
    """indexer.h compressed_prefix_indices (the count clamped to [0, K], as on CUDA)."""
    name = "compressed_prefix_indices"
    C.positive(name, "ratio", ratio)
    C.tensor(name, "positions", positions, (torch.int32, torch.int64), ndim=1)
    T = positions.shape[0]
    C.tensor(name, "indices", indices, torch.int32, (T, -1))
    C.optional(name, "lens", lens, torch.int32, (T,))
    C.same_device(name, [("positions", positions), ("indices", indices), ("lens", lens)])
    C.disjoint(name, [("indices", indices), ("lens", lens)], [("positions", positions)])
    K = indices.shape[1]
    if T == 0:
        return
    with device_guard(positions):
        _prefix_kernel[(T,)](
            positions, ratio, K, indices, indices.stride(0), lens,
            lens.stride(0) if lens is not None else 0, HAS_LENS=lens is not None,
            BLOCK=min(1024, triton.next_power_of_2(max(K, 1))), num_warps=2)

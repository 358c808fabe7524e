"""Sparse decode (ops.h sparse_decode, FlashMLA flash_mla_with_kvcache sparse semantics) in
Triton: split-KV attention straight over the paged caches, with the dequantization fused into
the KV loads (MODEL1_FP8, V32_FP8, BF16, FP8_PER_TENSOR; kv_cache.load_kv_values), then the
combine of the splits (`sparse_attention_combine`).

Index list of a query row: the main scope's topk slots, then the extra scope's extra_topk slots
(softmax over their union); slots past a scope's topk_length[b] are ignored, -1 and slots
outside the cache are masked. The split plan is the shared one (ops.h make_decode_schedule:
split s covers list positions [s * split_len, (s + 1) * split_len)); one program per (query
row, block of BLOCK_H heads, split) writes the split's normalized partial o and lse into the
workspace (layout of ops.h: partial_o fp32 [b, s_q, H, splits, d_v], then partial_lse fp32
[b, s_q, H, splits]). With one split the program applies the sink and writes out / lse itself
(single pass, no combine).
"""
from __future__ import annotations

from typing import Optional

import torch
import triton
import triton.language as tl

from .._runtime import decode_schedule, device_guard, planner_sms
from . import _checks as C
from ._attention_tile import finish, logits, partial, softmax_update
from ._formats import round_bf16
from ._launch import Config, launch
from .kv_cache import CacheArg, load_kv_values
from .registry import op


@triton.jit
def _attend_scope(m_i, l_i, acc, q, q_tail, lo, hi, idx_row,
                  u8, bf, f32, block_stride, block_size, num_blocks, tensor_scale, scale,
                  LAYOUT: tl.constexpr, HAS_TAIL: tl.constexpr, BLOCK_N: tl.constexpr):
    """Adds the scope slots [lo, hi) of one query row (idx_row: its index list) to the state.
    Every layout's rows are exact in bf16 once an FP8_PER_TENSOR cache's scale is left out: it
    is applied to the logits and to the softmax weights instead."""
    dm = tl.arange(0, 512)
    dt = 512 + tl.arange(0, 64)
    for start in range(lo, hi, BLOCK_N):
        k = start + tl.arange(0, BLOCK_N)
        inb = k < hi
        slot = tl.load(idx_row + k, mask=inb, other=-1)
        valid = inb & (slot >= 0) & (slot // block_size < num_blocks)
        kt = load_kv_values(u8, bf, f32, slot, valid, dm, block_stride, block_size,
                            1.0, LAYOUT).to(tl.bfloat16)
        k_tail = kt
        if HAS_TAIL:
            k_tail = load_kv_values(u8, bf, f32, slot, valid, dt, block_stride, block_size,
                                    1.0, LAYOUT).to(tl.bfloat16)
        s = logits(q, kt, q_tail, k_tail, scale * tensor_scale, HAS_TAIL)
        m_i, l_i, acc = softmax_update(m_i, l_i, acc, s, valid, kt, tensor_scale)
    return m_i, l_i, acc


@triton.jit
def _sparse_decode_kernel(
        q_ptr, q_s0, q_s1, q_s2,
        u8, bf, f32, block_stride, block_size, num_blocks, tensor_scale,
        idx_ptr, idx_s0, idx_s1, len_ptr, topk,
        xu8, xbf, xf32, xblock_stride, xblock_size, xnum_blocks, xtensor_scale,
        xidx_ptr, xidx_s0, xidx_s1, xlen_ptr, xtopk,
        sink_ptr, po_ptr, plse_ptr, out_ptr, out_s0, out_s1, out_s2, lse_ptr, lse_s0, lse_s1,
        s_q, H, split_len, num_splits, d_v, scale,
        LAYOUT: tl.constexpr, HAS_TAIL: tl.constexpr, HAS_LEN: tl.constexpr,
        HAS_EXTRA: tl.constexpr, HAS_XLEN: tl.constexpr, HAS_SINK: tl.constexpr,
        SINGLE: tl.constexpr, BLOCK_H: tl.constexpr, BLOCK_N: tl.constexpr):
    row = tl.program_id(0)
    bi = (row // s_q).to(tl.int64)
    si = (row % s_q).to(tl.int64)
    h = tl.program_id(1) * BLOCK_H + tl.arange(0, BLOCK_H)
    split = tl.program_id(2)
    hm = h < H
    dm = tl.arange(0, 512)
    q_rows = q_ptr + bi * q_s0 + si * q_s1 + h[:, None] * q_s2
    q = tl.load(q_rows + dm[None, :], mask=hm[:, None], other=0.0)
    q_tail = q
    if HAS_TAIL:
        q_tail = tl.load(q_rows + 512 + tl.arange(0, 64)[None, :], mask=hm[:, None], other=0.0)

    lo = split * split_len
    hi = tl.minimum(lo + split_len, topk + xtopk)
    m_i = tl.full([BLOCK_H], float("-inf"), tl.float32)
    l_i = tl.zeros([BLOCK_H], tl.float32)
    acc = tl.zeros([BLOCK_H, 512], tl.float32)
    # Main scope: list positions [lo, hi) below its counted length.
    n = topk
    if HAS_LEN:
        n = tl.minimum(tl.maximum(tl.load(len_ptr + bi), 0), topk)
    m_i, l_i, acc = _attend_scope(m_i, l_i, acc, q, q_tail, lo, tl.minimum(hi, n),
                                  idx_ptr + bi * idx_s0 + si * idx_s1,
                                  u8, bf, f32, block_stride, block_size, num_blocks, tensor_scale,
                                  scale, LAYOUT, HAS_TAIL, BLOCK_N)
    if HAS_EXTRA:
        xn = xtopk
        if HAS_XLEN:
            xn = tl.minimum(tl.maximum(tl.load(xlen_ptr + bi), 0), xtopk)
        m_i, l_i, acc = _attend_scope(m_i, l_i, acc, q, q_tail, tl.maximum(lo - topk, 0),
                                      tl.minimum(hi - topk, xn),
                                      xidx_ptr + bi * xidx_s0 + si * xidx_s1,
                                      xu8, xbf, xf32, xblock_stride, xblock_size, xnum_blocks,
                                      xtensor_scale, scale, LAYOUT, HAS_TAIL, BLOCK_N)

    if SINGLE:
        sink = m_i
        if HAS_SINK:
            sink = tl.load(sink_ptr + h, mask=hm, other=0.0)
        o, lse = finish(m_i, l_i, acc, sink, HAS_SINK)
        tl.store(out_ptr + bi * out_s0 + si * out_s1 + h[:, None] * out_s2 + dm[None, :],
                 round_bf16(o).to(tl.bfloat16), mask=hm[:, None] & (dm[None, :] < d_v))
        tl.store(lse_ptr + bi * lse_s0 + si * lse_s1 + h, lse, mask=hm)
    else:
        o, lse = partial(m_i, l_i, acc)
        head_row = row.to(tl.int64) * H + h
        dst = po_ptr + ((head_row * num_splits + split) * d_v)[:, None] + dm[None, :]
        tl.store(dst, o, mask=hm[:, None] & (dm[None, :] < d_v))
        tl.store(plse_ptr + head_row * num_splits + split, lse, mask=hm)


@triton.jit
def _combine_kernel(po_ptr, po_sh, po_ss, plse_ptr, plse_sh, sink_ptr,
                    out_ptr, out_s0, out_s1, out_s2, lse_ptr, lse_s0, lse_s1,
                    s_q, H, num_splits, d_v,
                    HAS_SINK: tl.constexpr, BLOCK_H: tl.constexpr, BLOCK_D: tl.constexpr,
                    BLOCK_S: tl.constexpr):
    row = tl.program_id(0)
    bi = (row // s_q).to(tl.int64)
    si = (row % s_q).to(tl.int64)
    h = tl.program_id(1) * BLOCK_H + tl.arange(0, BLOCK_H)
    hm = h < H
    head_row = row.to(tl.int64) * H + h
    sp = tl.arange(0, BLOCK_S)
    plse = tl.load(plse_ptr + head_row[:, None] * plse_sh + sp[None, :],
                   mask=hm[:, None] & (sp[None, :] < num_splits), other=float("-inf"))
    m = tl.max(plse, axis=1)
    m_use = tl.where(m == float("-inf"), 0.0, m)
    l_i = tl.sum(tl.exp2((plse - m_use[:, None]) * 1.4426950408889634), axis=1)
    d = tl.arange(0, BLOCK_D)
    acc = tl.zeros([BLOCK_H, BLOCK_D], tl.float32)
    for s in range(num_splits):
        ls = tl.load(plse_ptr + head_row * plse_sh + s, mask=hm, other=float("-inf"))
        w = tl.exp2((ls - m_use) * 1.4426950408889634)
        o = tl.load(po_ptr + head_row[:, None] * po_sh + s * po_ss + d[None, :],
                    mask=(hm & (w > 0.0))[:, None] & (d[None, :] < d_v), other=0.0)
        acc += tl.where((w > 0.0)[:, None], w[:, None] * o, 0.0)
    sink = m_use
    if HAS_SINK:
        sink = tl.load(sink_ptr + h, mask=hm, other=0.0)
    # The splits' lse are the logits of a one-row-per-split softmax (m, l as in the kernels).
    o, lse = finish(m_use, tl.where(m == float("-inf"), 0.0, l_i), acc, sink, HAS_SINK)
    tl.store(out_ptr + bi * out_s0 + si * out_s1 + h[:, None] * out_s2 + d[None, :],
             round_bf16(o).to(tl.bfloat16), mask=hm[:, None] & (d[None, :] < d_v))
    tl.store(lse_ptr + bi * lse_s0 + si * lse_s1 + h, lse, mask=hm)


def decode_configs(H: int):
    """Tile configurations of the split kernel, fastest first (see _launch.launch)."""
    big = [Config(32, 32, 8)] if H > 16 else []
    return big + [Config(16, 32, 4), Config(16, 16, 4)]


def _launch_combine(partial_o, partial_lse, attn_sink, out, lse):
    b, s_q, H, S, d_v = partial_o.shape
    block_h = min(16, triton.next_power_of_2(H))
    _combine_kernel[(b * s_q, triton.cdiv(H, block_h))](
        partial_o, partial_o.stride(2), partial_o.stride(3), partial_lse, partial_lse.stride(2),
        attn_sink, out, out.stride(0), out.stride(1), out.stride(2), lse, lse.stride(0),
        lse.stride(1), s_q, H, S, d_v, HAS_SINK=attn_sink is not None, BLOCK_H=block_h,
        BLOCK_D=triton.next_power_of_2(d_v), BLOCK_S=triton.next_power_of_2(S), num_warps=4)


@op("sparse_attention_combine", "merge split-KV partials (o, lse) with the sink")
def sparse_attention_combine(partial_o: torch.Tensor, partial_lse: torch.Tensor,
                             attn_sink: Optional[torch.Tensor], out: torch.Tensor,
                             lse: torch.Tensor) -> None:
    """torch.ops.dsv4.sparse_attention_combine: partial_o fp32 [b, s_q, H, S, d_v] and
    partial_lse fp32 [b, s_q, H, S] (-inf: empty split, its o never read) -> out bf16, lse."""
    name = "sparse_attention_combine"
    C.tensor(name, "partial_o", partial_o, torch.float32, ndim=5)
    C.contiguous(name, "partial_o", partial_o)
    b, s_q, H, S, d_v = partial_o.shape
    C.positive(name, "partial_o.shape[3] (splits)", S)
    C.tensor(name, "partial_lse", partial_lse, torch.float32, (b, s_q, H, S))
    C.contiguous(name, "partial_lse", partial_lse)
    C.optional(name, "attn_sink", attn_sink, torch.float32, (H,))
    C.tensor(name, "out", out, torch.bfloat16, (b, s_q, H, d_v))
    C.tensor(name, "lse", lse, torch.float32, (b, s_q, H))
    C.same_device(name, [("partial_o", partial_o), ("partial_lse", partial_lse),
                         ("attn_sink", attn_sink), ("out", out), ("lse", lse)])
    C.disjoint(name, [("out", out), ("lse", lse)],
               [("partial_o", partial_o), ("partial_lse", partial_lse), ("attn_sink", attn_sink)])
    if b * s_q * H == 0:
        return
    with device_guard(out):
        _launch_combine(partial_o, partial_lse, attn_sink, out, lse)


def schedule(b: int, s_q: int, h: int, topk_total: int, device: torch.device,
             d_v: int = 512) -> tuple:
    """(num_splits, split_len, workspace_bytes): the shared split planner (ops.h
    make_decode_schedule) for this device's SM / CU count."""
    return decode_schedule(b, s_q, h, topk_total, planner_sms(device), d_v)


@op("sparse_decode", "split-KV sparse decode over paged caches (fused dequant) + combine")
def sparse_decode(q: torch.Tensor, k_cache: torch.Tensor, k_layout: str, k_block_size: int,
                  indices: torch.Tensor, topk_length: Optional[torch.Tensor],
                  extra_k_cache: Optional[torch.Tensor], extra_layout: str,
                  extra_block_size: int, extra_indices: Optional[torch.Tensor],
                  extra_topk_length: Optional[torch.Tensor], attn_sink: Optional[torch.Tensor],
                  softmax_scale: float, d_v: int, num_splits: int, split_len: int,
                  workspace_bytes: int, workspace: torch.Tensor, out: torch.Tensor,
                  lse: torch.Tensor, *, k_tensor_scale: float = 1.0,
                  extra_tensor_scale: float = 1.0) -> None:
    """torch.ops.dsv4.sparse_decode's contract (ops.h SparseDecodeArgs + DecodeSchedule), plus
    the FP8_PER_TENSOR scales (keyword-only; the torch op fixes them at 1). This backend takes
    d_v <= 512. The workspace is only written when num_splits > 1."""
    name = "sparse_decode"
    C.tensor(name, "q", q, torch.bfloat16, ndim=4)
    b, s_q, H, d_qk = q.shape
    C.positive(name, "q.shape[2] (heads)", H)
    main = CacheArg(name, "k_cache", k_cache, k_layout, k_block_size, k_tensor_scale)
    if d_qk != main.dim:
        C.fail(name, "q.shape[3] (d_qk)", f"{main.dim} (the dim of k_cache's layout {k_layout})",
               d_qk)
    if not 1 <= d_v <= 512:
        C.fail(name, "d_v", "a value in [1, 512] (this backend's V width)", d_v)
    C.tensor(name, "indices", indices, torch.int32, (b, s_q, -1))
    topk = indices.shape[2]
    C.positive(name, "indices.shape[2] (topk)", topk)
    C.optional(name, "topk_length", topk_length, torch.int32, (b,))
    extra = None
    xtopk = 0
    if extra_k_cache is not None:
        extra = CacheArg(name, "extra_k_cache", extra_k_cache, extra_layout, extra_block_size,
                         extra_tensor_scale)
        if extra.code != main.code:
            C.fail(name, "extra_k_cache layout", k_layout, extra_layout)
        C.tensor(name, "extra_indices", extra_indices, torch.int32, (b, s_q, -1))
        xtopk = extra_indices.shape[2]
        C.positive(name, "extra_indices.shape[2] (extra_topk)", xtopk)
        C.optional(name, "extra_topk_length", extra_topk_length, torch.int32, (b,))
    elif extra_indices is not None or extra_topk_length is not None:
        C.fail(name, "extra_indices / extra_topk_length", "none without extra_k_cache", "a tensor")
    C.optional(name, "attn_sink", attn_sink, torch.float32, (H,))
    C.tensor(name, "out", out, torch.bfloat16, (b, s_q, H, d_v))
    C.tensor(name, "lse", lse, torch.float32, (b, s_q, H))
    if num_splits < 1:
        C.fail(name, "num_splits", ">= 1", num_splits)
    if split_len < 64 or split_len % 64:
        C.fail(name, "split_len", "a positive multiple of 64", split_len)
    if num_splits * split_len < topk + xtopk:
        C.fail(name, "num_splits * split_len", f">= {topk + xtopk} (topk + extra_topk)",
               num_splits * split_len)
    po_numel = b * s_q * H * num_splits * d_v
    need = 4 * (po_numel + b * s_q * H * num_splits)
    C.tensor(name, "workspace", workspace, torch.uint8, ndim=1)
    if workspace.numel() < need:
        C.fail(name, "workspace bytes", f">= {need}", workspace.numel())
    if workspace.data_ptr() % 16:
        C.fail(name, "workspace.data_ptr()", "16-byte aligned", hex(workspace.data_ptr()))
    C.same_device(name, [("q", q), ("k_cache", k_cache), ("indices", indices),
                         ("topk_length", topk_length), ("extra_k_cache", extra_k_cache),
                         ("extra_indices", extra_indices),
                         ("extra_topk_length", extra_topk_length), ("attn_sink", attn_sink),
                         ("workspace", workspace), ("out", out), ("lse", lse)])
    C.disjoint(name, [("out", out), ("lse", lse), ("workspace", workspace)],
               [("q", q), ("k_cache", k_cache), ("indices", indices),
                ("extra_k_cache", extra_k_cache), ("extra_indices", extra_indices)])
    scale = softmax_scale if softmax_scale != 0.0 else d_qk ** -0.5
    if b * s_q == 0:
        return
    single = num_splits == 1
    ws = workspace[:need].view(torch.float32)
    partial_o = ws[:po_numel].view(b, s_q, H, num_splits, d_v)
    partial_lse = ws[po_numel:].view(b, s_q, H, num_splits)
    x = extra if extra is not None else main
    xstrides = (extra_indices.stride(0), extra_indices.stride(1)) if extra is not None else (0, 0)
    flags = dict(LAYOUT=main.code, HAS_TAIL=d_qk == 576, HAS_LEN=topk_length is not None,
                 HAS_EXTRA=extra is not None, HAS_XLEN=extra_topk_length is not None,
                 HAS_SINK=attn_sink is not None, SINGLE=single)
    with device_guard(q):
        launch(_sparse_decode_kernel, ("sparse_decode", q.device, H > 16, *flags.values()),
               decode_configs(H), lambda c: (b * s_q, triton.cdiv(H, c.block_h), num_splits),
               (q, q.stride(0), q.stride(1), q.stride(2),
                *main.kernel_args(), indices, indices.stride(0), indices.stride(1), topk_length,
                topk, *x.kernel_args(), extra_indices if extra is not None else indices,
                *xstrides, extra_topk_length, xtopk,
                attn_sink, partial_o, partial_lse, out, out.stride(0), out.stride(1),
                out.stride(2), lse, lse.stride(0), lse.stride(1),
                s_q, H, split_len, num_splits, d_v, float(scale)), flags)
        if not single:
            _launch_combine(partial_o, partial_lse, attn_sink, out, lse)

"""Sparse prefill (ops.h sparse_prefill, FlashMLA flash_mla_sparse_fwd semantics) in Triton:
queries [s_q, H, d_qk] over a bf16 KV [s_kv, 1, d_qk] (the gathered compressed + SWA rows),
d_qk 512 or 576, d_v <= 512, optional attention sink and per-query topk_length.

One program per (query token, block of BLOCK_H heads) walks the token's index list in tiles of
BLOCK_N rows: indices -1 and >= s_kv (and < -1) are masked, slots past topk_length ignored.
Outputs: out bf16, max_logits (scale * q.k, -inf when no valid key) and lse (natural log,
+inf when no valid key), both without the sink.
"""
from __future__ import annotations

from typing import Optional

import torch
import triton
import triton.language as tl

from .._runtime import device_guard
from . import _checks as C
from ._attention_tile import finish, logits, softmax_update
from ._formats import round_bf16
from ._launch import Config, launch
from .registry import op


@triton.jit
def _sparse_prefill_kernel(
        q_ptr, q_s0, q_s1, kv_ptr, kv_s0, idx_ptr, idx_s0, len_ptr, sink_ptr,
        out_ptr, out_s0, out_s1, ml_ptr, ml_s0, lse_ptr, lse_s0,
        H, s_kv, topk, d_v, scale,
        HAS_TAIL: tl.constexpr, HAS_LEN: tl.constexpr, HAS_SINK: tl.constexpr,
        BLOCK_H: tl.constexpr, BLOCK_N: tl.constexpr):
    t = tl.program_id(0).to(tl.int64)
    h = tl.program_id(1) * BLOCK_H + tl.arange(0, BLOCK_H)
    hm = h < H
    dm = tl.arange(0, 512)
    dt = 512 + tl.arange(0, 64)
    q_rows = q_ptr + t * q_s0 + h[:, None] * q_s1
    q = tl.load(q_rows + dm[None, :], mask=hm[:, None], other=0.0)
    q_tail = q
    if HAS_TAIL:
        q_tail = tl.load(q_rows + dt[None, :], mask=hm[:, None], other=0.0)

    n = topk
    if HAS_LEN:
        n = tl.minimum(tl.maximum(tl.load(len_ptr + t), 0), topk)
    m_i = tl.full([BLOCK_H], float("-inf"), tl.float32)
    l_i = tl.zeros([BLOCK_H], tl.float32)
    acc = tl.zeros([BLOCK_H, 512], tl.float32)
    for start in range(0, n, BLOCK_N):
        k = start + tl.arange(0, BLOCK_N)
        inb = k < n
        row = tl.load(idx_ptr + t * idx_s0 + k, mask=inb, other=-1)
        valid = inb & (row >= 0) & (row < s_kv)
        rows = kv_ptr + tl.where(valid, row, 0).to(tl.int64)[:, None] * kv_s0
        kt = tl.load(rows + dm[None, :], mask=valid[:, None], other=0.0)
        k_tail = kt
        if HAS_TAIL:
            k_tail = tl.load(rows + dt[None, :], mask=valid[:, None], other=0.0)
        s = logits(q, kt, q_tail, k_tail, scale, HAS_TAIL)
        m_i, l_i, acc = softmax_update(m_i, l_i, acc, s, valid, kt, 1.0)

    sink = m_i
    if HAS_SINK:
        sink = tl.load(sink_ptr + h, mask=hm, other=0.0)
    o, lse = finish(m_i, l_i, acc, sink, HAS_SINK)
    tl.store(out_ptr + t * out_s0 + h[:, None] * out_s1 + dm[None, :],
             round_bf16(o).to(tl.bfloat16), mask=hm[:, None] & (dm[None, :] < d_v))
    tl.store(ml_ptr + t * ml_s0 + h, m_i, mask=hm)
    tl.store(lse_ptr + t * lse_s0 + h, lse, mask=hm)


def prefill_configs(H: int):
    """Tile configurations, fastest first (_launch.launch takes the first the device holds):
    32 heads x 32 KV rows per tile for H > 16, then smaller tiles for GPUs with less shared
    memory (MI300: 64 KB, consumer parts: ~100 KB)."""
    big = [Config(32, 32, 8)] if H > 16 else []
    return big + [Config(16, 32, 4), Config(16, 16, 4)]


@op("sparse_prefill", "sparse attention over a gathered bf16 KV (d 512/576, sink, topk_length)")
def sparse_prefill(q: torch.Tensor, kv: torch.Tensor, indices: torch.Tensor,
                   topk_length: Optional[torch.Tensor], attn_sink: Optional[torch.Tensor],
                   softmax_scale: float, d_v: int, out: torch.Tensor, max_logits: torch.Tensor,
                   lse: torch.Tensor) -> None:
    """torch.ops.dsv4.sparse_prefill's contract (ops.h SparsePrefillArgs). This backend takes
    d_v <= 512 and rounds the softmax weights to bf16 for the P.V product."""
    name = "sparse_prefill"
    C.tensor(name, "q", q, torch.bfloat16, ndim=3)
    s_q, H, d_qk = q.shape
    if d_qk not in (512, 576):
        C.fail(name, "q.shape[2] (d_qk)", "512 or 576", d_qk)
    C.positive(name, "q.shape[1] (heads)", H)
    if not 1 <= d_v <= 512:
        C.fail(name, "d_v", "a value in [1, 512] (this backend's V width)", d_v)
    C.tensor(name, "kv", kv, torch.bfloat16, (-1, 1, d_qk))
    C.tensor(name, "indices", indices, torch.int32, (s_q, 1, -1))
    topk = indices.shape[2]
    C.positive(name, "indices.shape[2] (topk)", topk)
    C.optional(name, "topk_length", topk_length, torch.int32, (s_q,))
    C.optional(name, "attn_sink", attn_sink, torch.float32, (H,))
    C.tensor(name, "out", out, torch.bfloat16, (s_q, H, d_v))
    C.tensor(name, "max_logits", max_logits, torch.float32, (s_q, H))
    C.tensor(name, "lse", lse, torch.float32, (s_q, H))
    C.same_device(name, [("q", q), ("kv", kv), ("indices", indices), ("topk_length", topk_length),
                         ("attn_sink", attn_sink), ("out", out), ("max_logits", max_logits),
                         ("lse", lse)])
    C.disjoint(name, [("out", out), ("max_logits", max_logits), ("lse", lse)],
               [("q", q), ("kv", kv), ("indices", indices), ("topk_length", topk_length),
                ("attn_sink", attn_sink)])
    scale = softmax_scale if softmax_scale != 0.0 else d_qk ** -0.5
    if s_q == 0:
        return
    flags = dict(HAS_TAIL=d_qk == 576, HAS_LEN=topk_length is not None,
                 HAS_SINK=attn_sink is not None)
    with device_guard(q):
        launch(_sparse_prefill_kernel, ("sparse_prefill", q.device, H > 16, *flags.values()),
               prefill_configs(H), lambda c: (s_q, triton.cdiv(H, c.block_h)),
               (q, q.stride(0), q.stride(1), kv, kv.stride(0), indices, indices.stride(0),
                topk_length, attn_sink, out, out.stride(0), out.stride(1),
                max_logits, max_logits.stride(0), lse, lse.stride(0),
                H, kv.shape[0], topk, d_v, float(scale)), flags)

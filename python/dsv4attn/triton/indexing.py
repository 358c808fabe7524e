"""Index planning in Triton (include/dsv4/indexing.h): request-local -> global slots, SWA window
indices, and the prefill gather-workspace rewrite (vLLM combine_topk_swa_indices).

Values are never read on the host: what the CPU reference rejects is treated as invalid with
exactly the CUDA backend's documented results (indexing.h): an entry that cannot be mapped
becomes -1 / is left out (the kept ones stay packed, oldest or first first), a row whose
metadata is inconsistent becomes all -1 with length 0. Packed outputs are written by scatter to
each kept entry's rank plus a fill of -1 from the row's length on (disjoint addresses).
"""
from __future__ import annotations

from typing import Optional

import torch
import triton
import triton.language as tl

from .. import Error
from .._runtime import device_guard
from . import _checks as C
from .registry import op

_I32 = torch.int32
_POS = (torch.int32, torch.int64)
INT32_MAX = 2147483647


@triton.jit
def paged_slot(table_row, max_blocks, block_size, pos, ok):
    """Global slot of request-local positions `pos` through one block-table row (index_math.h
    paged_slot): -1 where pos < 0, the block is beyond the row or unmapped, the slot exceeds
    int32, or `ok` is False."""
    p = pos.to(tl.int64)
    blk = p // block_size
    inb = ok & (p >= 0) & (blk < max_blocks)
    b = tl.load(table_row + tl.where(inb, blk, 0), mask=inb, other=-1).to(tl.int64)
    slot = b * block_size + p % block_size
    return tl.where(inb & (b >= 0) & (slot <= 2147483647), slot, -1).to(tl.int32)


@triton.jit
def _local_to_global_kernel(local_ptr, local_s0, req_ptr, table_ptr, table_s0, R, max_blocks,
                            block_size, global_ptr, global_s0, lens_ptr, lens_s0, K,
                            HAS_LENS: tl.constexpr, BLOCK: tl.constexpr):
    t = tl.program_id(0).to(tl.int64)
    r = tl.load(req_ptr + t)
    ok = (r >= 0) & (r < R)
    row = table_ptr + tl.where(ok, r, 0).to(tl.int64) * table_s0
    count = tl.zeros([], tl.int32)
    for k0 in range(0, K, BLOCK):
        k = k0 + tl.arange(0, BLOCK)
        m = k < K
        i = tl.load(local_ptr + t * local_s0 + k, mask=m, other=-1)
        g = paged_slot(row, max_blocks, block_size, i, tl.where(ok, m, False))
        tl.store(global_ptr + t * global_s0 + k, g, mask=m)
        count += tl.sum((m & (g >= 0)).to(tl.int32), axis=0)
    if HAS_LENS:
        tl.store(lens_ptr + t * lens_s0, count)


@op("local_to_global_slots", "request-local entries -> global slots via block tables (+ lens)")
def local_to_global_slots(local: torch.Tensor, token_to_req: torch.Tensor,
                          block_table: torch.Tensor, block_size: int, global_: torch.Tensor,
                          lens: Optional[torch.Tensor], checked: bool = False) -> None:
    """global[t][k] = block_table[r][i // B] * B + i % B (r = token_to_req[t], i = local[t][k]);
    -1 where that is impossible. global may be local itself. checked=True (the CPU's validating
    variant) is refused: it needs the values on the host."""
    name = "local_to_global_slots"
    if checked:
        raise Error(f"{name}: checked: the validating variant reads every index on the host; "
                    f"the Triton backend offers the unchecked one (invalid entries become -1)")
    C.positive(name, "block_size", block_size)
    C.tensor(name, "local", local, _I32, ndim=2)
    T, K = local.shape
    C.tensor(name, "token_to_req", token_to_req, _I32, (T,))
    C.tensor(name, "block_table", block_table, _I32, ndim=2)
    C.tensor(name, "global", global_, _I32, (T, K))
    C.optional(name, "lens", lens, _I32, (T,))
    C.same_device(name, [("local", local), ("token_to_req", token_to_req),
                         ("block_table", block_table), ("global", global_), ("lens", lens)])
    if not (global_.data_ptr() == local.data_ptr() and global_.stride() == local.stride()):
        C.disjoint(name, [("global", global_)], [("local", local)])
    C.disjoint(name, [("global", global_), ("lens", lens)],
               [("token_to_req", token_to_req), ("block_table", block_table)])
    if T == 0:
        return
    with device_guard(local):
        _local_to_global_kernel[(T,)](
            local, local.stride(0), token_to_req, block_table, block_table.stride(0),
            block_table.shape[0], block_table.shape[1], block_size, global_, global_.stride(0),
            lens, lens.stride(0) if lens is not None else 0, K, HAS_LENS=lens is not None,
            BLOCK=min(1024, triton.next_power_of_2(max(K, 1))), num_warps=1)


@triton.jit
def _swa_window_kernel(pos_ptr, req_ptr, table_ptr, table_s0, R, max_blocks, block_size, W,
                       out_ptr, out_s0, lens_ptr, lens_s0, BLOCK_W: tl.constexpr):
    t = tl.program_id(0).to(tl.int64)
    p = tl.load(pos_ptr + t).to(tl.int64)
    r = tl.load(req_ptr + t)
    ok = (p >= 0) & (r >= 0) & (r < R)
    row = table_ptr + tl.where(ok, r, 0).to(tl.int64) * table_s0
    first = tl.maximum(p - W + 1, 0)
    k = tl.arange(0, BLOCK_W)
    in_window = tl.where(ok, (k < W) & (first + k <= p), False)
    slot = paged_slot(row, max_blocks, block_size, first + k, in_window)
    kept = slot >= 0
    rank = tl.cumsum(kept.to(tl.int32), axis=0) - 1
    n = tl.sum(kept.to(tl.int32), axis=0)
    dst = out_ptr + t * out_s0
    tl.store(dst + rank, slot, mask=kept)
    tl.store(dst + k, tl.full([BLOCK_W], -1, tl.int32), mask=(k >= n) & (k < W))
    tl.store(lens_ptr + t * lens_s0, n)


@op("swa_window_indices", "each token's SWA window (last min(W, p+1) positions) as global slots")
def swa_window_indices(positions: torch.Tensor, token_to_req: torch.Tensor,
                       block_table: torch.Tensor, block_size: int, window: int,
                       indices: torch.Tensor, lens: torch.Tensor) -> None:
    """indices [T, W] int32 (oldest first, -1 padded), lens [T] int32. A window position whose
    block was released or lies beyond the table is left out (the live suffix stays packed); a
    negative position or a request outside the table gives an all -1 row, length 0."""
    name = "swa_window_indices"
    C.positive(name, "block_size", block_size)
    C.positive(name, "window", window)
    C.tensor(name, "positions", positions, _POS, ndim=1)
    T = positions.shape[0]
    C.tensor(name, "token_to_req", token_to_req, _I32, (T,))
    C.tensor(name, "block_table", block_table, _I32, ndim=2)
    C.tensor(name, "indices", indices, _I32, (T, window))
    C.tensor(name, "lens", lens, _I32, (T,))
    C.same_device(name, [("positions", positions), ("token_to_req", token_to_req),
                         ("block_table", block_table), ("indices", indices), ("lens", lens)])
    C.disjoint(name, [("indices", indices), ("lens", lens)],
               [("positions", positions), ("token_to_req", token_to_req),
                ("block_table", block_table)])
    if T == 0:
        return
    with device_guard(positions):
        _swa_window_kernel[(T,)](
            positions, token_to_req, block_table, block_table.stride(0), block_table.shape[0],
            block_table.shape[1], block_size, window, indices, indices.stride(0), lens,
            lens.stride(0), BLOCK_W=triton.next_power_of_2(window), num_warps=1)


@triton.jit
def _combine_kernel(topk_ptr, topk_s0, qsl_ptr, seq_ptr, glen_ptr, R, T, W, N, M, ratio, K,
                    out_ptr, out_s0, len_ptr, len_s0,
                    HAS_RATIO: tl.constexpr, BLOCK_R: tl.constexpr, BLOCK_K: tl.constexpr,
                    BLOCK_W: tl.constexpr):
    t = tl.program_id(0)
    base = tl.load(qsl_ptr)
    # The row's request: how many requests end at or before it (qsl is non-decreasing).
    rr = tl.arange(0, BLOCK_R)
    ends = tl.load(qsl_ptr + 1 + rr, mask=rr < R, other=2147483647) - base
    r = tl.sum((ends <= t).to(tl.int32), axis=0)
    has = r < R
    ok = has & (tl.load(qsl_ptr + R) - base == T)
    rs = tl.where(has, r, 0)
    q0 = tl.load(qsl_ptr + rs, mask=has, other=0) - base
    q1 = tl.load(qsl_ptr + rs + 1, mask=has, other=0) - base
    seq = tl.load(seq_ptr + rs, mask=has, other=0).to(tl.int64)
    g = tl.load(glen_ptr + rs, mask=has, other=0).to(tl.int64)
    ok = ok & (t >= q0) & (seq >= q1 - q0) & (g >= 0) & (g <= seq) & (N + g <= M)
    p = seq - (q1 - t)
    first_pos = seq - (q1 - q0)
    ok = ok & (tl.maximum(first_pos - W + 1, 0) >= seq - g)
    row0 = rs.to(tl.int64) * M
    visible = 0
    if HAS_RATIO:
        visible = (p + 1) // ratio
    dst = out_ptr + t.to(tl.int64) * out_s0
    n = tl.zeros([], tl.int32)
    for k0 in range(0, K, BLOCK_K):
        k = k0 + tl.arange(0, BLOCK_K)
        j = tl.load(topk_ptr + t.to(tl.int64) * topk_s0 + k, mask=k < K, other=-1).to(tl.int64)
        kept = tl.where(ok, (k < K) & (j >= 0) & (j < N) & (j < visible), False)
        rank = n + tl.cumsum(kept.to(tl.int32), axis=0) - 1
        tl.store(dst + rank, (row0 + j).to(tl.int32), mask=kept)
        n += tl.sum(kept.to(tl.int32), axis=0)
    # SWA window: workspace row N + (q - (seq - g)) holds position q.
    first = tl.maximum(p - W + 1, 0)
    w = tl.arange(0, BLOCK_W)
    in_window = tl.where(ok, (w < W) & (first + w <= p), False)
    tl.store(dst + n + w, (row0 + N - (seq - g) + first + w).to(tl.int32), mask=in_window)
    n += tl.sum(in_window.to(tl.int32), axis=0)
    for k0 in range(0, K + W, BLOCK_K):
        k = k0 + tl.arange(0, BLOCK_K)
        tl.store(dst + k, tl.full([BLOCK_K], -1, tl.int32), mask=(k >= n) & (k < K + W))
    tl.store(len_ptr + t.to(tl.int64) * len_s0, n)


@op("combine_topk_swa_indices", "prefill workspace indices: top-k compressed rows, then SWA")
def combine_topk_swa_indices(topk: Optional[torch.Tensor], query_start_loc: torch.Tensor,
                             seq_lens: torch.Tensor, gather_lens: torch.Tensor, window: int,
                             compressed_region: int, rows_per_request: int, ratio: int,
                             out: torch.Tensor, out_lens: torch.Tensor) -> None:
    """indexing.h combine_topk_swa_indices, with its CUDA handling of rejected data: a top-k
    entry < -1, >= compressed_region or not causal is left out; a row whose request metadata
    is inconsistent gets all -1 and length 0."""
    name = "combine_topk_swa_indices"
    C.positive(name, "window", window)
    if compressed_region < 0:
        C.fail(name, "compressed_region", ">= 0", compressed_region)
    if ratio not in (0, 4, 128):
        C.fail(name, "ratio", "0, 4 or 128", ratio)
    C.tensor(name, "query_start_loc", query_start_loc, _I32, ndim=1)
    R = query_start_loc.shape[0] - 1
    if R < 0:
        C.fail(name, "query_start_loc.shape[0]", ">= 1 (R + 1)", 0)
    C.tensor(name, "seq_lens", seq_lens, _I32, (R,))
    C.tensor(name, "gather_lens", gather_lens, _I32, (R,))
    C.tensor(name, "out", out, _I32, ndim=2)
    T = out.shape[0]
    K = 0
    if topk is not None:
        C.tensor(name, "topk", topk, _I32, (T, -1))
        K = topk.shape[1]
    C.tensor(name, "out", out, _I32, (T, K + window))
    C.tensor(name, "out_lens", out_lens, _I32, (T,))
    if R * rows_per_request > INT32_MAX:
        C.fail(name, "rows_per_request", f"R x rows_per_request <= {INT32_MAX}",
               f"{R} x {rows_per_request}")
    C.same_device(name, [("topk", topk), ("query_start_loc", query_start_loc),
                         ("seq_lens", seq_lens), ("gather_lens", gather_lens), ("out", out),
                         ("out_lens", out_lens)])
    C.disjoint(name, [("out", out), ("out_lens", out_lens)],
               [("topk", topk), ("query_start_loc", query_start_loc), ("seq_lens", seq_lens),
                ("gather_lens", gather_lens)])
    if T == 0:
        return
    with device_guard(out):
        _combine_kernel[(T,)](
            topk if topk is not None else out, topk.stride(0) if topk is not None else 0,
            query_start_loc, seq_lens, gather_lens, R, T, window, compressed_region,
            rows_per_request, max(ratio, 1), K, out, out.stride(0), out_lens, out_lens.stride(0),
            HAS_RATIO=ratio > 0, BLOCK_R=triton.next_power_of_2(max(R, 1)), BLOCK_K=256,
            BLOCK_W=triton.next_power_of_2(window), num_warps=2)

"""RMSNorm and GPT-J RoPE rows in Triton (ops.h rms_norm, fused_qkv_rms_norm, apply_rope).

Every op works on rows of the last dim: one program per row (rms_norm) or per (token, head)
(apply_rope). Sums of squares are fp32 tree reductions (the CPU sums in index order: results
may differ by an ulp of the output dtype).
"""
from __future__ import annotations

from typing import Optional

import torch
import triton
import triton.language as tl

from .._runtime import device_guard
from . import _checks as C
from ._formats import round_bf16
from ._pairs import heads_per_program, pair_dims, rope_rotate
from .registry import op

_FLOATS = (torch.bfloat16, torch.float32)


@triton.jit
def _rms_norm_kernel(x_ptr, x_s0, x_s1, w_ptr, y_ptr, y_s0, y_s1, rows1, D, eps,
                     HAS_W: tl.constexpr, ROUND_BF16: tl.constexpr, BLOCK: tl.constexpr):
    r = tl.program_id(0)
    r0 = (r // rows1).to(tl.int64)
    r1 = (r % rows1).to(tl.int64)
    d = tl.arange(0, BLOCK)
    m = d < D
    x = tl.load(x_ptr + r0 * x_s0 + r1 * x_s1 + d, mask=m, other=0.0).to(tl.float32)
    inv = tl.div_rn(1.0, tl.sqrt_rn(tl.div_rn(tl.sum(x * x, axis=0), D * 1.0) + eps))
    y = x * inv
    if HAS_W:
        y = y * tl.load(w_ptr + d, mask=m, other=0.0).to(tl.float32)
    if ROUND_BF16:
        y = round_bf16(y)
    tl.store(y_ptr + r0 * y_s0 + r1 * y_s1 + d, y.to(y_ptr.dtype.element_ty), mask=m)


def _rows(t: torch.Tensor):
    """(rows0, rows1, stride0, stride1) of a [..., D] tensor of up to 3 dims."""
    if t.dim() == 1:
        return 1, 1, 0, 0
    if t.dim() == 2:
        return t.shape[0], 1, t.stride(0), 0
    return t.shape[0], t.shape[1], t.stride(0), t.stride(1)


def _launch_rms(x, weight, eps, y):
    n0, n1, xs0, xs1 = _rows(x)
    _, _, ys0, ys1 = _rows(y)
    D = x.shape[-1]
    if n0 * n1 == 0:
        return
    _rms_norm_kernel[(n0 * n1,)](
        x, xs0, xs1, weight, y, ys0, ys1, n1, D, float(eps), HAS_W=weight is not None,
        ROUND_BF16=y.dtype == torch.bfloat16, BLOCK=triton.next_power_of_2(D),
        num_warps=4 if D >= 1024 else 2)


def _check_rms(name, x, weight, eps, y, xname="x", yname="y", wname="weight"):
    C.tensor(name, xname, x, _FLOATS)
    if not 1 <= x.dim() <= 3:
        C.fail(name, f"{xname}.dim()", "1, 2 or 3", x.dim())
    C.tensor(name, yname, y, _FLOATS, tuple(x.shape))
    C.optional(name, wname, weight, _FLOATS, (x.shape[-1],))
    if not (eps >= 0.0 and eps < float("inf")):
        C.fail(name, "eps", "a finite value >= 0", eps)


@op("rms_norm", "y = x * rsqrt(mean(x^2) + eps) * weight over the last dim (y may alias x)")
def rms_norm(x: torch.Tensor, weight: Optional[torch.Tensor], eps: float, y: torch.Tensor) -> None:
    name = "rms_norm"
    _check_rms(name, x, weight, eps, y)
    C.same_device(name, [("x", x), ("weight", weight), ("y", y)])
    if y.data_ptr() != x.data_ptr():
        C.disjoint(name, [("y", y)], [("x", x), ("weight", weight)])
    with device_guard(x):
        _launch_rms(x, weight, eps, y)


@op("fused_qkv_rms_norm", "q_out = RMSNorm(q_in; wq), kv_out = RMSNorm(kv_in; wkv)")
def fused_qkv_rms_norm(q_in: torch.Tensor, wq: torch.Tensor, kv_in: torch.Tensor,
                       wkv: torch.Tensor, eps: float, q_out: torch.Tensor,
                       kv_out: torch.Tensor) -> None:
    name = "fused_qkv_rms_norm"
    _check_rms(name, q_in, wq, eps, q_out, "q_in", "q_out", "wq")
    _check_rms(name, kv_in, wkv, eps, kv_out, "kv_in", "kv_out", "wkv")
    C.same_device(name, [("q_in", q_in), ("wq", wq), ("kv_in", kv_in), ("wkv", wkv),
                         ("q_out", q_out), ("kv_out", kv_out)])
    C.disjoint(name, [("q_out", q_out), ("kv_out", kv_out)],
               [("q_in", q_in), ("wq", wq), ("kv_in", kv_in), ("wkv", wkv)])
    with device_guard(q_in):
        _launch_rms(q_in, wq, eps, q_out)
        _launch_rms(kv_in, wkv, eps, kv_out)


@triton.jit
def _rope_kernel(x_ptr, x_s0, x_s1, pos_ptr, cs_ptr, cs_s0, max_pos, y_ptr, y_s0, y_s1, H, D,
                 R: tl.constexpr, NBP: tl.constexpr, INVERSE: tl.constexpr,
                 ROUND_BF16: tl.constexpr, HB: tl.constexpr):
    t = tl.program_id(0).to(tl.int64)
    h = tl.program_id(1) * HB + tl.arange(0, HB)[:, None, None]  # [HB, NBP, 32] tiles
    p = tl.load(pos_ptr + t).to(tl.int64)
    if (p >= 0) & (p < max_pos):
        dims, _, pair = pair_dims(NBP)
        m = (h < H) & (dims < D)
        src = x_ptr + t * x_s0 + h * x_s1
        even = tl.load(src + dims, mask=m, other=0.0).to(tl.float32)
        odd = tl.load(src + dims + 1, mask=m, other=0.0).to(tl.float32)
        even, odd = rope_rotate(even, odd, pair, cs_ptr + p * cs_s0, (D - R) // 2, R // 2,
                                INVERSE)
        if ROUND_BF16:
            even, odd = round_bf16(even), round_bf16(odd)
        dst = y_ptr + t * y_s0 + h * y_s1
        tl.store(dst + dims, even.to(y_ptr.dtype.element_ty), mask=m)
        tl.store(dst + dims + 1, odd.to(y_ptr.dtype.element_ty), mask=m)


@op("apply_rope", "GPT-J interleaved RoPE (inverse: conjugate) on the last R dims of each head")
def apply_rope(x: torch.Tensor, positions: torch.Tensor, cos_sin: torch.Tensor, inverse: bool,
               y: torch.Tensor) -> None:
    """x, y [T, D] or [T, H, D] bf16/fp32 (y may alias x). A token whose position is outside the
    table is left unwritten (as on CUDA; the CPU op rejects it)."""
    name = "apply_rope"
    C.tensor(name, "x", x, _FLOATS)
    if x.dim() not in (2, 3):
        C.fail(name, "x.dim()", "2 or 3", x.dim())
    C.tensor(name, "y", y, _FLOATS, tuple(x.shape))
    T, D = x.shape[0], x.shape[-1]
    C.tensor(name, "positions", positions, (torch.int32, torch.int64), (T,))
    C.tensor(name, "cos_sin", cos_sin, torch.float32, ndim=2)
    R = cos_sin.shape[1]
    if R < 2 or R % 2 or R > D or D % 2:
        C.fail(name, "cos_sin.shape[1] (rope dims R)", f"even, in [2, {D}] (D even)", R)
    C.same_device(name, [("x", x), ("positions", positions), ("cos_sin", cos_sin), ("y", y)])
    if y.data_ptr() != x.data_ptr():
        C.disjoint(name, [("y", y)], [("x", x), ("positions", positions), ("cos_sin", cos_sin)])
    H = x.shape[1] if x.dim() == 3 else 1
    if T * H == 0:
        return
    hb = heads_per_program(H, 4)
    with device_guard(x):
        _rope_kernel[(T, triton.cdiv(H, hb))](
            x, x.stride(0), x.stride(1) if x.dim() == 3 else 0, positions, cos_sin,
            cos_sin.stride(0), cos_sin.shape[0], y, y.stride(0), y.stride(1) if y.dim() == 3 else 0,
            H, D, R=R, NBP=triton.next_power_of_2(triton.cdiv(D, 64)), INVERSE=bool(inverse),
            ROUND_BF16=y.dtype == torch.bfloat16, HB=hb, num_warps=4)

"""The GEMMs of the Triton backend go through torch (cuBLAS / hipBLASLt / oneDNN), as the issue
asks: `linear` and `grouped_wo_a` with the torch.ops.dsv4 signatures, and `matmul_f32`, the
fp32-output product the layer uses.

FP8 operands (block-scaled weights, 1x128-scaled activations) are dequantized to bf16 first
with dequantize_fp8_blocks (exact for UE8M0 / power-of-two scales); the layer instead
dequantizes its weights once at construction. bf16 x bf16 products accumulate in fp32 and are
returned in fp32 where torch offers it (`out_dtype`, CUDA / ROCm); elsewhere the operands are
widened to fp32.
"""
from __future__ import annotations

import functools
from typing import Optional

import torch

from . import _checks as C
from .act_quant import dequantize_fp8_blocks
from .registry import op

_FP8 = torch.float8_e4m3fn


@functools.lru_cache(maxsize=None)
def _has_out_dtype(device_type: str) -> bool:
    """Whether torch.mm / torch.bmm take out_dtype=float32 for bf16 operands on this device."""
    try:
        a = torch.zeros((1, 1, 1), dtype=torch.bfloat16, device=device_type)
        torch.bmm(a, a, out_dtype=torch.float32)
        torch.mm(a[0], a[0], out_dtype=torch.float32)
        return True
    except (RuntimeError, TypeError, NotImplementedError):
        return False


def matmul_f32(a: torch.Tensor, b_t: torch.Tensor) -> torch.Tensor:
    """a [.., M, K] @ b_t [.., N, K]^T with fp32 accumulation, as fp32 ([M, N] or batched)."""
    if a.dtype == b_t.dtype == torch.bfloat16 and _has_out_dtype(a.device.type):
        if a.dim() == 2:
            return torch.mm(a, b_t.t(), out_dtype=torch.float32)
        return torch.bmm(a, b_t.transpose(-1, -2), out_dtype=torch.float32)
    return torch.matmul(a.float(), b_t.float().transpose(-1, -2))


def dequantized(op_name: str, name: str, w: torch.Tensor, scale: Optional[torch.Tensor],
                block_rows: int, block_cols: int) -> torch.Tensor:
    """w as bf16 (fp8 with its block scales dequantized; bf16 / fp32 passed through)."""
    if w.dtype != _FP8:
        if scale is not None:
            C.fail(op_name, f"{name}_scale", f"None for a {w.dtype} {name}", "a tensor")
        return w
    if scale is None:
        C.fail(op_name, f"{name}_scale", f"block scales for an fp8 {name}", None)
    y = torch.empty(w.shape, dtype=torch.bfloat16, device=w.device)
    dequantize_fp8_blocks(w, scale, block_rows, block_cols, y)
    return y


@op("linear", "y = x @ w^T (torch GEMM; FP8 operands dequantized to bf16 first)", impl="torch")
def linear(x: torch.Tensor, x_scale: Optional[torch.Tensor], w: torch.Tensor,
           w_scale: Optional[torch.Tensor], y: torch.Tensor) -> None:
    """ops.h linear: x [T, K] (bf16 / fp32, or fp8 with 1 x block scales), w [N, K] (bf16 / fp32,
    or fp8 with 128 x 128 block scales), y [T, N] bf16 / fp32."""
    name = "linear"
    C.tensor(name, "x", x, (torch.bfloat16, torch.float32, _FP8), ndim=2)
    C.tensor(name, "w", w, (torch.bfloat16, torch.float32, _FP8), ndim=2)
    if w.shape[1] != x.shape[1]:
        C.fail(name, "w.shape[1]", x.shape[1], w.shape[1])
    C.tensor(name, "y", y, (torch.bfloat16, torch.float32), (x.shape[0], w.shape[0]))
    C.same_device(name, [("x", x), ("x_scale", x_scale), ("w", w), ("w_scale", w_scale),
                         ("y", y)])
    xb = x
    if x.dtype == _FP8:
        if x_scale is None or x.shape[1] % x_scale.shape[1]:
            C.fail(name, "x_scale", "[T, K / block] for an fp8 x", x_scale)
        xb = dequantized(name, "x", x, x_scale, 1, x.shape[1] // x_scale.shape[1])
    wb = dequantized(name, "w", w, w_scale, 128, 128)
    if xb.dtype != wb.dtype:
        xb, wb = xb.float(), wb.float()
    y.copy_(matmul_f32(xb, wb))


@op("grouped_wo_a", "z[:, g] = o_g @ wo_a_g^T over G groups (one batched torch GEMM)",
    impl="torch")
def grouped_wo_a(o: torch.Tensor, o_scale: Optional[torch.Tensor], wo_a: torch.Tensor,
                 wo_a_scale: Optional[torch.Tensor], z: torch.Tensor) -> None:
    """ops.h grouped_wo_a: o [T, H*D] (or fp8 with [T, H*D/128] scales), wo_a [G, L, H*D/G]
    (or fp8 with [G, ceil(L/128), ceil(H*D/G/128)] scales), z [T, G*L]."""
    name = "grouped_wo_a"
    C.tensor(name, "o", o, (torch.bfloat16, torch.float32, _FP8), ndim=2)
    C.tensor(name, "wo_a", wo_a, (torch.bfloat16, torch.float32, _FP8), ndim=3)
    T, HD = o.shape
    G, L, per = wo_a.shape
    if G * per != HD:
        C.fail(name, "wo_a.shape", f"[G, L, {HD} / G]", list(wo_a.shape))
    C.tensor(name, "z", z, (torch.bfloat16, torch.float32), (T, G * L))
    C.same_device(name, [("o", o), ("o_scale", o_scale), ("wo_a", wo_a),
                         ("wo_a_scale", wo_a_scale), ("z", z)])
    ob = o
    if o.dtype == _FP8:
        if o_scale is None or HD % o_scale.shape[1]:
            C.fail(name, "o_scale", "[T, H*D / block] for an fp8 o", o_scale)
        ob = dequantized(name, "o", o, o_scale, 1, HD // o_scale.shape[1])
    wb = dequantized(name, "wo_a", wo_a, wo_a_scale, 128, 128)
    if ob.dtype != wb.dtype:
        ob, wb = ob.float(), wb.float()
    zg = matmul_f32(ob.reshape(T, G, per).transpose(0, 1), wb)  # [G, T, L]
    z.view(T, G, L).copy_(zg.transpose(0, 1))

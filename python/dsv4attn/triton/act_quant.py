"""FP8 activation quantization in Triton (ops.h quantize_act_fp8, dequantize_fp8_blocks) and the
output path's fused inverse RoPE + FP8 quant (ops.h inv_rope_fp8_quant; docs/spec.md §2 steps 5–6, vLLM's
fused_inv_rope_fp8_quant before wo_a).

Scales are UE8M0 powers of two per 1 x block values (block 64 or 128): 2^ceil(log2(max(amax /
448, 1e-4))), stored as ue8m0 bytes or fp32; codes fp8(x / scale). Codes and scales equal the
CPU reference's bit for bit (shared dtype.h rules) whenever the input values are equal.
"""
from __future__ import annotations

from typing import Optional

import torch
import triton
import triton.language as tl

from .._runtime import device_guard
from . import _checks as C
from ._formats import exp2_int, fp8_e4m3_to_f32, fp8_quantize, round_bf16, ue8m0_exponent, \
    ue8m0_to_f32
from ._pairs import block_amax, heads_per_program, pair_blocks_max_heads, pair_dims, rope_rotate
from .registry import op

_FP8 = torch.float8_e4m3fn
_UE8M0 = torch.float8_e8m0fnu
_SCALES = (torch.float32, _UE8M0)


def _bytes(t: torch.Tensor) -> torch.Tensor:
    """An fp8 / ue8m0 tensor's bytes (the kernels read and write codes as uint8)."""
    return t.view(torch.uint8)


@triton.jit
def _store_scales(s_ptr, k, mask, UE8M0: tl.constexpr):
    if UE8M0:
        tl.store(s_ptr, (k + 127).to(tl.uint8), mask=mask)
    else:
        tl.store(s_ptr, exp2_int(k), mask=mask)


@triton.jit
def _quantize_kernel(x_ptr, x_s0, q_ptr, q_s0, s_ptr, s_s0, K,
                     BLOCK: tl.constexpr, BLOCKS: tl.constexpr, UE8M0: tl.constexpr):
    t = tl.program_id(0).to(tl.int64)
    blk = tl.program_id(1) * BLOCKS + tl.arange(0, BLOCKS)
    c = blk[:, None] * BLOCK + tl.arange(0, BLOCK)[None, :]
    m = c < K
    x = tl.load(x_ptr + t * x_s0 + c, mask=m, other=0.0).to(tl.float32)
    k = ue8m0_exponent(tl.max(tl.abs(x), axis=1))
    codes, _ = fp8_quantize(x, k[:, None])
    tl.store(q_ptr + t * q_s0 + c, codes.to(tl.uint8), mask=m)
    _store_scales(s_ptr + t * s_s0 + blk, k, blk * BLOCK < K, UE8M0)


@op("quantize_act_fp8", "per-row FP8 e4m3 quantization with UE8M0 scales per 64 or 128 values")
def quantize_act_fp8(x: torch.Tensor, block: int, xq: torch.Tensor, scale: torch.Tensor) -> None:
    """x [T, K] bf16/fp32 -> xq [T, K] fp8_e4m3, scale [T, K / block] ue8m0 or fp32."""
    name = "quantize_act_fp8"
    if block not in (64, 128):
        C.fail(name, "block", "64 or 128", block)
    C.tensor(name, "x", x, (torch.bfloat16, torch.float32), ndim=2)
    T, K = x.shape
    if K % block:
        C.fail(name, "x.shape[1]", f"a multiple of block {block}", K)
    C.tensor(name, "xq", xq, _FP8, (T, K))
    C.tensor(name, "scale", scale, _SCALES, (T, K // block))
    C.same_device(name, [("x", x), ("xq", xq), ("scale", scale)])
    C.disjoint(name, [("xq", xq), ("scale", scale)], [("x", x)])
    if T * K == 0:
        return
    blocks = max(1, min(16, K // block))
    with device_guard(x):
        _quantize_kernel[(T, triton.cdiv(K // block, blocks))](
            x, x.stride(0), _bytes(xq), xq.stride(0), _bytes(scale) if scale.dtype == _UE8M0
            else scale, scale.stride(0), K, BLOCK=block, BLOCKS=blocks,
            UE8M0=scale.dtype == _UE8M0, num_warps=4)


@triton.jit
def _inv_rope_quant_kernel(o_ptr, o_s0, o_s1, pos_ptr, cs_ptr, cs_s0, max_pos,
                           q_ptr, q_s0, s_ptr, s_s0, s_s1, dq_ptr, dq_s0, H,
                           D: tl.constexpr, R: tl.constexpr, NBP: tl.constexpr,
                           QBLOCK: tl.constexpr, UE8M0: tl.constexpr, HAS_DQ: tl.constexpr,
                           HB: tl.constexpr):
    t = tl.program_id(0).to(tl.int64)
    p = tl.load(pos_ptr + t).to(tl.int64)
    # A token whose position is outside the table is left unwritten (the CPU op rejects it).
    if (p >= 0) & (p < max_pos):
        h = tl.program_id(1) * HB + tl.arange(0, HB)[:, None, None]  # [HB, NBP, 32] tiles
        dims, _, pair = pair_dims(NBP)
        m = (h < H) & (dims < D)
        src = o_ptr + t * o_s0 + h * o_s1
        even = tl.load(src + dims, mask=m, other=0.0).to(tl.float32)
        odd = tl.load(src + dims + 1, mask=m, other=0.0).to(tl.float32)
        even, odd = rope_rotate(even, odd, pair, cs_ptr + p * cs_s0, (D - R) // 2, R // 2, True)
        # The rotated o is what the layer quantizes: rounded to bf16 first (apply_rope's output).
        even, odd = round_bf16(even), round_bf16(odd)
        amax = block_amax(even, odd)  # [HB, NBP]: one value per 64 dims
        if QBLOCK == 128:
            amax = pair_blocks_max_heads(amax, HB, NBP)
        kb = ue8m0_exponent(amax)
        ce, qe = fp8_quantize(even, kb[:, :, None])
        co, qo = fp8_quantize(odd, kb[:, :, None])
        col = h * D + dims
        tl.store(q_ptr + t * q_s0 + col, ce.to(tl.uint8), mask=m)
        tl.store(q_ptr + t * q_s0 + col + 1, co.to(tl.uint8), mask=m)
        bb = tl.arange(0, NBP)[None, :]
        h2 = tl.program_id(1) * HB + tl.arange(0, HB)[:, None]
        first = (bb % (QBLOCK // 64) == 0) & (bb * 64 < D)  # one row per scale block
        _store_scales(s_ptr + t * s_s0 + ((h2 * D + bb * 64) // QBLOCK) * s_s1, kb,
                      (h2 < H) & first, UE8M0)
        if HAS_DQ:
            tl.store(dq_ptr + t * dq_s0 + col, qe.to(tl.bfloat16), mask=m)
            tl.store(dq_ptr + t * dq_s0 + col + 1, qo.to(tl.bfloat16), mask=m)


@op("inv_rope_fp8_quant", "output path: inverse RoPE on o, then FP8 quant (1 x block, UE8M0)")
def inv_rope_fp8_quant(o: torch.Tensor, positions: torch.Tensor, cos_sin: torch.Tensor,
                       block: int, o_fp8: torch.Tensor, o_scale: torch.Tensor, *,
                       o_dequant: Optional[torch.Tensor] = None) -> None:
    """ops.h inv_rope_fp8_quant: o [T, H, D] bf16 (read only) -> o_fp8 [T, H*D] fp8_e4m3 and
    o_scale [T, H*D/block] ue8m0/fp32 (any strides) of the inverse-rotated o, each value rounded
    to bf16 first (what apply_rope writes), block 64 or 128 dividing D; a token whose position is
    outside the table is left unwritten. Optional o_dequant [T, H*D] bf16 = fp8(o_fp8) * scale
    (exact), the operand of a bf16 wo_a GEMM (this backend's GEMMs are bf16)."""
    name = "inv_rope_fp8_quant"
    if block not in (64, 128):
        C.fail(name, "block", "64 or 128", block)
    C.tensor(name, "o", o, torch.bfloat16, ndim=3)
    T, H, D = o.shape
    if D % block:
        C.fail(name, "o.shape[2]", f"a multiple of block {block}", D)
    C.tensor(name, "positions", positions, (torch.int32, torch.int64), (T,))
    C.tensor(name, "cos_sin", cos_sin, torch.float32, ndim=2)
    R = cos_sin.shape[1]
    if R < 2 or R % 2 or R > D:
        C.fail(name, "cos_sin.shape[1] (rope dims R)", f"even, in [2, {D}]", R)
    C.tensor(name, "o_fp8", o_fp8, _FP8, (T, H * D))
    C.tensor(name, "o_scale", o_scale, _SCALES, (T, H * D // block), last_dim_contiguous=False)
    C.optional(name, "o_dequant", o_dequant, torch.bfloat16, (T, H * D))
    C.same_device(name, [("o", o), ("positions", positions), ("cos_sin", cos_sin),
                         ("o_fp8", o_fp8), ("o_scale", o_scale), ("o_dequant", o_dequant)])
    C.disjoint(name, [("o_fp8", o_fp8), ("o_scale", o_scale), ("o_dequant", o_dequant)],
               [("o", o), ("positions", positions), ("cos_sin", cos_sin)])
    if T * H == 0:
        return
    ue = o_scale.dtype == _UE8M0
    hb = heads_per_program(H, 4)
    with device_guard(o):
        _inv_rope_quant_kernel[(T, triton.cdiv(H, hb))](
            o, o.stride(0), o.stride(1), positions, cos_sin, cos_sin.stride(0), cos_sin.shape[0],
            _bytes(o_fp8), o_fp8.stride(0), _bytes(o_scale) if ue else o_scale,
            o_scale.stride(0), o_scale.stride(1), o_dequant,
            o_dequant.stride(0) if o_dequant is not None else 0, H,
            D=D, R=R, NBP=triton.next_power_of_2(D // 64), QBLOCK=block, UE8M0=ue,
            HAS_DQ=o_dequant is not None, HB=hb, num_warps=4)


@triton.jit
def _dequant_blocks_kernel(x_ptr, x_sg, x_s0, s_ptr, s_sg, s_s0, y_ptr, y_sg, y_s0, R, Cn,
                           BR: tl.constexpr, BC: tl.constexpr, UE8M0: tl.constexpr,
                           TILE_R: tl.constexpr, TILE_C: tl.constexpr):
    g = tl.program_id(2).to(tl.int64)
    r = tl.program_id(0) * TILE_R + tl.arange(0, TILE_R)
    c = tl.program_id(1) * TILE_C + tl.arange(0, TILE_C)
    m = (r < R)[:, None] & (c < Cn)[None, :]
    r64 = r.to(tl.int64)[:, None]
    codes = tl.load(x_ptr + g * x_sg + r64 * x_s0 + c[None, :], mask=m, other=0)
    sp = s_ptr + g * s_sg + (r64 // BR) * s_s0 + (c // BC)[None, :]
    if UE8M0:
        sc = ue8m0_to_f32(tl.load(sp, mask=m, other=127))
    else:
        sc = tl.load(sp, mask=m, other=1.0)
    y = fp8_e4m3_to_f32(codes) * sc
    if y_ptr.dtype.element_ty == tl.bfloat16:
        y = round_bf16(y)
    tl.store(y_ptr + g * y_sg + r64 * y_s0 + c[None, :], y.to(y_ptr.dtype.element_ty), mask=m)


@op("dequantize_fp8_blocks", "block-scaled FP8 -> bf16/fp32 (weights 128x128, activations 1x128)")
def dequantize_fp8_blocks(x: torch.Tensor, scale: torch.Tensor, block_rows: int, block_cols: int,
                          y: torch.Tensor) -> None:
    """ops.h dequantize_fp8_blocks: x fp8 [R, C] or [G, R, C], scale ue8m0/fp32
    [(G,) ceil(R/block_rows), ceil(C/block_cols)], y bf16/fp32 shaped like x."""
    name = "dequantize_fp8_blocks"
    C.positive(name, "block_rows", block_rows)
    C.positive(name, "block_cols", block_cols)
    C.tensor(name, "x", x, _FP8)
    if x.dim() not in (2, 3):
        C.fail(name, "x.dim()", "2 or 3", x.dim())
    lead = tuple(x.shape[:-2])
    R, Cn = x.shape[-2], x.shape[-1]
    C.tensor(name, "scale", scale, _SCALES,
             lead + (triton.cdiv(R, block_rows), triton.cdiv(Cn, block_cols)))
    C.tensor(name, "y", y, (torch.bfloat16, torch.float32), tuple(x.shape))
    C.same_device(name, [("x", x), ("scale", scale), ("y", y)])
    C.disjoint(name, [("y", y)], [("x", x), ("scale", scale)])
    G = lead[0] if lead else 1
    if G * R * Cn == 0:
        return

    def sg(t):
        return t.stride(0) if t.dim() == 3 else 0

    ue = scale.dtype == _UE8M0
    tr, tc = 32, 64
    with device_guard(x):
        _dequant_blocks_kernel[(triton.cdiv(R, tr), triton.cdiv(Cn, tc), G)](
            _bytes(x), sg(x), x.stride(-2), _bytes(scale) if ue else scale, sg(scale),
            scale.stride(-2), y, sg(y), y.stride(-2), R, Cn, BR=block_rows, BC=block_cols,
            UE8M0=ue, TILE_R=tr, TILE_C=tc, num_warps=4)

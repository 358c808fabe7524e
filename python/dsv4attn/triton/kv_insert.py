"""The fused q-norm + RoPE + KV quant/insert (ops.h qnorm_rope_kv_insert, vLLM
fused_qnorm_rope_kv_insert) in one Triton kernel.

Grid (T, ceil(H / HB) + 1): program (t, j) normalizes heads [j*HB, j*HB + HB) of token t
(RMSNorm without weight) and rotates their last R dims in place; the last program of a token
rotates kv[t]'s last R dims, encodes the token in the cache's layout at slot_mapping[t] and
overwrites kv[t] with exactly what the cache holds (dequantized), so the caller attends to the
cached values. Encoding (kv_layout.h):

  MODEL1_FP8 : 7 blocks of 64 nope dims -> fp8 with one UE8M0 byte each (+ a zero pad byte),
               64 rope dims -> bf16.
  V32_FP8    : 4 blocks of 128 nope dims -> fp8 with one fp32 power-of-two scale each, 64 rope
               dims -> bf16.
  BF16       : every dim bf16.   FP8_PER_TENSOR: fp8(x * (1 / tensor_scale)).

Data the CPU reference rejects is handled as on CUDA: a slot that is -1 or outside the cache is
not stored (kv still gets the quantize-dequantize), a token whose position is outside the cos/sin
table is skipped (q, kv and cache untouched); two tokens on one slot leave it unspecified.
"""
from __future__ import annotations

import torch
import triton
import triton.language as tl

from .._runtime import device_guard
from . import _checks as C
from ._formats import round_bf16
from ._pairs import heads_per_program, pair_dims, rms_inverse, rope_rotate
from .kv_cache import MODEL1_FP8, V32_FP8, CacheArg, store_kv_token
from .registry import op


@triton.jit
def _qnorm_rope_kv_insert_kernel(
        q_ptr, q_s0, q_s1, kv_ptr, kv_s0, pos_ptr, cs_ptr, cs_s0, max_pos, slot_ptr, eps, H,
        u8, bf, f32, block_stride, block_size, num_blocks, tensor_scale, inv_tensor_scale,
        D: tl.constexpr, R: tl.constexpr, NBP: tl.constexpr, LAYOUT: tl.constexpr,
        HB: tl.constexpr):
    t = tl.program_id(0)
    hb = tl.program_id(1)
    p = tl.load(pos_ptr + t).to(tl.int64)
    if (p >= 0) & (p < max_pos):
        dims, _, pair = pair_dims(NBP)
        inrow = dims < D
        cs_row = cs_ptr + p * cs_s0
        first = (D - R) // 2
        if hb * HB < H:
            # Heads [hb*HB, hb*HB + HB): [HB, NBP, 32] tiles.
            # (The two branches use distinct names: Triton merges same-named values after an if.)
            h = hb * HB + tl.arange(0, HB)[:, None, None]
            m = (h < H) & inrow
            q_row = q_ptr + t.to(tl.int64) * q_s0 + h * q_s1
            q_even = tl.load(q_row + dims, mask=m, other=0.0).to(tl.float32)
            q_odd = tl.load(q_row + dims + 1, mask=m, other=0.0).to(tl.float32)
            inv = rms_inverse(q_even, q_odd, D, eps)[:, None, None]
            q_even, q_odd = rope_rotate(q_even * inv, q_odd * inv, pair, cs_row, first, R // 2,
                                        False)
            tl.store(q_row + dims, round_bf16(q_even).to(tl.bfloat16), mask=m)
            tl.store(q_row + dims + 1, round_bf16(q_odd).to(tl.bfloat16), mask=m)
        else:
            kv_row = kv_ptr + t.to(tl.int64) * kv_s0
            even = tl.load(kv_row + dims, mask=inrow, other=0.0).to(tl.float32)
            odd = tl.load(kv_row + dims + 1, mask=inrow, other=0.0).to(tl.float32)
            even, odd = rope_rotate(even, odd, pair, cs_row, first, R // 2, False)
            slot = tl.load(slot_ptr + t).to(tl.int64)
            even, odd = store_kv_token(even, odd, slot, u8, bf, f32, block_stride, block_size,
                                       num_blocks, tensor_scale, inv_tensor_scale, D, NBP, LAYOUT)
            tl.store(kv_row + dims, round_bf16(even).to(tl.bfloat16), mask=inrow)
            tl.store(kv_row + dims + 1, round_bf16(odd).to(tl.bfloat16), mask=inrow)


@op("qnorm_rope_kv_insert", "q head-norm + RoPE, kv RoPE + quantized paged insert, kv <- cached")
def qnorm_rope_kv_insert(q: torch.Tensor, kv: torch.Tensor, positions: torch.Tensor,
                         cos_sin: torch.Tensor, eps: float, cache: torch.Tensor, layout: str,
                         block_size: int, tensor_scale: float, slot_mapping: torch.Tensor) -> None:
    """torch.ops.dsv4.qnorm_rope_kv_insert's contract (ops.h): q [T, H, D] bf16 and kv [T, D]
    bf16 in place, positions / slot_mapping [T] int32/int64, cos_sin fp32 [max_pos, R]."""
    name = "qnorm_rope_kv_insert"
    c = CacheArg(name, "cache", cache, layout, block_size, tensor_scale)
    C.tensor(name, "q", q, torch.bfloat16, ndim=3)
    T, H, D = q.shape
    if D != c.dim:
        C.fail(name, "q.shape[2]", f"{c.dim} (the dim of layout {layout})", D)
    C.tensor(name, "kv", kv, torch.bfloat16, (T, D))
    C.tensor(name, "positions", positions, (torch.int32, torch.int64), (T,))
    C.tensor(name, "slot_mapping", slot_mapping, (torch.int32, torch.int64), (T,))
    C.tensor(name, "cos_sin", cos_sin, torch.float32, ndim=2)
    R = cos_sin.shape[1]
    if R < 2 or R % 2 or R > D or R % 64:
        C.fail(name, "cos_sin.shape[1] (rope dims R)", "a multiple of 64 in [64, D]", R)
    if not (eps >= 0.0 and eps < float("inf")):
        C.fail(name, "eps", "a finite value >= 0", eps)
    C.same_device(name, [("q", q), ("kv", kv), ("positions", positions), ("cos_sin", cos_sin),
                         ("cache", cache), ("slot_mapping", slot_mapping)])
    C.disjoint(name, [("q", q), ("kv", kv), ("cache", cache)],
               [("positions", positions), ("cos_sin", cos_sin), ("slot_mapping", slot_mapping)])
    if c.code in (MODEL1_FP8, V32_FP8) and R != 64:
        C.fail(name, "cos_sin.shape[1] (rope dims R)", f"64 (the rope dims of {layout})", R)
    if T == 0:
        return
    inv = float(torch.tensor(1.0, dtype=torch.float32) / torch.tensor(c.tensor_scale,
                                                                      dtype=torch.float32))
    nbp = triton.next_power_of_2(D // 64)
    hb = heads_per_program(H, 4)
    with device_guard(q):
        _qnorm_rope_kv_insert_kernel[(T, triton.cdiv(H, hb) + 1)](
            q, q.stride(0), q.stride(1), kv, kv.stride(0), positions, cos_sin, cos_sin.stride(0),
            cos_sin.shape[0], slot_mapping, float(eps), H, *c.kernel_args(), inv,
            D=D, R=R, NBP=nbp, LAYOUT=c.code, HB=hb, num_warps=4)

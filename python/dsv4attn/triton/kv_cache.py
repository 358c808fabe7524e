"""Paged KV caches in Triton: the byte layouts of include/dsv4/kv_layout.h as kernels read them
(`load_kv_values`, fused into sparse decode and the gather), and the prefill gather
`dequantize_and_gather` (vLLM dequantize_and_gather_k_cache), plus `kv_dequantize`.

A cache is uint8 [num_blocks, >= block_bytes] (rows may be padded: any row stride whose last dim
is contiguous; the stride must keep the fp32 scales and bf16 rope dims aligned, i.e. be a
multiple of 4). Kernels get three typed pointers to the same bytes (uint8, int16 holding bf16 bit
patterns, fp32) and index each in its own units.

    MODEL1_FP8 (d 512): block = [B x 576 B: 448 fp8 nope + 64 bf16 rope][B x 8 B: 7 UE8M0 + pad]
    V32_FP8    (d 576): per token 656 B: 512 fp8 | 4 fp32 scales (per 128) | 64 bf16 rope
    BF16       (d 512): 512 bf16 per token
    FP8_PER_TENSOR (d 512): 512 fp8 per token, value = fp8 * tensor_scale
"""
from __future__ import annotations

from typing import Optional

import torch
import triton
import triton.language as tl

from .._runtime import device_guard
from . import _checks as C
from ._formats import bf16_bits_to_f32, exp2_int, f32_to_bf16_bits, f32_to_fp8_e4m3, \
    fp8_e4m3_to_f32, fp8_quantize, round_bf16, ue8m0_exponent, ue8m0_to_f32
from ._pairs import block_amax, pair_blocks_max, pair_dims
from .registry import op

# Layout codes (constexpr in the kernels) and their geometry.
MODEL1_FP8, V32_FP8, BF16, FP8_PER_TENSOR = 0, 1, 2, 3
_CODES = {"model1_fp8": MODEL1_FP8, "v32_fp8": V32_FP8, "bf16": BF16,
          "fp8_per_tensor": FP8_PER_TENSOR}
_DIM = {MODEL1_FP8: 512, V32_FP8: 576, BF16: 512, FP8_PER_TENSOR: 512}
_TOKEN_BYTES = {MODEL1_FP8: 584, V32_FP8: 656, BF16: 1024, FP8_PER_TENSOR: 512}


def layout_code(op_name: str, arg: str, layout: str) -> int:
    code = _CODES.get(str(layout).lower())
    if code is None:
        C.fail(op_name, arg, "one of model1_fp8, v32_fp8, bf16, fp8_per_tensor", repr(layout))
    return code


def layout_dim(code: int) -> int:
    return _DIM[code]


def block_bytes(code: int, block_size: int) -> int:
    """Bytes of one block (MODEL1_FP8 blocks are padded to a multiple of 576)."""
    raw = block_size * _TOKEN_BYTES[code]
    return (raw + 575) // 576 * 576 if code == MODEL1_FP8 else raw


class CacheArg:
    """A validated paged cache: the byte tensor, its layout and the views the kernels take."""

    def __init__(self, op_name: str, name: str, cache: torch.Tensor, layout: str, block_size: int,
                 tensor_scale: float = 1.0):
        self.code = layout_code(op_name, f"{name} layout", layout)
        C.positive(op_name, f"{name} block_size", block_size)
        C.tensor(op_name, name, cache, torch.uint8, ndim=2)
        need = block_bytes(self.code, block_size)
        if cache.shape[1] < need:
            C.fail(op_name, f"{name}.shape[1] (block bytes)",
                   f">= {need} ({layout} x {block_size} tokens)", cache.shape[1])
        if cache.shape[0] > 1 and cache.stride(0) % 4 != 0:
            C.fail(op_name, f"{name}.stride(0)", "a multiple of 4 bytes", cache.stride(0))
        if cache.data_ptr() % 16 != 0:
            C.fail(op_name, f"{name}.data_ptr()", "16-byte aligned", hex(cache.data_ptr()))
        if self.code == FP8_PER_TENSOR and not (0.0 < tensor_scale < float("inf")):
            C.fail(op_name, f"{name} tensor_scale", "a finite value > 0", tensor_scale)
        self.cache = cache
        self.block_size = int(block_size)
        self.tensor_scale = float(tensor_scale)
        self.dim = _DIM[self.code]
        self.num_blocks = cache.shape[0]
        self.block_stride = cache.stride(0) if cache.shape[0] > 1 else cache.shape[1]
        # The same bytes as bf16 and fp32 elements (flat, so any block stride works).
        # (Its length is rounded down to whole fp32 words: the bytes dropped are row padding.)
        span = ((self.num_blocks - 1) * self.block_stride + cache.shape[1]) // 4 * 4 \
            if self.num_blocks > 0 else 0
        flat = torch.as_strided(cache, (span,), (1,))
        self.u8 = flat
        self.bf16 = flat.view(torch.int16)  # bf16 bit patterns
        self.f32 = flat.view(torch.float32)

    def kernel_args(self):
        """(u8, bf16, f32, block_stride, block_size, num_blocks, tensor_scale) for a kernel."""
        return (self.u8, self.bf16, self.f32, self.block_stride, self.block_size, self.num_blocks,
                self.tensor_scale)


@triton.jit
def load_kv_values(u8, bf, f32, slot, valid, dims, block_stride, block_size, tensor_scale,
                   LAYOUT: tl.constexpr):
    """fp32 [BN, DD]: dims `dims` [DD] of the tokens at global slots `slot` [BN] (rows with
    valid False read nothing and are 0), dequantized as kv_layout.h kv_decode_value does."""
    s = tl.where(valid, slot, 0).to(tl.int64)
    blk = s // block_size
    off = s % block_size
    base = blk * block_stride
    d = dims[None, :]
    v = valid[:, None]
    if LAYOUT == 0:  # MODEL1_FP8
        row = (base + off * 576)[:, None]
        nope = d < 448
        code = tl.load(u8 + row + d, mask=v & nope, other=0)
        sc = tl.load(u8 + (base + block_size * 576 + off * 8)[:, None] + d // 64,
                     mask=v & nope, other=127)
        rope = tl.load(bf + (row + 448) // 2 + (d - 448), mask=v & (d >= 448), other=0)
        val = tl.where(nope, fp8_e4m3_to_f32(code) * ue8m0_to_f32(sc), bf16_bits_to_f32(rope))
    elif LAYOUT == 1:  # V32_FP8
        row = (base + off * 656)[:, None]
        nope = d < 512
        code = tl.load(u8 + row + d, mask=v & nope, other=0)
        sc = tl.load(f32 + (row + 512) // 4 + d // 128, mask=v & nope, other=1.0)
        rope = tl.load(bf + (row + 528) // 2 + (d - 512), mask=v & (d >= 512), other=0)
        # The fp32 scale read as bf16 (docs/spec.md §7; exact for UE8M0 scales).
        val = tl.where(nope, fp8_e4m3_to_f32(code) * round_bf16(sc), bf16_bits_to_f32(rope))
    elif LAYOUT == 2:  # BF16
        row = (base + off * 1024)[:, None]
        val = bf16_bits_to_f32(tl.load(bf + row // 2 + d, mask=v, other=0))
    else:  # FP8_PER_TENSOR
        row = (base + off * 512)[:, None]
        code = tl.load(u8 + row + d, mask=v, other=0)
        val = fp8_e4m3_to_f32(code) * tensor_scale
    return tl.where(v, val, 0.0)


@triton.jit
def store_kv_token(even, odd, slot, u8, bf, f32, block_stride, block_size, num_blocks,
                   tensor_scale, inv_tensor_scale, D: tl.constexpr, NBP: tl.constexpr,
                   LAYOUT: tl.constexpr):
    """Encodes one token (fp32 pair tiles of _pairs.py, dims < D) at global slot `slot` in the
    cache's layout, as kv_layout.h kv_encode_token does, and returns the values the cache now
    holds (dequantized). A slot that is negative or outside the cache is not stored (the values
    are still returned)."""
    dims, _, _ = pair_dims(NBP)
    b = dims // 64  # the 64-wide block of each pair (full tile shape, for masks)
    inrow = dims < D
    store = (slot >= 0) & (slot // block_size < num_blocks)
    st = tl.where(store, inrow, False)  # (a scalar & a tensor mask trips the interpreter)
    s = tl.where(store, slot, 0)
    base = (s // block_size) * block_stride
    off = s % block_size
    if LAYOUT == 0:  # MODEL1_FP8: 7 fp8 blocks of 64 + 64 bf16 rope dims
        nope = b < 7
        kb = ue8m0_exponent(block_amax(even, odd))
        k = kb[:, None]
        ce, qe = fp8_quantize(even, k)
        co, qo = fp8_quantize(odd, k)
        tok = base + off * 576
        tl.store(u8 + tok + dims, ce.to(tl.uint8), mask=st & nope)
        tl.store(u8 + tok + dims + 1, co.to(tl.uint8), mask=st & nope)
        bb = tl.arange(0, NBP)
        scale_bytes = tl.where(bb < 7, kb + 127, 0)
        tl.store(u8 + base + block_size * 576 + off * 8 + bb, scale_bytes.to(tl.uint8),
                 mask=tl.where(store, bb < 8, False))
        re, ro = round_bf16(even), round_bf16(odd)
        tl.store(bf + (tok + 448) // 2 + dims - 448, f32_to_bf16_bits(re),
                 mask=st & (b == 7))
        tl.store(bf + (tok + 448) // 2 + dims - 447, f32_to_bf16_bits(ro),
                 mask=st & (b == 7))
        even = tl.where(nope, qe, re)
        odd = tl.where(nope, qo, ro)
    elif LAYOUT == 1:  # V32_FP8: 4 fp8 blocks of 128 (+ fp32 scales) + 64 bf16 rope
        nope = b < 8
        kb = ue8m0_exponent(pair_blocks_max(block_amax(even, odd), NBP))
        k = kb[:, None]
        ce, qe = fp8_quantize(even, k)
        co, qo = fp8_quantize(odd, k)
        tok = base + off * 656
        tl.store(u8 + tok + dims, ce.to(tl.uint8), mask=st & nope)
        tl.store(u8 + tok + dims + 1, co.to(tl.uint8), mask=st & nope)
        bb = tl.arange(0, NBP)
        tl.store(f32 + (tok + 512) // 4 + bb // 2, exp2_int(kb),
                 mask=tl.where(store, (bb < 8) & (bb % 2 == 0), False))
        re, ro = round_bf16(even), round_bf16(odd)
        tl.store(bf + (tok + 528) // 2 + dims - 512, f32_to_bf16_bits(re),
                 mask=st & (b == 8))
        tl.store(bf + (tok + 528) // 2 + dims - 511, f32_to_bf16_bits(ro),
                 mask=st & (b == 8))
        even = tl.where(nope, qe, re)
        odd = tl.where(nope, qo, ro)
    elif LAYOUT == 2:  # BF16
        even, odd = round_bf16(even), round_bf16(odd)
        tok = (base + off * 1024) // 2
        tl.store(bf + tok + dims, f32_to_bf16_bits(even), mask=st)
        tl.store(bf + tok + dims + 1, f32_to_bf16_bits(odd), mask=st)
    else:  # FP8_PER_TENSOR
        ce = f32_to_fp8_e4m3(even * inv_tensor_scale)
        co = f32_to_fp8_e4m3(odd * inv_tensor_scale)
        tok = base + off * 512
        tl.store(u8 + tok + dims, ce.to(tl.uint8), mask=st)
        tl.store(u8 + tok + dims + 1, co.to(tl.uint8), mask=st)
        even = fp8_e4m3_to_f32(ce) * tensor_scale
        odd = fp8_e4m3_to_f32(co) * tensor_scale
    return even, odd


@triton.jit
def _gather_kernel(u8, bf, f32, block_stride, block_size, num_blocks, tensor_scale,
                   table_ptr, table_s0, max_blocks, seq_ptr, glen_ptr, offset, rows,
                   ws_ptr, ws_s0, ws_s1,
                   LAYOUT: tl.constexpr, HAS_GLEN: tl.constexpr, D_MAIN: tl.constexpr,
                   D_TAIL: tl.constexpr, BLOCK_ROWS: tl.constexpr):
    r = tl.program_id(0)
    j = tl.program_id(1) * BLOCK_ROWS + tl.arange(0, BLOCK_ROWS)
    seq = tl.load(seq_ptr + r)
    g = seq
    if HAS_GLEN:
        g = tl.load(glen_ptr + r)
    # Rows the CPU reference would reject are skipped (left untouched), never read out of bounds.
    ok = (seq >= 0) & (g >= 0) & (g <= seq)
    entry = (seq - g + j).to(tl.int64)
    bidx = entry // block_size
    valid = tl.where(ok, (j < g) & (j < rows - offset) & (bidx < max_blocks), False)
    block = tl.load(table_ptr + r * table_s0 + bidx, mask=valid, other=-1)
    valid = valid & (block >= 0) & (block < num_blocks)
    slot = block.to(tl.int64) * block_size + entry % block_size
    dst = ws_ptr + r * ws_s0 + (offset + j.to(tl.int64))[:, None] * ws_s1
    dm = tl.arange(0, D_MAIN)
    x = load_kv_values(u8, bf, f32, slot, valid, dm, block_stride, block_size, tensor_scale, LAYOUT)
    tl.store(dst + dm[None, :], f32_to_bf16_bits(x), mask=valid[:, None])
    if D_TAIL > 0:
        dt = D_MAIN + tl.arange(0, D_TAIL)
        x = load_kv_values(u8, bf, f32, slot, valid, dt, block_stride, block_size, tensor_scale,
                           LAYOUT)
        tl.store(dst + dt[None, :], f32_to_bf16_bits(x), mask=valid[:, None])


@op("dequantize_and_gather", "prefill gather: a request's last g cache entries -> bf16 rows")
def dequantize_and_gather(cache: torch.Tensor, layout: str, block_size: int, tensor_scale: float,
                          block_table: torch.Tensor, seq_lens: torch.Tensor,
                          gather_lens: Optional[torch.Tensor], offset: int,
                          workspace: torch.Tensor) -> None:
    """For request r: entries [seq_lens[r] - g, seq_lens[r]) (g = gather_lens[r], or seq_lens[r])
    dequantized to workspace[r, offset + j] (bf16 [R, M, d]). Data the CPU rejects (lengths out
    of range, unmapped blocks, rows past M) is skipped, as on CUDA (ops.h)."""
    name = "dequantize_and_gather"
    c = CacheArg(name, "cache", cache, layout, block_size, tensor_scale)
    C.tensor(name, "workspace", workspace, torch.bfloat16, (-1, -1, c.dim))
    R, M = workspace.shape[0], workspace.shape[1]
    C.tensor(name, "block_table", block_table, torch.int32, (R, -1))
    C.tensor(name, "seq_lens", seq_lens, torch.int32, (R,))
    C.optional(name, "gather_lens", gather_lens, torch.int32, (R,))
    if not 0 <= offset <= M:
        C.fail(name, "offset", f"a value in [0, {M}]", offset)
    C.same_device(name, [("cache", cache), ("workspace", workspace), ("block_table", block_table),
                         ("seq_lens", seq_lens), ("gather_lens", gather_lens)])
    C.disjoint(name, [("workspace", workspace)], [("cache", cache), ("block_table", block_table)])
    if R == 0 or M == 0:
        return
    block_rows = 8
    grid = (R, triton.cdiv(M, block_rows))
    with device_guard(cache):
        _gather_kernel[grid](
            *c.kernel_args(), block_table, block_table.stride(0),
            block_table.shape[1], seq_lens, gather_lens if gather_lens is not None else seq_lens,
            offset, M, workspace.view(torch.int16), workspace.stride(0), workspace.stride(1),
            LAYOUT=c.code, HAS_GLEN=gather_lens is not None, D_MAIN=512,
            D_TAIL=c.dim - 512, BLOCK_ROWS=block_rows)


@triton.jit
def _dequantize_kernel(u8, bf, f32, block_stride, block_size, num_blocks, tensor_scale,
                       slots_ptr, n, out_ptr, out_s0, LAYOUT: tl.constexpr,
                       D_MAIN: tl.constexpr, D_TAIL: tl.constexpr, BLOCK_ROWS: tl.constexpr):
    i = tl.program_id(0) * BLOCK_ROWS + tl.arange(0, BLOCK_ROWS)
    inb = i < n
    slot = tl.load(slots_ptr + i, mask=inb, other=-1).to(tl.int64)
    valid = inb & (slot >= 0) & (slot // block_size < num_blocks)
    dst = out_ptr + i.to(tl.int64)[:, None] * out_s0
    dm = tl.arange(0, D_MAIN)
    x = load_kv_values(u8, bf, f32, slot, valid, dm, block_stride, block_size, tensor_scale, LAYOUT)
    tl.store(dst + dm[None, :], x.to(out_ptr.dtype.element_ty), mask=inb[:, None])
    if D_TAIL > 0:
        dt = D_MAIN + tl.arange(0, D_TAIL)
        x = load_kv_values(u8, bf, f32, slot, valid, dt, block_stride, block_size, tensor_scale,
                           LAYOUT)
        tl.store(dst + dt[None, :], x.to(out_ptr.dtype.element_ty), mask=inb[:, None])


@op("kv_dequantize", "the tokens at global slots -> fp32 rows (-1 or outside the cache -> 0)")
def kv_dequantize(cache: torch.Tensor, layout: str, block_size: int, tensor_scale: float,
                  slots: torch.Tensor, out: torch.Tensor) -> None:
    """out [n, d] fp32 = the dequantized tokens at slots [n] (int32/int64); -1 and slots outside
    the cache give rows of zeros (the CPU op rejects the latter)."""
    name = "kv_dequantize"
    c = CacheArg(name, "cache", cache, layout, block_size, tensor_scale)
    C.tensor(name, "slots", slots, (torch.int32, torch.int64), ndim=1)
    C.tensor(name, "out", out, torch.float32, (slots.shape[0], c.dim))
    C.same_device(name, [("cache", cache), ("slots", slots), ("out", out)])
    n = slots.shape[0]
    if n == 0:
        return
    block_rows = 8
    with device_guard(cache):
        _dequantize_kernel[(triton.cdiv(n, block_rows),)](
            *c.kernel_args(), slots, n, out, out.stride(0), LAYOUT=c.code, D_MAIN=512,
            D_TAIL=c.dim - 512, BLOCK_ROWS=block_rows)

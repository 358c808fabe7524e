"""The KV compressor of C4A / C128A layers and of the C4A indexer (include/dsv4/compressor.h,
docs/spec.md §4) on the Triton backend: the projection through torch GEMMs, then the ring update and
emission in two kernels.

  compressor_project: kv_rows = x wkv^T, score_rows = x wgate^T + ape[p mod r] (fp32).
  compressor_update_and_emit:
    emit kernel (one program per token): a token at position p with (p+1) mod r == 0 emits
      entry j = (p+1)/r - 1: per dim, softmax over the window's coff*r rows (this call's
      projections, or the request's ring for positions before the call), weighted sum of kv,
      RMSNorm, RoPE at position j*r; then the target's quantization: a KV cache layout
      (MODEL1_FP8 stores FP8 blocks itself; BF16 / FP8_PER_TENSOR get the FP8-block-rounded
      values first) or, for the indexer, a Hadamard rotation and FP8 with one scale per entry.
    save kernel (one program per token, after every emit read the ring): the rows the next call
      needs go into the ring (position p -> ring row p mod coff*r through the state table).
Ring rows are fp32 [kv (coff*D) | score (coff*D)]. What the CPU reference rejects is skipped as
on CUDA (compressor.h): an entry whose ring rows or output slot are unmapped, or whose window row
is not the matching token of the call's run, is not emitted; an unmapped ring row is not saved.
"""
from __future__ import annotations

import dataclasses
import math
from typing import Optional

import torch
import triton
import triton.language as tl

from .._runtime import device_guard
from . import _checks as C
from ._formats import f32_to_fp8_e4m3, exp2_int, fp8_quantize, ue8m0_exponent
from ._pairs import block_amax, pair_dims, rms_inverse, rope_rotate
from .gemm import matmul_f32
from .kv_cache import BF16, FP8_PER_TENSOR, MODEL1_FP8, CacheArg, store_kv_token
from .registry import op

KV_CACHE, INDEXER_KEYS = "kv_cache", "indexer_keys"
# hadamard.h hadamard_scale: n^-0.5 rounded once from double (to fp32 when passed to a kernel).
_HADAMARD_SCALE = {128: 1.0 / math.sqrt(128.0), 512: 1.0 / math.sqrt(512.0)}


@dataclasses.dataclass(frozen=True)
class CompressorConfig:
    """compressor.h CompressorConfig: head dim D (512 for the KV cache, 128 for indexer keys),
    ratio r (4 with overlapping windows, or 128), the trailing rope dims, the RMSNorm eps."""
    head_dim: int = 512
    ratio: int = 4
    rope_dims: int = 64
    eps: float = 1e-6
    target: str = KV_CACHE

    @property
    def coff(self) -> int:
        return 2 if self.ratio == 4 else 1

    @property
    def proj_width(self) -> int:
        return self.coff * self.head_dim

    @property
    def state_width(self) -> int:
        return 2 * self.proj_width

    @property
    def ring_rows(self) -> int:
        return self.coff * self.ratio

    @staticmethod
    def attention(config, ratio: int) -> "CompressorConfig":
        return CompressorConfig(config.head_dim, ratio, config.rope_head_dim,
                                float(config.norm_eps), KV_CACHE)

    @staticmethod
    def indexer(config) -> "CompressorConfig":
        return CompressorConfig(config.index_head_dim, 4, config.rope_head_dim,
                                float(config.norm_eps), INDEXER_KEYS)

    def validate(self, op_name: str) -> None:
        if self.ratio not in (4, 128):
            C.fail(op_name, "cfg.ratio", "4 or 128", self.ratio)
        want = 512 if self.target == KV_CACHE else 128
        if self.target not in (KV_CACHE, INDEXER_KEYS):
            C.fail(op_name, "cfg.target", "kv_cache or indexer_keys", self.target)
        if self.head_dim != want:
            C.fail(op_name, "cfg.head_dim", f"{want} ({self.target})", self.head_dim)
        if self.rope_dims != 64:
            C.fail(op_name, "cfg.rope_dims", "64 (this backend)", self.rope_dims)
        if not self.eps > 0:
            C.fail(op_name, "cfg.eps", "> 0", self.eps)


@triton.jit
def _add_ape_kernel(s_ptr, s_s0, ape_ptr, ape_s0, pos_ptr, W, RATIO: tl.constexpr,
                    BLOCK: tl.constexpr):
    t = tl.program_id(0).to(tl.int64)
    c = tl.program_id(1) * BLOCK + tl.arange(0, BLOCK)
    m = c < W
    p = tl.load(pos_ptr + t).to(tl.int64)
    # A negative position gives a NaN score row (as on CUDA; the CPU op rejects it).
    bias = tl.load(ape_ptr + tl.where(p >= 0, p % RATIO, 0) * ape_s0 + c, mask=m, other=0.0)
    bias = tl.where(p >= 0, bias, float("nan"))
    s = tl.load(s_ptr + t * s_s0 + c, mask=m, other=0.0)
    tl.store(s_ptr + t * s_s0 + c, s + bias, mask=m)


@op("compressor_project", "compressor projections (torch GEMMs) + the ape score bias",
    impl="triton+torch")
def compressor_project(cfg: CompressorConfig, x: torch.Tensor, wkv: torch.Tensor,
                       wgate: torch.Tensor, ape: torch.Tensor, positions: torch.Tensor,
                       kv_rows: torch.Tensor, score_rows: torch.Tensor) -> None:
    """x [T, dim] bf16/fp32, wkv / wgate [coff*D, dim] (x's dtype, or fp32), ape [r, coff*D]
    fp32, positions [T] -> kv_rows, score_rows [T, coff*D] fp32."""
    name = "compressor_project"
    cfg.validate(name)
    width = cfg.proj_width
    C.tensor(name, "x", x, (torch.bfloat16, torch.float32), ndim=2)
    T, dim = x.shape
    C.tensor(name, "wkv", wkv, (torch.bfloat16, torch.float32), (width, dim))
    C.tensor(name, "wgate", wgate, (torch.bfloat16, torch.float32), (width, dim))
    C.tensor(name, "ape", ape, torch.float32, (cfg.ratio, width))
    C.tensor(name, "positions", positions, (torch.int32, torch.int64), (T,))
    C.tensor(name, "kv_rows", kv_rows, torch.float32, (T, width))
    C.tensor(name, "score_rows", score_rows, torch.float32, (T, width))
    C.same_device(name, [("x", x), ("wkv", wkv), ("wgate", wgate), ("ape", ape),
                         ("positions", positions), ("kv_rows", kv_rows),
                         ("score_rows", score_rows)])
    C.disjoint(name, [("kv_rows", kv_rows), ("score_rows", score_rows)],
               [("x", x), ("wkv", wkv), ("wgate", wgate), ("ape", ape), ("positions", positions)])
    if T == 0:
        return
    kv_rows.copy_(matmul_f32(x, wkv))
    score_rows.copy_(matmul_f32(x, wgate))
    block = 1024
    with device_guard(x):
        _add_ape_kernel[(T, triton.cdiv(width, block))](
            score_rows, score_rows.stride(0), ape, ape.stride(0), positions, width,
            RATIO=cfg.ratio, BLOCK=block, num_warps=4)


@triton.jit
def hadamard(even, odd, scale, HB: tl.constexpr, NBP: tl.constexpr, LOG2N: tl.constexpr):
    """v <- H v * scale (Sylvester order, n = 64 * NBP = 2^LOG2N) on the pair tiles of HB rows
    ([HB, NBP, 32]): the butterflies of hadamard.h, one add or subtract per element and stage,
    so the result is the CPU's bit for bit."""
    N: tl.constexpr = NBP * 64
    x = tl.reshape(tl.join(even, odd), [HB, N])
    sel = tl.arange(0, 2)[None, None, :, None]
    for s in tl.static_range(LOG2N):
        x4 = tl.reshape(x, [HB, (N // 2) >> s, 2, 1 << s])
        a = tl.sum(tl.where(sel == 0, x4, 0.0), axis=2)
        b = tl.sum(tl.where(sel == 1, x4, 0.0), axis=2)
        x = tl.reshape(tl.where(sel == 0, (a + b)[:, :, None, :], (a - b)[:, :, None, :]),
                       [HB, N])
    return tl.split(tl.reshape(x * scale, [HB, NBP, 32, 2]))


@triton.jit
def _emit_kernel(kv_ptr, kv_s0, sc_ptr, sc_s0, pos_ptr, req_ptr, ctx_ptr, T, R,
                 w_ptr, cs_ptr, cs_s0, max_pos,
                 st_ptr, st_s0, stab_ptr, stab_s0, stab_w, st_block, st_rows,
                 u8, bf, f32, block_stride, block_size, num_blocks, tensor_scale, inv_ts,
                 otab_ptr, otab_s0, otab_w, ent_ptr, ent_s0, eps, had_scale,
                 D: tl.constexpr, RATIO: tl.constexpr, COFF: tl.constexpr, R_DIMS: tl.constexpr,
                 NBP: tl.constexpr, INDEXER: tl.constexpr, LAYOUT: tl.constexpr,
                 HAS_ENTRIES: tl.constexpr):
    t = tl.program_id(0)
    p = tl.load(pos_ptr + t).to(tl.int64)
    q = tl.load(req_ptr + t)
    K: tl.constexpr = COFF * RATIO
    WIDTH: tl.constexpr = COFF * D
    j = (p + 1) // RATIO - 1
    emits = (p >= 0) & (q >= 0) & (q < R) & ((p + 1) % RATIO == 0) & (j * RATIO < max_pos)
    if emits:
        ctx = tl.load(ctx_ptr + q).to(tl.int64)
        dims, _, pair = pair_dims(NBP)
        stab = stab_ptr + q.to(tl.int64) * stab_s0
        # Pass 1: per-dim max of the window's scores; pass 2: softmax-weighted sum.
        ok = p >= 0
        m_e = tl.full([NBP, 32], float("-inf"), tl.float32)
        m_o = tl.full([NBP, 32], float("-inf"), tl.float32)
        num_e = tl.zeros([NBP, 32], tl.float32)
        num_o = tl.zeros([NBP, 32], tl.float32)
        den_e = tl.zeros([NBP, 32], tl.float32)
        den_o = tl.zeros([NBP, 32], tl.float32)
        for phase in tl.static_range(2):
            for i in range(K):
                pos = p - K + 1 + i
                col = 0  # overlap (r = 4): the previous window's rows use dims [0, D)
                if COFF == 2:
                    col = tl.where(i >= RATIO, D, 0)  # ... the current window's [D, 2D)
                tt = t - (p - pos)  # this call's token at `pos` (runs are contiguous)
                here = (pos >= ctx) & (tt >= 0) & (tt < T)
                ring = (pos >= 0) & (pos < ctx)
                # The ring row of `pos` (position p lives in ring row p mod K).
                rr = tl.where(pos >= 0, pos % K, 0)
                rblk = tl.load(stab + rr // st_block, mask=ring & (rr // st_block < stab_w),
                               other=-1).to(tl.int64)
                rslot = rblk * st_block + rr % st_block
                ring_ok = ring & (rblk >= 0) & (rslot < st_rows)
                if phase == 0:
                    match = (tl.load(req_ptr + tl.where(here, tt, 0)) == q) & \
                        (tl.load(pos_ptr + tl.where(here, tt, 0)).to(tl.int64) == pos)
                    ok = ok & ((pos < 0) | (here & match) | ring_ok)
                use_here = tl.where(here, dims >= 0, False)
                use_ring = tl.where(ring_ok, dims >= 0, False)
                c0 = col + dims
                src_here = tl.where(here, tt, 0).to(tl.int64)
                src_ring = tl.where(ring_ok, rslot, 0)
                s_e = tl.where(use_here, tl.load(sc_ptr + src_here * sc_s0 + c0, mask=use_here,
                                                 other=0.0),
                               tl.load(st_ptr + src_ring * st_s0 + WIDTH + c0, mask=use_ring,
                                       other=float("-inf")))
                s_o = tl.where(use_here, tl.load(sc_ptr + src_here * sc_s0 + c0 + 1,
                                                 mask=use_here, other=0.0),
                               tl.load(st_ptr + src_ring * st_s0 + WIDTH + c0 + 1,
                                       mask=use_ring, other=float("-inf")))
                if phase == 0:
                    m_e = tl.where(m_e < s_e, s_e, m_e)
                    m_o = tl.where(m_o < s_o, s_o, m_o)
                else:
                    kv_e = tl.where(use_here, tl.load(kv_ptr + src_here * kv_s0 + c0,
                                                      mask=use_here, other=0.0),
                                    tl.load(st_ptr + src_ring * st_s0 + c0, mask=use_ring,
                                            other=0.0))
                    kv_o = tl.where(use_here, tl.load(kv_ptr + src_here * kv_s0 + c0 + 1,
                                                      mask=use_here, other=0.0),
                                    tl.load(st_ptr + src_ring * st_s0 + c0 + 1, mask=use_ring,
                                            other=0.0))
                    present = use_here | use_ring
                    w_e = tl.where(present, tl.exp(s_e - m_e), 0.0)
                    w_o = tl.where(present, tl.exp(s_o - m_o), 0.0)
                    num_e += tl.where(present, w_e * kv_e, 0.0)
                    num_o += tl.where(present, w_o * kv_o, 0.0)
                    den_e += w_e
                    den_o += w_o
        even = tl.div_rn(num_e, den_e)
        odd = tl.div_rn(num_o, den_o)
        # RMSNorm (weighted), RoPE at the window's first position j*r.
        inv = rms_inverse(even, odd, D, eps)
        even = even * inv * tl.load(w_ptr + dims).to(tl.float32)
        odd = odd * inv * tl.load(w_ptr + dims + 1).to(tl.float32)
        even, odd = rope_rotate(even, odd, pair, cs_ptr + j * RATIO * cs_s0, (D - R_DIMS) // 2,
                                R_DIMS // 2, False)
        if INDEXER:
            even, odd = hadamard(tl.reshape(even, [1, NBP, 32]), tl.reshape(odd, [1, NBP, 32]),
                                 had_scale, 1, NBP, 7)
            even = tl.reshape(even, [NBP, 32])
            odd = tl.reshape(odd, [NBP, 32])
        # The entry's output slot; an entry that cannot be stored is not emitted at all.
        oblk = tl.load(otab_ptr + q.to(tl.int64) * otab_s0 + j // block_size,
                       mask=j // block_size < otab_w, other=-1).to(tl.int64)
        keep = ok & (oblk >= 0) & (oblk < num_blocks)
        slot = tl.where(keep, oblk * block_size + j % block_size, -1)
        if HAS_ENTRIES:
            em = tl.where(keep, dims >= 0, False)
            tl.store(ent_ptr + t.to(tl.int64) * ent_s0 + dims, even, mask=em)
            tl.store(ent_ptr + t.to(tl.int64) * ent_s0 + dims + 1, odd, mask=em)
        if INDEXER:
            # 128 fp8 codes + one fp32 power-of-two scale per entry ([B x 128][B x 4 B] blocks).
            s = tl.where(keep, slot, 0)
            base = (s // block_size) * block_stride
            off = s % block_size
            k = ue8m0_exponent(tl.max(block_amax(even, odd), axis=0))
            ce, _ = fp8_quantize(even, k)
            co, _ = fp8_quantize(odd, k)
            mk = tl.where(keep, dims >= 0, False)
            tl.store(u8 + base + off * 128 + dims, ce.to(tl.uint8), mask=mk)
            tl.store(u8 + base + off * 128 + dims + 1, co.to(tl.uint8), mask=mk)
            tl.store(f32 + (base + block_size * 128 + off * 4) // 4, exp2_int(k), mask=keep)
        else:
            if LAYOUT != 0:
                # Caches that do not store FP8 blocks themselves get the model's FP8-rounded
                # nope dims (blocks of 64), then their own encoding.
                b = dims // 64
                kb = ue8m0_exponent(block_amax(even, odd))[:, None]
                _, qe = fp8_quantize(even, kb)
                _, qo = fp8_quantize(odd, kb)
                nope = b < (D - R_DIMS) // 64
                even = tl.where(nope, qe, even)
                odd = tl.where(nope, qo, odd)
            store_kv_token(even, odd, slot, u8, bf, f32, block_stride, block_size, num_blocks,
                           tensor_scale, inv_ts, D, NBP, LAYOUT)


@triton.jit
def _save_kernel(kv_ptr, kv_s0, sc_ptr, sc_s0, pos_ptr, req_ptr, T, R,
                 st_ptr, st_s0, stab_ptr, stab_s0, stab_w, st_block, st_rows,
                 K: tl.constexpr, WIDTH: tl.constexpr, BLOCK: tl.constexpr):
    t = tl.program_id(0)
    p = tl.load(pos_ptr + t).to(tl.int64)
    q = tl.load(req_ptr + t)
    # Only the last K positions of a run are kept: skip a token whose position + K is also in
    # this call (the run's token t + K).
    later = t + K
    has_later = later < T
    nxt = tl.where(has_later, later, 0)
    superseded = has_later & (tl.load(req_ptr + nxt) == q) & \
        (tl.load(pos_ptr + nxt).to(tl.int64) == p + K)
    if (p >= 0) & (q >= 0) & (q < R) & (~superseded):
        rr = p % K
        rblk = tl.load(stab_ptr + q.to(tl.int64) * stab_s0 + rr // st_block,
                       mask=rr // st_block < stab_w, other=-1).to(tl.int64)
        rslot = rblk * st_block + rr % st_block
        if (rblk >= 0) & (rslot < st_rows):
            c = tl.arange(0, BLOCK)
            m = c < WIDTH
            dst = st_ptr + rslot * st_s0
            tl.store(dst + c, tl.load(kv_ptr + t.to(tl.int64) * kv_s0 + c, mask=m), mask=m)
            tl.store(dst + WIDTH + c, tl.load(sc_ptr + t.to(tl.int64) * sc_s0 + c, mask=m),
                     mask=m)


@op("compressor_update_and_emit", "compressor: emit completed entries (pool, norm, RoPE, quant)"
    " into the cache, then save the ring rows")
def compressor_update_and_emit(cfg: CompressorConfig, kv_rows: torch.Tensor,
                               score_rows: torch.Tensor, positions: torch.Tensor,
                               token_to_req: torch.Tensor, context_lens: torch.Tensor,
                               norm_weight: torch.Tensor, cos_sin: torch.Tensor,
                               state_rows: torch.Tensor, state_table: torch.Tensor,
                               state_block_size: int, out_cache: torch.Tensor,
                               out_block_table: torch.Tensor, out_block_size: int,
                               out_layout: str = "model1_fp8", out_tensor_scale: float = 1.0,
                               entries: Optional[torch.Tensor] = None) -> None:
    """compressor.h compressor_update_and_emit, flattened: the batch (positions, token_to_req,
    context_lens), the ring (state_rows fp32 [slots, 2*coff*D], state_table int32 [R, *],
    state_block_size), the output (out_cache uint8 [blocks, bytes]: a KV cache of out_layout
    for kv_cache, or the indexer key cache, [B x 128 fp8][B x 4 B fp32 scale] per block, for
    indexer_keys; out_block_table int32 [R, *]; out_block_size), entries optional fp32 [T, D]."""
    name = "compressor_update_and_emit"
    cfg.validate(name)
    D, width = cfg.head_dim, cfg.proj_width
    C.tensor(name, "positions", positions, (torch.int32, torch.int64), ndim=1)
    T = positions.shape[0]
    C.tensor(name, "token_to_req", token_to_req, torch.int32, (T,))
    C.tensor(name, "context_lens", context_lens, (torch.int32, torch.int64), ndim=1)
    R = context_lens.shape[0]
    C.tensor(name, "kv_rows", kv_rows, torch.float32, (T, width))
    C.tensor(name, "score_rows", score_rows, torch.float32, (T, width))
    C.tensor(name, "norm_weight", norm_weight, (torch.bfloat16, torch.float32), (D,))
    C.tensor(name, "cos_sin", cos_sin, torch.float32, (-1, cfg.rope_dims))
    C.tensor(name, "state_rows", state_rows, torch.float32, (-1, cfg.state_width))
    C.positive(name, "state_block_size", state_block_size)
    C.tensor(name, "state_table", state_table, torch.int32, (R, -1))
    C.tensor(name, "out_block_table", out_block_table, torch.int32, (R, -1))
    C.optional(name, "entries", entries, torch.float32, (T, D))
    if cfg.target == KV_CACHE:
        out = CacheArg(name, "out_cache", out_cache, out_layout, out_block_size, out_tensor_scale)
        if out.code not in (MODEL1_FP8, BF16, FP8_PER_TENSOR):
            C.fail(name, "out_layout", "model1_fp8, bf16 or fp8_per_tensor (dim 512)", out_layout)
        layout, args = out.code, out.kernel_args()
    else:
        C.positive(name, "out_block_size", out_block_size)
        C.tensor(name, "out_cache", out_cache, torch.uint8, (-1, out_block_size * 132))
        C.contiguous(name, "out_cache", out_cache)
        flat = out_cache.view(-1)
        layout = MODEL1_FP8  # unused
        args = (flat, flat.view(torch.int16), flat.view(torch.float32), out_cache.shape[1],
                out_block_size, out_cache.shape[0], 1.0)
    C.same_device(name, [("kv_rows", kv_rows), ("score_rows", score_rows),
                         ("positions", positions), ("token_to_req", token_to_req),
                         ("context_lens", context_lens), ("norm_weight", norm_weight),
                         ("cos_sin", cos_sin), ("state_rows", state_rows),
                         ("state_table", state_table), ("out_cache", out_cache),
                         ("out_block_table", out_block_table), ("entries", entries)])
    C.disjoint(name, [("state_rows", state_rows), ("out_cache", out_cache), ("entries", entries)],
               [("kv_rows", kv_rows), ("score_rows", score_rows), ("positions", positions),
                ("token_to_req", token_to_req), ("context_lens", context_lens),
                ("norm_weight", norm_weight), ("cos_sin", cos_sin),
                ("state_table", state_table), ("out_block_table", out_block_table)])
    if T == 0:
        return
    inv_ts = float(torch.tensor(1.0) / torch.tensor(float(args[6]), dtype=torch.float32))
    nbp = triton.next_power_of_2(D // 64)
    ring = (state_rows, state_rows.stride(0), state_table, state_table.stride(0),
            state_table.shape[1], state_block_size, state_rows.shape[0])
    with device_guard(kv_rows):
        _emit_kernel[(T,)](
            kv_rows, kv_rows.stride(0), score_rows, score_rows.stride(0), positions, token_to_req,
            context_lens, T, R, norm_weight, cos_sin, cos_sin.stride(0), cos_sin.shape[0],
            *ring, *args, inv_ts, out_block_table, out_block_table.stride(0),
            out_block_table.shape[1], entries, entries.stride(0) if entries is not None else 0,
            float(cfg.eps), _HADAMARD_SCALE[D], D=D, RATIO=cfg.ratio, COFF=cfg.coff,
            R_DIMS=cfg.rope_dims, NBP=nbp,
            INDEXER=cfg.target == INDEXER_KEYS, LAYOUT=layout, HAS_ENTRIES=entries is not None,
            num_warps=4)
        _save_kernel[(T,)](
            kv_rows, kv_rows.stride(0), score_rows, score_rows.stride(0), positions, token_to_req,
            T, R, *ring, K=cfg.ring_rows, WIDTH=width, BLOCK=triton.next_power_of_2(width),
            num_warps=4)

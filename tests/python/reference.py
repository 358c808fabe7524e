"""Float64 references written independently of dsv4attn (straight from docs/spec.md), used by the
tests: cache byte decoding, FP8/UE8M0 rounding, RoPE, RMSNorm and sparse attention."""
from __future__ import annotations

import math

import torch

F64 = torch.float64


# ---------------------------------------------------------------- cache bytes (docs/spec.md §7)
def model1_block_bytes(block_size: int) -> int:
    raw = block_size * 584
    return (raw + 575) // 576 * 576


def decode_model1(cache: torch.Tensor, block_size: int, slots) -> torch.Tensor:
    """Dequantizes MODEL1_FP8 tokens at global slots from the byte cache [num_blocks, bytes]."""
    rows = []
    for s in slots:
        blk, off = divmod(int(s), block_size)
        block = cache[blk]
        data = block[off * 576:(off + 1) * 576]
        scales = block[block_size * 576 + off * 8: block_size * 576 + off * 8 + 7]
        nope = data[:448].view(torch.float8_e4m3fn).to(F64)
        scale = torch.pow(2.0, scales.to(F64) - 127.0).repeat_interleave(64)
        rope = data[448:576].clone().view(torch.bfloat16).to(F64)
        rows.append(torch.cat([nope * scale, rope]))
    return torch.stack(rows) if rows else torch.zeros((0, 512), dtype=F64)


def decode_v32(cache: torch.Tensor, block_size: int, slots) -> torch.Tensor:
    rows = []
    for s in slots:
        blk, off = divmod(int(s), block_size)
        tok = cache[blk][off * 656:(off + 1) * 656]
        nope = tok[:512].view(torch.float8_e4m3fn).to(F64)
        # Scales read as bf16 (docs/spec.md §7; exact for the UE8M0 scales writers store).
        scale = tok[512:528].clone().view(torch.float32).to(torch.bfloat16).to(F64).repeat_interleave(128)
        rope = tok[528:656].clone().view(torch.bfloat16).to(F64)
        rows.append(torch.cat([nope * scale, rope]))
    return torch.stack(rows)


def ue8m0_scale(amax: torch.Tensor) -> torch.Tensor:
    """2^ceil(log2(max(amax / 448, 1e-4))) (docs/spec.md §7)."""
    return torch.pow(2.0, torch.ceil(torch.log2(torch.clamp(amax / 448.0, min=1e-4))))


def fp8_round(x: torch.Tensor) -> torch.Tensor:
    """Round-to-nearest-even to e4m3fn (|x| <= 448 here), as float64."""
    return x.to(torch.float32).to(torch.float8_e4m3fn).to(F64)


def quantize_blocks(x: torch.Tensor, block: int):
    """(dequantized values, scales) of per-row FP8 quantization in blocks of `block`."""
    shape = x.shape
    xb = x.to(F64).reshape(*shape[:-1], shape[-1] // block, block)
    scale = ue8m0_scale(xb.abs().amax(-1, keepdim=True))
    return (fp8_round(xb / scale) * scale).reshape(shape), scale.squeeze(-1)


# ---------------------------------------------------------------- norms and RoPE (docs/spec.md §2, §3)
def rms_norm(x: torch.Tensor, weight=None, eps: float = 1e-6) -> torch.Tensor:
    x = x.to(F64)
    y = x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + eps)
    return y * weight.to(F64) if weight is not None else y


def rope(x: torch.Tensor, positions: torch.Tensor, theta: float = 10000.0, rope_dims: int = 64,
         inverse: bool = False) -> torch.Tensor:
    """GPT-J interleaved RoPE (no YaRN) on the last rope_dims dims; x [T, ..., D]."""
    x = x.to(F64).clone()
    i = torch.arange(rope_dims // 2, dtype=F64)
    freqs = theta ** (-2.0 * i / rope_dims)
    ang = positions.to(F64)[:, None] * freqs[None, :]          # [T, R/2]
    if inverse:
        ang = -ang
    shape = [x.shape[0]] + [1] * (x.dim() - 2) + [rope_dims // 2]
    cos, sin = torch.cos(ang).view(shape), torch.sin(ang).view(shape)
    r = x[..., -rope_dims:]
    even, odd = r[..., 0::2].clone(), r[..., 1::2].clone()
    r[..., 0::2] = even * cos - odd * sin
    r[..., 1::2] = even * sin + odd * cos
    return x


# ---------------------------------------------------------------- sparse attention (docs/spec.md §6)
def sparse_attention(q: torch.Tensor, rows: torch.Tensor, valid: torch.Tensor, scale: float,
                     d_v: int, sink=None):
    """q [N, H, d], rows [N, K, d], valid [N, K] bool -> (out [N, H, d_v], lse [N, H],
    max_logits [N, H]) in float64; no valid row: out 0, lse +inf, max -inf."""
    q, rows = q.to(F64), rows.to(F64)
    logits = torch.einsum("nhd,nkd->nhk", q, rows) * scale
    logits = logits.masked_fill(~valid[:, None, :], -math.inf)
    lse = torch.logsumexp(logits, -1)
    max_logits = logits.amax(-1)
    empty = torch.isinf(lse) & (lse < 0)
    p = torch.exp(logits - torch.where(empty, 0.0, lse)[..., None])
    p = torch.where(valid[:, None, :], p, 0.0)
    out = torch.einsum("nhk,nkd->nhd", p, rows[..., :d_v])
    if sink is not None:
        factor = 1.0 / (1.0 + torch.exp(sink.to(F64)[None, :] - lse))
        out = out * factor[..., None]
    out = torch.where(empty[..., None], 0.0, out)
    lse = torch.where(empty, math.inf, lse)
    return out, lse, max_logits


# ---------------------------------------------------------------- indexer rotation
def hadamard(n: int) -> torch.Tensor:
    """The orthonormal Sylvester-order Hadamard matrix of order n (a power of two), float64."""
    i = torch.arange(n)
    bits = i[:, None] & i[None, :]
    sign = sum((bits >> b) & 1 for b in range(n.bit_length() - 1))
    return torch.where(sign % 2 == 0, 1.0, -1.0).to(F64) * n ** -0.5

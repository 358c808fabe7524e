"""The Triton backend's sparse attention against the float64 formula of docs/spec.md §6
(reference.sparse_attention) on fresh random data, outputs poisoned beforehand: sparse prefill
(d_qk 512 / 576, sink, topk_length, every kind of masked index) and sparse decode over every
cache layout (fused dequantization, two scopes, split-KV + combine and single pass), plus the
combine alone.

Tolerances, derived from what the kernels round:
  logits  scale * q.k in fp32 from bf16 operands (exact products): each logit is off by at most
          gamma_d * scale * sum_j |q_j k_j| (gamma_d = d * 2^-24); lse and max_logits by at most
          that (over the row's keys) plus 2^-22 |value| for the final log / scaling.
  out     the softmax weights enter P.V as bf16 (relative error <= 2^-9 each, so <= 2^-9 *
          max|v| on the weighted sum), the fp32 sums add ~d * 2^-24, the bf16 output 2^-9 |out|:
          |out - ref| <= 2^-8 * max|v| + 2^-8 * |ref|, v over the row's valid keys.
"""
import math

import pytest
import torch

import reference as ref
from triton_support import DEVICE, F64, gpu_or, op, poisoned, to_dev

LAYOUTS = ["model1_fp8", "v32_fp8", "bf16", "fp8_per_tensor"]


def logit_bound(q, rows, valid, scale):
    """Per (n, h): the fp32 rounding bound of the row's logits (module docstring)."""
    d = q.shape[-1]
    mag = torch.einsum("nhd,nkd->nhk", q.to(F64).abs(), rows.to(F64).abs()) * scale
    mag = mag.masked_fill(~valid[:, None, :], 0.0)
    return d * 2.0 ** -24 * mag.amax(-1)


def check_attention(out, lse, q, rows, valid, scale, d_v, sink, max_logits=None):
    """Compares out [N, H, d_v], lse [N, H] (and max_logits) with the float64 reference."""
    want_o, want_lse, want_max = ref.sparse_attention(q, rows, valid, scale, d_v, sink)
    out, lse = out.cpu().to(F64), lse.cpu().to(F64)
    assert not out.isnan().any() and not lse.isnan().any()
    empty = ~valid.any(-1)
    assert (lse[empty] == math.inf).all() and (out[empty] == 0).all()
    lb = logit_bound(q, rows, valid, scale)
    ok = ~empty[:, None].expand_as(lse)
    tol = lb + 2.0 ** -22 * want_lse.abs()
    assert ((lse - want_lse).abs()[ok] <= tol[ok]).all(), (lse - want_lse).abs()[ok].max()
    if max_logits is not None:
        ml = max_logits.cpu().to(F64)
        assert (ml[empty] == -math.inf).all()
        assert ((ml - want_max).abs()[ok] <= (lb + 2.0 ** -22 * want_max.abs())[ok]).all()
    vmax = rows[..., :d_v].to(F64).abs().masked_fill(~valid[..., None], 0.0).amax((1, 2))
    bound = 2.0 ** -8 * vmax[:, None, None] + 2.0 ** -8 * want_o.abs()
    assert ((out - want_o).abs() <= bound).all(), ((out - want_o).abs() - bound).max()


# ---------------------------------------------------------------- prefill
@pytest.mark.parametrize("d_qk", [512, 576])
@pytest.mark.parametrize("with_sink,with_len", [(True, True), (False, False)])
def test_sparse_prefill(d_qk, with_sink, with_len):
    s_q, H = gpu_or(5, 24), gpu_or(16, 128 if d_qk == 576 else 64)
    s_kv, topk = gpu_or(50, 3000), gpu_or(48, 640)
    q = (torch.randn(s_q, H, d_qk) * 2).bfloat16()
    kv = torch.randn(s_kv, 1, d_qk).bfloat16()
    idx = torch.randint(0, s_kv, (s_q, 1, topk), dtype=torch.int32)
    idx[0, 0, ::3] = -1            # padding
    idx[0, 0, 1::7] = s_kv + 3     # past the KV: masked (FlashMLA)
    idx[1, 0, ::5] = -9            # < -1: masked too
    idx[2, 0, :] = -1              # no valid key: out 0, lse +inf, max -inf
    idx[3, 0, 4:9] = idx[3, 0, 3]  # duplicates count once per occurrence
    lens = torch.randint(0, topk + 1, (s_q,), dtype=torch.int32) if with_len else None
    if lens is not None:
        lens[0], lens[1] = topk, 0
    sink = torch.randn(H) if with_sink else None
    if sink is not None:
        sink[0], sink[1] = float("inf"), float("-inf")
    out = poisoned((s_q, H, 512), torch.bfloat16)
    ml, lse = poisoned((s_q, H), torch.float32), poisoned((s_q, H), torch.float32)
    scale = d_qk ** -0.5
    op("sparse_prefill")(*to_dev(q, kv, idx), to_dev(lens) if lens is not None else None,
                         to_dev(sink) if sink is not None else None, 0.0, 512, out, ml, lse)
    k = torch.arange(topk)
    valid = (idx[:, 0] >= 0) & (idx[:, 0] < s_kv)
    if lens is not None:
        valid &= k[None, :] < lens[:, None]
    rows = kv[idx[:, 0].clamp(0, s_kv - 1).long(), 0]
    check_attention(out, lse, q, rows, valid, scale, 512, sink, ml)


def test_sparse_prefill_matches_cpu_op():
    """The same call as the CPU reference op, on valid indices: the bound above holds against it
    too (the CPU is fp32 throughout)."""
    s_q, H, d = gpu_or(3, 16), gpu_or(16, 64), 512
    q, kv = torch.randn(s_q, H, d).bfloat16(), torch.randn(100, 1, d).bfloat16()
    idx = torch.randint(-1, 100, (s_q, 1, 64), dtype=torch.int32)
    sink = torch.randn(H)
    want = [torch.empty(s_q, H, d).bfloat16(), torch.empty(s_q, H), torch.empty(s_q, H)]
    torch.ops.dsv4.sparse_prefill(q, kv, idx, None, sink, 0.0, d, *want)
    got = [poisoned((s_q, H, d), torch.bfloat16), poisoned((s_q, H), torch.float32),
           poisoned((s_q, H), torch.float32)]
    op("sparse_prefill")(*to_dev(q, kv, idx), None, to_dev(sink), 0.0, d, *got)
    vmax = kv.float().abs().max()
    assert ((got[0].cpu().float() - want[0].float()).abs() <=
            2.0 ** -8 * vmax + 2.0 ** -8 * want[0].float().abs()).all()
    assert (got[2].cpu() - want[2]).abs().max() <= 1e-4


# ---------------------------------------------------------------- decode
def filled_cache(layout, block_size, num_blocks, ts):
    d = 576 if layout == "v32_fp8" else 512
    import dsv4attn
    nbytes = dsv4attn._runtime.kv_geometry(layout, block_size)["block_bytes"]
    cache = torch.zeros(num_blocks, nbytes, dtype=torch.uint8)
    n = num_blocks * block_size
    torch.ops.dsv4.kv_quantize(cache, layout, block_size, ts, torch.randn(n, d) * 2,
                               torch.arange(n))
    return cache


def decoded(cache, layout, block_size, ts, slots):
    """The float values of the tokens at slots (any shape; invalid -> 0 rows)."""
    d = 576 if layout == "v32_fp8" else 512
    flat = slots.reshape(-1).long()
    n = cache.shape[0] * block_size
    ok = (flat >= 0) & (flat < n)
    out = torch.empty(flat.shape[0], d)
    torch.ops.dsv4.kv_dequantize(cache, layout, block_size, ts, torch.where(ok, flat, -1), out)
    return out.view(*slots.shape, d)


@pytest.mark.parametrize("layout", LAYOUTS)
@pytest.mark.parametrize("splits", ["single", "scheduled"])
def test_sparse_decode(layout, splits):
    """Two scopes (SWA-like window + compressed-like extra) with lengths, -1 padding and slots
    outside the cache (masked, as on CUDA), in one pass or split + combined."""
    d = 576 if layout == "v32_fp8" else 512
    b, s_q, H = gpu_or(3, 16), gpu_or(1, 2), gpu_or(16, 128 if d == 576 else 64)
    B, nb = 64, gpu_or(3, 40)
    topk, xtopk = gpu_or(40, 128), gpu_or(40, 512)
    ts = 0.37 if layout == "fp8_per_tensor" else 1.0
    main, extra = filled_cache(layout, B, nb, ts), filled_cache(layout, B // 2, nb, ts)
    q = (torch.randn(b, s_q, H, d) * 2).bfloat16()
    idx = torch.randint(0, nb * B, (b, s_q, topk), dtype=torch.int32)
    xidx = torch.randint(0, nb * B // 2, (b, s_q, xtopk), dtype=torch.int32)
    idx[0, :, ::4] = -1
    idx[1, :, 3] = nb * B + 5          # outside the cache: masked
    xidx[0, :, -5:] = -1
    lens = torch.randint(0, topk + 1, (b,), dtype=torch.int32)
    xlens = torch.randint(0, xtopk + 1, (b,), dtype=torch.int32)
    lens[0], xlens[0] = topk, xtopk
    lens[-1], xlens[-1] = 0, 0         # no valid key at all
    sink = torch.randn(H)
    if splits == "single":
        sl = 64 * math.ceil((topk + xtopk) / 64)
    else:  # at least two splits; the first ends inside the main scope or at its end
        sl = 64 * math.ceil((topk + xtopk) / 128)
    ns = math.ceil((topk + xtopk) / sl)
    ws_bytes = 4 * b * s_q * H * ns * (512 + 1)
    ws = torch.zeros(ws_bytes, dtype=torch.uint8, device=DEVICE)
    out = poisoned((b, s_q, H, 512), torch.bfloat16)
    lse = poisoned((b, s_q, H), torch.float32)
    op("sparse_decode")(to_dev(q), to_dev(main), layout, B, *to_dev(idx, lens), to_dev(extra),
                        layout, B // 2, *to_dev(xidx, xlens), to_dev(sink), 0.0, 512, ns, sl,
                        ws_bytes, ws, out, lse, k_tensor_scale=ts, extra_tensor_scale=ts)
    # Reference: the concatenated index list of each (b, s_q) row.
    rows = torch.cat([decoded(main, layout, B, ts, idx), decoded(extra, layout, B // 2, ts, xidx)],
                     dim=2)
    k, xk = torch.arange(topk), torch.arange(xtopk)
    valid = torch.cat([(idx >= 0) & (idx < nb * B) & (k < lens[:, None, None]),
                       (xidx >= 0) & (xidx < nb * B // 2) & (xk < xlens[:, None, None])], dim=2)
    n = b * s_q
    check_attention(out.view(n, H, 512), lse.view(n, H), q.view(n, H, d),
                    rows.view(n, topk + xtopk, d), valid.view(n, -1), d ** -0.5, 512, sink)


def test_sparse_attention_combine():
    """Against the float64 merge; empty splits (lse -inf) are never read (their partial_o is
    NaN here); a row of only empty splits gives out 0, lse +inf."""
    b, s_q, H, S, d_v = 2, 3, gpu_or(5, 64), 4, 512
    po = torch.randn(b, s_q, H, S, d_v)
    pl = torch.randn(b, s_q, H, S) * 3
    pl[0, 0, :, 1] = -math.inf
    po[0, 0, :, 1] = float("nan")
    pl[1, 2, 0, :] = -math.inf
    po[1, 2, 0, :] = float("nan")
    sink = torch.randn(H)
    out, lse = poisoned((b, s_q, H, d_v), torch.bfloat16), poisoned((b, s_q, H), torch.float32)
    op("sparse_attention_combine")(*to_dev(po, pl, sink), out, lse)
    w = torch.softmax(pl.to(F64), -1).nan_to_num(0.0)
    want_lse = torch.logsumexp(pl.to(F64), -1)
    want = torch.einsum("bshk,bshkd->bshd", w, po.to(F64).nan_to_num(0.0))
    want = want / (1 + torch.exp(sink.to(F64) - want_lse))[..., None]
    empty = torch.isinf(want_lse) & (want_lse < 0)
    want = torch.where(empty[..., None], 0.0, want)
    want_lse = torch.where(empty, math.inf, want_lse)
    got = out.cpu().to(F64)
    assert (got - want).abs().max() <= 2.0 ** -8 * want.abs().max()
    assert ((lse.cpu().to(F64) - want_lse).abs().nan_to_num(0.0) <= 1e-5).all()
    assert (lse.cpu()[1, 2, 0] == math.inf) and (got[1, 2, 0] == 0).all()

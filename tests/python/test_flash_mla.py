"""dsv4attn.flash_mla against float64 references of FlashMLA's contract (tests/ref.py semantics).

Tolerances: out is bf16 (8 significant bits): |out - ref| <= 2e-2 · max|ref| + 2e-3 covers one
bf16 rounding of the output plus fp32 accumulation over <= 256 keys. lse / max_logits are fp32
computed from bf16 q and exactly decoded keys: 1e-4 absolute (fp32 dot products of length 512).
"""
import math

import pytest
import torch

import dsv4attn
from dsv4attn.flash_mla import (alloc_kv_cache, flash_mla_sparse_fwd, flash_mla_with_kvcache,
                                get_mla_metadata, kv_cache_block_bytes)
from conftest import poisoned
import reference as ref


def fill_cache(num_blocks, block_size, layout, device, scale=1.0):
    """A FlashMLA-view cache with random tokens written through dsv4attn's quantizer (on the
    CPU), on `device` with the layout's padded block stride (a plain .to() would pack it)."""
    cache = alloc_kv_cache(num_blocks, block_size, layout)
    dim = 576 if layout == "v32_fp8" else 512
    values = torch.randn(num_blocks * block_size, dim) * scale
    block_bytes = kv_cache_block_bytes(layout, block_size)

    def byte_blocks(c):
        return torch.as_strided(c.view(torch.uint8), (num_blocks, block_bytes), (block_bytes, 1))

    blocks = byte_blocks(cache)
    torch.ops.dsv4.kv_quantize(blocks, layout, block_size, 1.0, values,
                               torch.arange(num_blocks * block_size))
    if device.type == "cpu":
        return cache, blocks, values
    on_device = alloc_kv_cache(num_blocks, block_size, layout, device)
    byte_blocks(on_device).copy_(blocks)
    return on_device, blocks, values


def decode_rows(blocks, block_size, layout, idx):
    decoder = ref.decode_v32 if layout == "v32_fp8" else ref.decode_model1
    flat = idx.reshape(-1).clamp(min=0)
    return decoder(blocks.cpu(), block_size, flat.tolist()).view(*idx.shape, -1)


def test_cache_bytes_match_spec_layout():
    # The reference decoder reads docs/spec.md §7's byte layout; quantization error <= 2^-4 relative.
    cache, blocks, values = fill_cache(2, 64, "model1_fp8", torch.device("cpu"))
    got = ref.decode_model1(blocks, 64, range(128))
    want = values.to(torch.float64)
    want[:, 448:] = values[:, 448:].to(torch.bfloat16).to(torch.float64)
    blockmax = want[:, :448].abs().view(128, 7, 64).amax(-1).repeat_interleave(64, 1)
    assert torch.all((got[:, :448] - want[:, :448]).abs() <= blockmax * 2 ** -4)
    assert torch.equal(got[:, 448:], want[:, 448:])


@pytest.mark.parametrize("h_q", [16, 64])
@pytest.mark.parametrize("layout", ["model1_fp8", "v32_fp8"])
@pytest.mark.parametrize("features", ["plain", "topk_length", "sink", "extra", "extra+all"])
def test_decode_matches_reference(device, h_q, layout, features):
    b, s_q, topk, extra_topk = 3, 2, 96, 40
    d_qk = 576 if layout == "v32_fp8" else 512
    cache, blocks, _ = fill_cache(6, 64, layout, device)
    num_slots = 6 * 64
    q = torch.randn(b, s_q, h_q, d_qk, dtype=torch.bfloat16, device=device)
    indices = torch.randint(0, num_slots, (b, s_q, topk), dtype=torch.int32)
    indices[torch.rand(indices.shape) < 0.2] = -1
    kwargs, valid = {}, indices >= 0
    rows = decode_rows(blocks, 64, layout, indices)
    if "topk_length" in features or "all" in features:
        topk_length = torch.tensor([topk, 17, 0], dtype=torch.int32)
        kwargs["topk_length"] = topk_length.to(device)
        valid &= torch.arange(topk)[None, None, :] < topk_length[:, None, None]
    sink = None
    if "sink" in features or "all" in features:
        sink = torch.randn(h_q) * 2
        sink[0], sink[1] = -math.inf, math.inf
        kwargs["attn_sink"] = sink.to(device)
    if "extra" in features:
        ecache, eblocks, _ = fill_cache(3, 2, layout, device)
        eidx = torch.randint(-1, 6, (b, s_q, extra_topk), dtype=torch.int32)
        kwargs["extra_k_cache"] = ecache
        kwargs["extra_indices_in_kvcache"] = eidx.to(device)
        evalid = eidx >= 0
        if "all" in features:
            elen = torch.tensor([3, extra_topk, 0], dtype=torch.int32)
            kwargs["extra_topk_length"] = elen.to(device)
            evalid &= torch.arange(extra_topk)[None, None, :] < elen[:, None, None]
        rows = torch.cat([rows, decode_rows(eblocks, 2, layout, eidx)], dim=2)
        valid = torch.cat([valid, evalid], dim=2)
    scale = 0.7 * d_qk ** -0.5
    meta, _ = get_mla_metadata()
    out_buf = poisoned((b, s_q, h_q, 512), torch.bfloat16, device)
    out, lse = flash_mla_with_kvcache(q, cache, None, None, 512, meta, softmax_scale=scale,
                                      is_fp8_kvcache=True, indices=indices.to(device),
                                      out=out_buf, **kwargs)
    assert out.data_ptr() == out_buf.data_ptr()
    assert lse.shape == (b, h_q, s_q) and lse.dtype == torch.float32

    want_out, want_lse, _ = ref.sparse_attention(
        q.cpu().view(b * s_q, h_q, d_qk), rows.view(b * s_q, -1, d_qk),
        valid.view(b * s_q, -1), scale, 512, sink)
    got = out.cpu().to(torch.float64).view(b * s_q, h_q, 512)
    tol = 2e-2 * want_out.abs().max() + 2e-3
    assert torch.all((got - want_out).abs() <= tol)
    got_lse = lse.cpu().transpose(1, 2).reshape(b * s_q, h_q).to(torch.float64)
    finite = torch.isfinite(want_lse)
    assert torch.equal(torch.isfinite(got_lse), finite)
    assert torch.all(got_lse[~finite] == math.inf)
    assert torch.allclose(got_lse[finite], want_lse[finite], atol=1e-4, rtol=1e-5)
    if "topk_length" in features and "extra" not in features:  # batch 2 has no valid key
        assert torch.all(out[2] == 0) and torch.all(lse[2] == math.inf)

    # The metadata is reusable for the same shapes and gives the same result.
    out2, _ = flash_mla_with_kvcache(q, cache, None, None, 512, meta, softmax_scale=scale,
                                     is_fp8_kvcache=True, indices=indices.to(device), **kwargs)
    assert torch.equal(out2, out)


def test_decode_bf16_cache_extension(device):
    cache = alloc_kv_cache(2, 64, "bf16", device)
    cache.copy_(torch.randn(cache.shape, dtype=torch.bfloat16))
    q = torch.randn(1, 1, 16, 512, dtype=torch.bfloat16, device=device)
    idx = torch.randint(0, 128, (1, 1, 32), dtype=torch.int32)
    out, lse = flash_mla_with_kvcache(q, cache, None, None, 512, get_mla_metadata()[0],
                                      indices=idx.to(device))
    rows = cache.reshape(128, 512)[idx.view(-1).long()].cpu().to(torch.float64)
    want, want_lse, _ = ref.sparse_attention(q.cpu().view(1, 16, 512), rows.view(1, 32, 512),
                                             torch.ones(1, 32, dtype=torch.bool),
                                             512 ** -0.5, 512)
    assert torch.allclose(out.cpu().double().view(1, 16, 512), want, atol=2e-2 * want.abs().max())
    assert torch.allclose(lse.cpu().double().view(1, 16), want_lse, atol=1e-4)


@pytest.mark.parametrize("h_q", [16, 128])
@pytest.mark.parametrize("d_qk", [512, 576])
@pytest.mark.parametrize("with_sink,with_len", [(False, False), (True, True)])
def test_sparse_fwd_matches_reference(device, h_q, d_qk, with_sink, with_len):
    s_q, s_kv, topk = 7, 150, 64
    q = torch.randn(s_q, h_q, d_qk, dtype=torch.bfloat16, device=device)
    kv = torch.randn(s_kv, 1, d_qk, dtype=torch.bfloat16, device=device)
    indices = torch.randint(-1, s_kv + 20, (s_q, 1, topk), dtype=torch.int32)  # -1 / >= s_kv
    indices[3] = -1                                                          # no valid key
    valid = (indices[:, 0] >= 0) & (indices[:, 0] < s_kv)
    kwargs, sink = {}, None
    if with_len:
        topk_length = torch.randint(0, topk + 1, (s_q,), dtype=torch.int32)
        kwargs["topk_length"] = topk_length.to(device)
        valid &= torch.arange(topk)[None, :] < topk_length[:, None]
    if with_sink:
        sink = torch.randn(h_q)
        kwargs["attn_sink"] = sink.to(device)
    scale = d_qk ** -0.5
    out, max_logits, lse = flash_mla_sparse_fwd(q, kv, indices.to(device), scale, 512, **kwargs)
    rows = kv.cpu()[indices[:, 0].clamp(0, s_kv - 1).long(), 0]
    want, want_lse, want_max = ref.sparse_attention(q.cpu(), rows, valid, scale, 512, sink)
    assert out.shape == (s_q, h_q, 512) and max_logits.shape == lse.shape == (s_q, h_q)
    tol = 2e-2 * want.abs().max() + 2e-3
    assert torch.all((out.cpu().double() - want).abs() <= tol)
    finite = torch.isfinite(want_lse)
    assert torch.all(lse.cpu()[~finite] == math.inf)
    assert torch.all(max_logits.cpu()[~finite] == -math.inf)
    assert torch.all(out.cpu()[3] == 0)
    # Natural-log lse and natural-unit max_logits, like FlashMLA's current kernels.
    assert torch.allclose(lse.cpu().double()[finite], want_lse[finite], atol=1e-4)
    assert torch.allclose(max_logits.cpu().double()[finite], want_max[finite], atol=1e-4)


def test_sparse_fwd_indexer_lse(device):
    s_q, h_q, s_kv, topk, itopk = 4, 16, 80, 64, 32
    q = torch.randn(s_q, h_q, 512, dtype=torch.bfloat16, device=device)
    kv = torch.randn(s_kv, 1, 512, dtype=torch.bfloat16, device=device)
    indices = torch.randint(0, s_kv, (s_q, 1, topk), dtype=torch.int32)
    res = flash_mla_sparse_fwd(q, kv, indices.to(device), 0.05, indexer_topk=itopk)
    assert len(res) == 4
    rows = kv.cpu()[indices[:, 0, :itopk].long(), 0]
    _, want, _ = ref.sparse_attention(q.cpu(), rows, torch.ones(s_q, itopk, dtype=torch.bool),
                                      0.05, 512)
    assert torch.allclose(res[3].cpu().double(), want, atol=1e-4)


def test_no_valid_key_decode(device):
    cache, _, _ = fill_cache(1, 64, "model1_fp8", device)
    q = torch.randn(1, 1, 16, 512, dtype=torch.bfloat16, device=device)
    idx = torch.full((1, 1, 64), -1, dtype=torch.int32, device=device)
    sink = torch.zeros(16, device=device)
    out, lse = flash_mla_with_kvcache(q, cache, None, None, 512, get_mla_metadata()[0],
                                      is_fp8_kvcache=True, indices=idx, attn_sink=sink)
    assert torch.all(out == 0) and torch.all(lse == math.inf)


# ---------------------------------------------------------------- wrong inputs
def _decode_args(device):
    cache, _, _ = fill_cache(2, 64, "model1_fp8", device)
    q = torch.randn(2, 1, 16, 512, dtype=torch.bfloat16, device=device)
    idx = torch.randint(0, 128, (2, 1, 32), dtype=torch.int32, device=device)
    return q, cache, idx


@pytest.mark.parametrize("case,message", [
    ("dense", "dense (non-sparse)"),
    ("causal", "causal"),
    ("num_splits", "num_splits"),
    ("int64_indices", "indices.dtype"),
    ("bad_token_bytes", "bytes per token"),
    ("bad_block_stride", "stride(0)"),
    ("q_dim_mismatch", "q.shape[-1]"),
    # FlashMLA's sparse decode takes a bf16 q only: an FP8 one (which dsv4attn's own op reads
    # with a q_scale this interface lacks) is refused by name, as is fp32.
    ("fp8_q", "q.dtype: expected torch.bfloat16, got torch.float8_e4m3fn"),
    ("fp32_q", "q.dtype: expected torch.bfloat16, got torch.float32"),
    ("index_out_of_range", "indices"),
    ("extra_without_cache", "extra_indices_in_kvcache"),
    ("bad_metadata", "tile_scheduler_metadata"),
])
def test_decode_errors(case, message):
    device = torch.device("cpu")
    q, cache, idx = _decode_args(device)
    kw = dict(is_fp8_kvcache=True, indices=idx)
    meta = get_mla_metadata()[0]
    if case == "dense":
        kw.pop("indices")
    elif case == "causal":
        kw["causal"] = True
    elif case == "num_splits":
        kw["num_splits"] = 4
    elif case == "int64_indices":
        kw["indices"] = idx.long()
    elif case == "bad_token_bytes":
        cache = torch.zeros(2, 64, 1, 600, dtype=torch.uint8)
    elif case == "bad_block_stride":
        cache = torch.zeros(2, 64, 1, 584, dtype=torch.uint8)
    elif case == "q_dim_mismatch":
        q = torch.randn(2, 1, 16, 576, dtype=torch.bfloat16)
    elif case == "fp8_q":
        q = q.to(torch.float8_e4m3fn)
    elif case == "fp32_q":
        q = q.float()
    elif case == "index_out_of_range":
        bad = idx.clone()
        bad[1, 0, 5] = 10_000
        kw["indices"] = bad
    elif case == "extra_without_cache":
        kw["extra_indices_in_kvcache"] = idx
    elif case == "bad_metadata":
        meta = object()
    out = poisoned((2, 1, 16, 512), torch.bfloat16, device)
    with pytest.raises(dsv4attn.Error, match=message.replace("(", r"\(").replace(")", r"\)")
                       .replace("[", r"\[").replace("]", r"\]")):
        flash_mla_with_kvcache(q, cache, None, None, 512, meta, out=out, **kw)
    assert torch.all(torch.isnan(out)), "a rejected call must not write its output"


def test_metadata_consistency_is_checked():
    q, cache, idx = _decode_args(torch.device("cpu"))
    meta = get_mla_metadata()[0]
    flash_mla_with_kvcache(q, cache, None, None, 512, meta, is_fp8_kvcache=True, indices=idx)
    with pytest.raises(dsv4attn.Error, match="sched_meta.config.topk"):
        flash_mla_with_kvcache(q, cache, None, None, 512, meta, is_fp8_kvcache=True,
                               indices=idx[..., :16].contiguous())


def test_sparse_fwd_errors():
    q = torch.randn(4, 16, 512, dtype=torch.bfloat16)
    kv = torch.randn(20, 1, 512, dtype=torch.bfloat16)
    idx = torch.zeros(4, 1, 8, dtype=torch.int32)
    with pytest.raises(dsv4attn.Error, match="kv"):
        flash_mla_sparse_fwd(q, kv.float(), idx, 0.1)
    with pytest.raises(dsv4attn.Error, match="q.ndim"):
        flash_mla_sparse_fwd(q[None], kv, idx, 0.1)
    with pytest.raises(dsv4attn.Error, match="attn_sink"):
        flash_mla_sparse_fwd(q, kv, idx, 0.1, attn_sink=torch.zeros(3))
    with pytest.raises(dsv4attn.Error, match="indexer_topk"):
        flash_mla_sparse_fwd(q, kv, idx, 0.1, indexer_topk=9)


def test_torch_compile_traces_the_ops():
    q = torch.randn(3, 16, 512, dtype=torch.bfloat16)
    kv = torch.randn(40, 1, 512, dtype=torch.bfloat16)
    idx = torch.randint(0, 40, (3, 1, 16), dtype=torch.int32)

    def f(q, kv, idx):
        out, _, lse = flash_mla_sparse_fwd(q, kv, idx, 0.1)
        return out.float() * 2, lse

    compiled = torch.compile(f, backend="aot_eager", fullgraph=True)
    got, want = compiled(q, kv, idx), f(q, kv, idx)
    assert torch.equal(got[0], want[0]) and torch.equal(got[1], want[1])


def test_torch_compile_decode_wrapper():
    q, cache, idx = _decode_args(torch.device("cpu"))

    def f(q, cache, idx):
        out, lse = flash_mla_with_kvcache(q, cache, None, None, 512, get_mla_metadata()[0],
                                          is_fp8_kvcache=True, indices=idx)
        return out.float().sum(-1), lse

    got = torch.compile(f, backend="aot_eager", fullgraph=True)(q, cache, idx)
    want = f(q, cache, idx)
    assert torch.equal(got[0], want[0]) and torch.equal(got[1], want[1])

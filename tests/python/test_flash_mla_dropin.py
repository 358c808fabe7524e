"""dsv4attn.flash_mla as a drop-in for FlashMLA, fed the inputs FlashMLA's own tests and vLLM's
backends pass (the seeds), on CPU and CUDA (CUDA cases skip without a GPU):

- q, kv and indices as FlashMLA's tests/lib.py makes them: every dim padded inside a larger buffer
  (its `non_contiguousify`), q's [b, s_q] dims laid out swapped so they do not merge, indices a
  transposed, padded view;
- caches with padded block strides in FlashMLA's [num_blocks, block_size, 1, bytes] view: V3.2
  blocks of 64 x 656 B every 42640 B (quantize_k_cache's layout), MODEL1 blocks past their
  576-aligned size;
- heads padded to 64 (vLLM's `q_padded = q.new_empty(...)`: the pad rows hold garbage, here NaN);
- both metadata interfaces: the current FlashMLASchedMeta, and the older (tile_scheduler_metadata,
  num_splits) tensors that vLLM's V3.2 backend copies into persistent buffers for CUDA graphs.

Every output buffer is poisoned (NaN) beforehand. Real heads are compared with the float64
reference of reference.py (docs/spec.md §6) on O(1) data: bf16 out within 1.5e-2 · max|ref| (the CUDA
tests' bound: one bf16 rounding of the output, 2^-9, plus on CUDA the bf16 rounding of the
probabilities before P·V, fp32 accumulation over <= 200 keys), lse / max_logits within 1e-3
absolute (fp32 logits from exactly decoded keys, exp2/log2 approximations on CUDA). Strided runs
must also equal the same call on dense copies bit for bit: strides change addressing, never
arithmetic.
"""
import math

import pytest
import torch

import dsv4attn
from conftest import poisoned, requires_cuda
from dsv4attn._runtime import decode_schedule, planner_sms
from dsv4attn.flash_mla import (SCHEDULE_TAG, FlashMLASchedMeta, flash_mla_sparse_fwd,
                                flash_mla_with_kvcache, get_mla_metadata, kv_cache_block_bytes)
import reference as ref

OUT_REL, LSE_ABS = 1.5e-2, 1e-3
TOKEN_BYTES = {"model1_fp8": 584, "v32_fp8": 656}


# ---------------------------------------------------------------- FlashMLA-style inputs
def flashmla_layout(t, pad, swap01=False, fill=float("nan")):
    """`t` copied into a buffer whose dim d is padded by pad[d] elements (the padding `fill`);
    with swap01 the first two dims are laid out swapped (they don't merge). A strided view."""
    shape = list(t.shape)
    big_shape = [n + p for n, p in zip(shape, pad)]
    if swap01:
        big_shape[0], big_shape[1] = big_shape[1], big_shape[0]
    big = torch.full(big_shape, fill, dtype=t.dtype, device=t.device)
    if swap01:
        big = big.transpose(0, 1)
    view = big[tuple(slice(0, n) for n in shape)]
    view.copy_(t)
    assert not view.is_contiguous()
    return view


def padded_cache(num_blocks, block_size, layout, block_stride, device):
    """FlashMLA's [num_blocks, block_size, 1, token_bytes] uint8 view of a cache whose blocks
    are `block_stride` bytes apart (padding NaN bytes), every token random and encoded by
    dsv4attn's quantizer; also the [num_blocks, block_bytes] byte view and the values."""
    tb, bb = TOKEN_BYTES[layout], kv_cache_block_bytes(layout, block_size)
    dim = 576 if layout == "v32_fp8" else 512
    storage = torch.full((num_blocks, block_stride), 0xFF, dtype=torch.uint8)
    blocks = storage.as_strided((num_blocks, bb), (block_stride, 1))
    values = torch.randn(num_blocks * block_size, dim)
    torch.ops.dsv4.kv_quantize(blocks, layout, block_size, 1.0, values,
                               torch.arange(num_blocks * block_size))
    storage = storage.to(device)
    view = storage.as_strided((num_blocks, block_size, 1, tb), (block_stride, tb, tb, 1))
    return view, storage.as_strided((num_blocks, bb), (block_stride, 1)), values


def v32_stride(block_size):
    return (block_size + 1) * 656  # quantize_k_cache: a [num_blocks, block_size + 1, 656] buffer


def model1_stride(block_size):
    return kv_cache_block_bytes("model1_fp8", block_size) + 64


def decode_rows(blocks, block_size, layout, idx):
    decoder = ref.decode_v32 if layout == "v32_fp8" else ref.decode_model1
    flat = idx.reshape(-1).clamp(min=0)
    return decoder(blocks.cpu(), block_size, flat.tolist()).view(*idx.shape, -1)


def padded_heads(q, h_pad):
    """q [..., h, d] with heads h..h_pad-1 added, holding NaN (vLLM's new_empty garbage)."""
    out = torch.full((*q.shape[:-2], h_pad, q.shape[-1]), float("nan"), dtype=q.dtype,
                     device=q.device)
    out[..., :q.shape[-2], :] = q
    return out


def expect_close(got_out, got_lse, want_out, want_lse):
    got_out = got_out.cpu().to(torch.float64)
    tol = OUT_REL * want_out.abs().max()
    assert torch.all((got_out - want_out).abs() <= tol), (got_out - want_out).abs().max()
    got_lse = got_lse.cpu().to(torch.float64)
    finite = torch.isfinite(want_lse)
    assert torch.all(got_lse[~finite] == math.inf)
    assert torch.allclose(got_lse[finite], want_lse[finite], atol=LSE_ABS, rtol=0)


def legacy_metadata(b, s_q, h_q, topk, device):
    """The older interface as vLLM's V3.2 backend drives it: get_mla_metadata(...) on the host's
    shapes, copied into persistent buffers sized by the seed's own formula."""
    meta, splits = get_mla_metadata(
        cache_seqlens=torch.full((b,), topk, dtype=torch.int32, device=device),
        num_q_tokens_per_head_k=s_q * h_q, topk=topk, num_heads_q=h_q, num_heads_k=1,
        is_fp8_kvcache=True)
    sm_count = planner_sms(torch.device(device))
    max_parts = max((sm_count // 2) // (-(-h_q // 128) * 1), 1)  # the seed's buffer size
    meta_buf = torch.empty((max_parts, 8), dtype=torch.int32, device=device)
    splits_buf = torch.empty((b + 1,), dtype=torch.int32, device=device)
    meta_buf[:meta.size(0)].copy_(meta)
    splits_buf.copy_(splits)
    return meta_buf[:meta.size(0)], splits_buf


# ---------------------------------------------------------------- decode
DECODE_CASES = [  # (layout, h_real, extra scope)
    ("model1_fp8", 40, True),
    ("v32_fp8", 40, False),
]


@pytest.mark.parametrize("interface", ["current", "legacy"])
@pytest.mark.parametrize("layout,h_real,with_extra", DECODE_CASES)
def test_decode_flashmla_style_inputs(device, layout, h_real, with_extra, interface):
    b, s_q, h_pad, topk, extra_topk, bs = 3, 2, 64, 96, 40, 64
    d_qk = 576 if layout == "v32_fp8" else 512
    stride = v32_stride(bs) if layout == "v32_fp8" else model1_stride(bs)
    if layout == "v32_fp8":
        assert stride == 42640  # FlashMLA's V3.2 test caches
    cache, blocks, _ = padded_cache(6, bs, layout, stride, device)
    q_real = torch.randn(b, s_q, h_real, d_qk).to(torch.bfloat16)
    q = padded_heads(q_real, h_pad).to(device)
    indices = torch.randint(0, 6 * bs, (b, s_q, topk), dtype=torch.int32)
    indices[torch.rand(indices.shape) < 0.2] = -1
    topk_length = torch.tensor([topk, 17, 0], dtype=torch.int32)
    valid = (indices >= 0) & (torch.arange(topk) < topk_length[:, None, None])
    rows = decode_rows(blocks, bs, layout, indices)
    sink = torch.randn(h_pad) * 2
    sink[0], sink[1] = -math.inf, math.inf
    kwargs = dict(topk_length=topk_length.to(device), attn_sink=sink.to(device))
    if with_extra:
        ecache, eblocks, _ = padded_cache(3, 2, layout,
                                          kv_cache_block_bytes(layout, 2) + 48, device)
        eidx = torch.randint(-1, 6, (b, s_q, extra_topk), dtype=torch.int32)
        elen = torch.tensor([3, extra_topk, 0], dtype=torch.int32)
        kwargs.update(extra_k_cache=ecache, extra_topk_length=elen.to(device))
        rows = torch.cat([rows, decode_rows(eblocks, 2, layout, eidx)], dim=2)
        valid = torch.cat([valid, (eidx >= 0) & (torch.arange(extra_topk) < elen[:, None, None])],
                          dim=2)
    scale = 0.7 * d_qk ** -0.5

    def run(q, indices, eidx, out):
        if interface == "current":
            meta, splits = get_mla_metadata()[0], None
        else:
            meta, splits = legacy_metadata(b, s_q, h_pad, topk, device)
        extra = {"extra_indices_in_kvcache": eidx} if with_extra else {}
        return flash_mla_with_kvcache(q, cache, None, None, 512, meta, splits,
                                      softmax_scale=scale, is_fp8_kvcache=True, indices=indices,
                                      out=out, **kwargs, **extra)

    # FlashMLA-style: q and indices non-contiguous ([b, s_q] don't merge), out a padded slice.
    q_s = flashmla_layout(q, (1, 2, 3, 8), swap01=True)
    idx_s = flashmla_layout(indices.to(device), (2, 1, 5), swap01=True, fill=0x7F)
    eidx_s = flashmla_layout(eidx.to(device), (1, 1, 3), swap01=True, fill=0x7F) \
        if with_extra else None
    out_s = flashmla_layout(poisoned((b, s_q, h_pad, 512), torch.bfloat16, device),
                            (1, 1, 2, 8), swap01=True)
    out, lse = run(q_s, idx_s, eidx_s, out_s)
    assert out.data_ptr() == out_s.data_ptr() and lse.shape == (b, h_pad, s_q)

    want_out, want_lse, _ = ref.sparse_attention(
        q_real.view(b * s_q, h_real, d_qk), rows.view(b * s_q, -1, d_qk),
        valid.view(b * s_q, -1), scale, 512, sink[:h_real])
    expect_close(out[:, :, :h_real].reshape(b * s_q, h_real, 512),
                 lse.transpose(1, 2)[:, :, :h_real].reshape(b * s_q, h_real), want_out, want_lse)

    # The same call on dense copies: bit-identical (pad heads included: rows are independent).
    dense_out, dense_lse = run(q.contiguous(), indices.to(device),
                               eidx.to(device) if with_extra else None,
                               poisoned((b, s_q, h_pad, 512), torch.bfloat16, device))
    assert torch.equal(out[:, :, :h_real], dense_out[:, :, :h_real])
    assert torch.equal(lse[:, :h_real], dense_lse[:, :h_real])


def test_decode_like_the_v32_seed(device):
    """vLLM's FlashMLASparse backend (V3.2): all tokens in one batch (q.unsqueeze(0)), the cache
    [num_blocks, 64, 656] seen through .view(uint8).unsqueeze(-2), a dummy block table,
    cache_seqlens = max_model_len, the older metadata in persistent buffers."""
    tokens, heads, topk, bs = 5, 16, 128, 64
    kv_cache, blocks, _ = padded_cache(8, bs, "v32_fp8", v32_stride(bs), device)
    kv_cache = kv_cache.squeeze(2)  # the backend's [num_blocks, 64, 656] cache tensor
    q = torch.randn(tokens, heads, 576).to(torch.bfloat16).to(device)
    topk_indices = torch.randint(-1, 8 * bs, (tokens, topk), dtype=torch.int32)
    meta, splits = legacy_metadata(1, tokens, heads, topk, device)
    out, lse = flash_mla_with_kvcache(
        q=q.unsqueeze(0), k_cache=kv_cache.view(torch.uint8).unsqueeze(-2),
        block_table=torch.empty((1, 1), dtype=torch.int32, device=device), head_dim_v=512,
        cache_seqlens=torch.tensor([4096], dtype=torch.int32, device=device),
        tile_scheduler_metadata=meta, num_splits=splits, is_fp8_kvcache=True,
        indices=topk_indices.to(device).unsqueeze(0), softmax_scale=576 ** -0.5)
    assert out.shape == (1, tokens, heads, 512) and lse.shape == (1, heads, tokens)
    rows = decode_rows(blocks, bs, "v32_fp8", topk_indices)
    want_out, want_lse, _ = ref.sparse_attention(q.cpu(), rows, topk_indices >= 0,
                                                 576 ** -0.5, 512)
    expect_close(out[0], lse[0].T, want_out, want_lse)


def test_legacy_metadata_encodes_the_schedule(device):
    b, s_q, h, topk = 2, 3, 128, 2048
    meta, splits = get_mla_metadata(torch.full((b,), topk, dtype=torch.int32, device=device),
                                    s_q * h, 1, num_heads_q=h, is_fp8_kvcache=True, topk=topk)
    assert meta.dtype == splits.dtype == torch.int32
    assert meta.device.type == splits.device.type == torch.device(device).type
    assert meta.shape == (1, 8) and splits.shape == (b + 1,)
    sms = planner_sms(torch.device(device))
    n, split_len, _ = decode_schedule(b, s_q, h, topk, sms, 512)
    assert meta.cpu()[0].tolist() == [SCHEDULE_TAG, n, split_len, b, s_q, h, topk, sms]
    assert splits.cpu().tolist() == [i * n for i in range(b + 1)]
    # No arguments: the current interface.
    current, none = get_mla_metadata()
    assert isinstance(current, FlashMLASchedMeta) and none is None


@pytest.mark.parametrize("case,message", [
    ("no_topk", "topk"),
    ("bad_heads_k", "num_heads_k"),
    ("tokens_not_multiple", "num_q_tokens_per_head_k"),
    ("splits_shape", r"num_splits: expected an int32 \[3\]"),
    ("meta_dtype", "tile_scheduler_metadata"),
    ("meta_width", "tile_scheduler_metadata"),
    ("tensor_splits_with_schedmeta", "num_splits: expected None with a FlashMLASchedMeta"),
])
def test_legacy_interface_errors(case, message):
    b, s_q, h, topk = 2, 1, 16, 64
    seqlens = torch.full((b,), topk, dtype=torch.int32)
    kw = dict(num_q_tokens_per_head_k=s_q * h, num_heads_q=h, num_heads_k=1, topk=topk)
    if case in ("no_topk", "bad_heads_k", "tokens_not_multiple"):
        kw.update({"no_topk": dict(topk=None), "bad_heads_k": dict(num_heads_k=2),
                   "tokens_not_multiple": dict(num_q_tokens_per_head_k=17)}[case])
        with pytest.raises(dsv4attn.Error, match=message):
            get_mla_metadata(cache_seqlens=seqlens, **kw)
        return
    meta, splits = get_mla_metadata(cache_seqlens=seqlens, **kw)
    if case == "splits_shape":
        splits = torch.zeros(b, dtype=torch.int32)
    elif case == "meta_dtype":
        meta = meta.long()
    elif case == "meta_width":
        meta = torch.zeros(1, 4, dtype=torch.int32)
    elif case == "tensor_splits_with_schedmeta":
        meta = get_mla_metadata()[0]
    cache, _, _ = padded_cache(2, 64, "model1_fp8", model1_stride(64), "cpu")
    q = torch.randn(b, s_q, h, 512).to(torch.bfloat16)
    idx = torch.randint(0, 128, (b, s_q, topk), dtype=torch.int32)
    out = poisoned((b, s_q, h, 512), torch.bfloat16, "cpu")
    with pytest.raises(dsv4attn.Error, match=message):
        flash_mla_with_kvcache(q, cache, None, None, 512, meta, splits, is_fp8_kvcache=True,
                               indices=idx, out=out)
    assert torch.all(torch.isnan(out)), "a rejected call must not write its output"


@pytest.mark.parametrize("case,message", [
    ("stride_below_block", "k_cache.stride(0)"),
    ("stride_unaligned", "k_cache.stride(0)"),
    ("tokens_not_dense", "tokens dense within a block"),
])
def test_cache_stride_errors(case, message):
    bb = kv_cache_block_bytes("v32_fp8", 64)
    storage = torch.zeros(3 * (bb + 2 * 656), dtype=torch.uint8)
    stride, token_stride = {"stride_below_block": (bb - 656, 656),
                            "stride_unaligned": (bb + 8, 656),
                            "tokens_not_dense": (bb + 2 * 656, 657)}[case]
    cache = storage.as_strided((2, 64, 1, 656), (stride, token_stride, 656, 1))
    q = torch.randn(1, 1, 16, 576).to(torch.bfloat16)
    idx = torch.zeros(1, 1, 64, dtype=torch.int32)
    with pytest.raises(dsv4attn.Error, match=message.replace("(", r"\(").replace(")", r"\)")):
        flash_mla_with_kvcache(q, cache, None, None, 512, get_mla_metadata()[0],
                               is_fp8_kvcache=True, indices=idx)


def test_bf16_cache_padded_and_strided(device):
    """Extension: a bf16 cache (is_fp8_kvcache=False) with a padded block stride, q whose
    [b, s_q] don't merge (on CUDA: the prefill kernel per batch entry, still without a copy)."""
    b, s_q, h, topk, bs, nb = 2, 3, 16, 48, 16, 5
    stride = (bs + 3) * 512  # elements: three tokens of padding per block
    storage = torch.full((nb * stride,), float("nan"), dtype=torch.bfloat16)
    cache = storage.as_strided((nb, bs, 1, 512), (stride, 512, 512, 1))
    cache.copy_(torch.randn(nb, bs, 1, 512).to(torch.bfloat16))
    storage = storage.to(device)
    cache_d = storage.as_strided((nb, bs, 1, 512), (stride, 512, 512, 1))
    q = torch.randn(b, s_q, h, 512).to(torch.bfloat16)
    idx = torch.randint(-1, nb * bs, (b, s_q, topk), dtype=torch.int32)
    length = torch.tensor([topk, 20], dtype=torch.int32)
    out, lse = flash_mla_with_kvcache(
        flashmla_layout(q.to(device), (1, 1, 2, 8), swap01=True), cache_d, None, None, 512,
        get_mla_metadata()[0], indices=flashmla_layout(idx.to(device), (1, 2, 3), swap01=True,
                                                       fill=0x7F),
        topk_length=length.to(device))
    rows = cache.reshape(nb * bs, 512)[idx.clamp(min=0).long()].to(torch.float64)
    valid = (idx >= 0) & (torch.arange(topk) < length[:, None, None])
    want_out, want_lse, _ = ref.sparse_attention(q.view(b * s_q, h, 512),
                                                 rows.view(b * s_q, topk, 512),
                                                 valid.view(b * s_q, topk), 512 ** -0.5, 512)
    expect_close(out.reshape(b * s_q, h, 512), lse.transpose(1, 2).reshape(b * s_q, h),
                 want_out, want_lse)


# ---------------------------------------------------------------- prefill
INVALID = [-2147483648, -123456, -1, 114514, 1919810, 2147480000, 2147483647]  # + s_kv itself


@pytest.mark.parametrize("d_qk", [512, 576])
@pytest.mark.parametrize("with_sink,with_len", [(False, False), (True, False), (False, True),
                                                (True, True)])
def test_sparse_fwd_flashmla_style_inputs(device, d_qk, with_sink, with_len):
    s_q, s_kv, topk, h_real, h_pad = 6, 300, 128, 40, 64
    q_real = torch.randn(s_q, h_real, d_qk).to(torch.bfloat16)
    q = padded_heads(q_real, h_pad)
    kv = torch.randn(s_kv, 1, d_qk).to(torch.bfloat16)
    indices = torch.randint(0, s_kv, (s_q, 1, topk), dtype=torch.int32)
    bad = torch.rand(indices.shape) < 0.25
    choices = torch.tensor(INVALID + [s_kv], dtype=torch.int32)
    indices[bad] = choices[torch.randint(0, len(choices), (int(bad.sum()),))]
    indices[2] = -1  # a query with no valid key
    valid = (indices[:, 0] >= 0) & (indices[:, 0] < s_kv)
    kwargs, sink = {}, None
    if with_len:
        length = torch.randint(0, topk + 1, (s_q,), dtype=torch.int32)
        kwargs["topk_length"] = length.to(device)
        valid &= torch.arange(topk) < length[:, None]
    if with_sink:
        sink = torch.randn(h_pad)
        sink[3], sink[4] = math.inf, -math.inf
        kwargs["attn_sink"] = sink.to(device)
    out_buf = flashmla_layout(poisoned((s_q, h_pad, 512), torch.bfloat16, device), (1, 2, 8))
    args = (flashmla_layout(q.to(device), (1, 2, 8)), flashmla_layout(kv.to(device), (3, 1, 16)),
            flashmla_layout(indices.to(device), (1, 2, 5), swap01=True, fill=0x7F))
    scale = d_qk ** -0.5
    out, max_logits, lse = flash_mla_sparse_fwd(*args, scale, 512, out=out_buf, **kwargs)
    assert out.data_ptr() == out_buf.data_ptr()

    rows = kv[indices[:, 0].clamp(0, s_kv - 1).long(), 0]
    want, want_lse, want_max = ref.sparse_attention(q_real, rows, valid, scale, 512,
                                                    sink[:h_real] if with_sink else None)
    expect_close(out[:, :h_real], lse[:, :h_real], want, want_lse)
    finite = torch.isfinite(want_lse)
    got_max = max_logits[:, :h_real].cpu().double()
    assert torch.all(got_max[~finite] == -math.inf)
    assert torch.allclose(got_max[finite], want_max[finite], atol=LSE_ABS, rtol=0)
    assert torch.all(out[2, :h_real].cpu() == 0)

    dense = flash_mla_sparse_fwd(q.to(device), kv.to(device), indices.to(device), scale, 512,
                                 **kwargs)
    for got, want_t in zip((out, max_logits, lse), dense):
        assert torch.equal(got[:, :h_real], want_t[:, :h_real])


def test_sparse_fwd_indexer_lse_with_strided_indices(device):
    s_q, h, s_kv, topk, itopk = 4, 16, 80, 64, 32
    q = torch.randn(s_q, h, 512, dtype=torch.bfloat16, device=device)
    kv = torch.randn(s_kv, 1, 512, dtype=torch.bfloat16, device=device)
    indices = torch.randint(0, s_kv, (s_q, 1, topk), dtype=torch.int32)
    res = flash_mla_sparse_fwd(q, kv, flashmla_layout(indices.to(device), (2, 1, 3), fill=0x7F),
                               0.05, indexer_topk=itopk)
    rows = kv.cpu()[indices[:, 0, :itopk].long(), 0]
    _, want, _ = ref.sparse_attention(q.cpu(), rows, torch.ones(s_q, itopk, dtype=torch.bool),
                                      0.05, 512)
    assert torch.allclose(res[3].cpu().double(), want, atol=LSE_ABS)


# ---------------------------------------------------------------- CUDA only
@pytest.mark.parametrize("what,message", [
    ("q_head_stride", r"q.stride\(2\): expected a multiple of 8 elements"),
    ("q_pointer", "q: expected a 16-byte aligned pointer"),
    ("out_head_stride", r"out.stride\(2\): expected a multiple of 8 elements"),
])
def test_row_alignment_rule(device, what, message):
    """On CUDA q / out rows move in 16-byte pieces: a stride or pointer that breaks that is
    refused with an error naming it, before anything is written. The CPU takes the same views."""
    cache, _, _ = padded_cache(2, 64, "model1_fp8", model1_stride(64), device)
    q = torch.randn(2, 1, 16, 512, dtype=torch.bfloat16, device=device)
    idx = torch.randint(0, 128, (2, 1, 32), dtype=torch.int32, device=device)
    out = poisoned((2, 1, 16, 512), torch.bfloat16, device)
    if what == "q_head_stride":
        q = flashmla_layout(q, (0, 0, 0, 4))  # rows 516 elements apart
    elif what == "q_pointer":  # 8 bytes into a buffer
        q = torch.randn(2 * 16 * 512 + 4, device=device).to(torch.bfloat16)[4:].view(2, 1, 16, 512)
    else:
        out = flashmla_layout(out, (0, 0, 0, 4))
    call = lambda: flash_mla_with_kvcache(q, cache, None, None, 512, get_mla_metadata()[0],
                                          is_fp8_kvcache=True, indices=idx, out=out)
    if device.type == "cpu":
        call()
        assert not torch.any(torch.isnan(out))
        return
    with pytest.raises(dsv4attn.Error, match=message):
        call()
    assert torch.all(torch.isnan(out)), "a rejected call must not write its output"


@requires_cuda
def test_legacy_interface_under_cuda_graphs():
    """The seed's pattern: persistent metadata buffers, a captured decode, replays after new
    metadata is copied in; the call never syncs the host and the replay equals eager."""
    b, s_q, h, topk, bs = 1, 4, 64, 256, 64
    cache, _, _ = padded_cache(8, bs, "v32_fp8", v32_stride(bs), "cuda")
    q = torch.randn(b, s_q, h, 576, dtype=torch.bfloat16, device="cuda")
    idx = torch.randint(-1, 8 * bs, (b, s_q, topk), dtype=torch.int32, device="cuda")
    meta_buf, splits_buf = legacy_metadata(b, s_q, h, topk, "cuda")
    out = torch.empty(b, s_q, h, 512, dtype=torch.bfloat16, device="cuda")
    lse = torch.empty(b, s_q, h, dtype=torch.float32, device="cuda")

    def step():
        flash_mla_with_kvcache(q, cache, None, None, 512, meta_buf, splits_buf,
                               is_fp8_kvcache=True, indices=idx, out=out, lse=lse)

    step()  # warm-up (workspace allocation) outside capture
    torch.cuda.synchronize()
    want_out, want_lse = out.clone(), lse.clone()
    graph = torch.cuda.CUDAGraph()
    torch.cuda.set_sync_debug_mode("error")
    try:
        with torch.cuda.graph(graph):
            step()
    finally:
        torch.cuda.set_sync_debug_mode("default")
    out.fill_(float("nan"))
    lse.fill_(float("nan"))
    new_meta, new_splits = legacy_metadata(b, s_q, h, topk, "cuda")  # the next step's metadata
    meta_buf.copy_(new_meta)
    splits_buf.copy_(new_splits)
    graph.replay()
    torch.cuda.synchronize()
    assert torch.equal(out, want_out) and torch.equal(lse, want_lse)

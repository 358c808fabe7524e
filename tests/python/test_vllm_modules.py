"""vLLM's DeepseekCompressor and Indexer (dsv4attn.vllm_ops) and the torch.ops.dsv4 compressor /
indexer ops under them, against float64 formulas (include/dsv4/compressor.h, indexer.h) on
fresh random data, on CPU tensors and (with a GPU) CUDA tensors.

Tolerances.
- Compressed entries: the projections are fp32 GEMMs of bf16 operands over hidden_size = 64
  products (each exact in fp32; the sum's rounding <= 64 · 2^-24 of its magnitude), then fp32
  softmax pooling, RMSNorm and RoPE: within 1e-4 of the entry's largest value (a wrong row,
  window or position moves an entry by O(1)). On CUDA the GEMMs run on tensor cores with the
  same bound.
- Cache bytes: exact against the float64 quantization of the entries the op reports (the
  encoders are integer code).
- Indexer top-k: the queries are FP8-quantized (one fp8 step is 2^-3 relative), so the float64
  scores of the exact queries may reorder near-ties; each selected entry's exact score must lie
  within 0.05 · (the row's score range) of the k-th best, and the selection must be exactly
  the visible count, −1 padded. With 4 of ~10 visible entries a wrong head, key or position
  picks entries far below the k-th best.
"""
import copy
import math

import pytest
import torch

import dsv4attn
from dsv4attn import vllm_ops
from dsv4attn.flash_mla import kv_cache_block_bytes
from conftest import poisoned, requires_cuda
import reference as ref

F64, I32 = torch.float64, torch.int32
HIDDEN, Q_LORA = 64, 128


def random_compressor(ratio, target):
    head_dim = 128 if target == "indexer_keys" else 512
    comp = vllm_ops.DeepseekCompressor(ratio, HIDDEN, head_dim, target=target)
    width = comp.coff * head_dim
    with torch.no_grad():
        comp.wkv.weight.copy_(torch.randn(width, HIDDEN) / 8)
        comp.wgate.weight.copy_(torch.randn(width, HIDDEN) / 8)
        comp.ape.copy_(torch.randn(ratio, width) / 2)
        comp.norm.weight.copy_(1 + 0.1 * torch.randn(head_dim))
    return comp


def expected_entry(comp, x_hist, j):
    """Entry j of one request from its hidden-state history [positions, HIDDEN], float64."""
    D, r = comp.head_dim, comp.compress_ratio
    kv = x_hist.to(F64) @ comp.wkv.weight.to(F64).T
    s = x_hist.to(F64) @ comp.wgate.weight.to(F64).T
    s = s + comp.ape.to(F64)[torch.arange(x_hist.shape[0]) % r]
    rows_kv, rows_s = [], []
    if comp.coff == 2:  # the previous window's first-half dims, then the current window's second
        for p in range(max(0, j * r - r), j * r):
            rows_kv.append(kv[p, :D])
            rows_s.append(s[p, :D])
    cur = slice(D, 2 * D) if comp.coff == 2 else slice(0, D)
    for p in range(j * r, j * r + r):
        rows_kv.append(kv[p, cur])
        rows_s.append(s[p, cur])
    e = (torch.softmax(torch.stack(rows_s), 0) * torch.stack(rows_kv)).sum(0)
    e = e * torch.rsqrt(e.pow(2).mean() + comp.eps) * comp.norm.weight.to(F64)
    e = ref.rope(e[None], torch.tensor([j * r]))[0]
    return ref.hadamard(D) @ e if comp.target == "indexer_keys" else e


class PagedState:
    """A compressor's caches for `requests` requests: the fp32 ring and the output cache, with
    shuffled block tables and a padded block stride on the output (as vLLM pads pages)."""

    def __init__(self, comp, requests, max_entries, block_size, device):
        self.B = block_size
        ring_blocks = -(-comp.ring_rows // comp.compress_ratio)
        perm = torch.randperm(requests * ring_blocks + 2)
        self.state_table = perm[:requests * ring_blocks].view(requests, ring_blocks).to(I32)
        self.state_block_size = comp.compress_ratio
        # Stale ring contents: the first call of a request must not read them.
        self.state = torch.randn(perm.numel(), comp.compress_ratio, comp.state_width)
        out_blocks = -(-max_entries // block_size)
        perm = torch.randperm(requests * out_blocks + 1)
        self.table = perm[:requests * out_blocks].view(requests, out_blocks).to(I32)
        if comp.target == "indexer_keys":
            block_bytes = block_size * 132
        else:
            block_bytes = kv_cache_block_bytes("model1_fp8", block_size)
        padded = torch.zeros(perm.numel(), block_bytes + 64, dtype=torch.uint8, device=device)
        self.cache = padded[:, :block_bytes]  # block stride block_bytes + 64
        self.state = self.state.to(device)
        self.device = device

    def metadata(self, token_to_req, context_lens):
        return vllm_ops.CompressorMetadata(
            torch.tensor(token_to_req, dtype=I32, device=self.device),
            torch.tensor(context_lens, dtype=I32, device=self.device),
            self.state_table.to(self.device), self.table.to(self.device))

    def slot(self, req, j):
        return int(self.table[req, j // self.B]) * self.B + j % self.B


def check_cache_entry(comp, cache, B, slot, entry):
    """The cache bytes at `slot` are exactly the quantization of the reported fp32 entry."""
    cache = cache.cpu()
    blk, off = divmod(slot, B)
    if comp.target == "indexer_keys":
        data = cache[blk]
        codes = data[off * 128:(off + 1) * 128].view(torch.float8_e4m3fn).to(F64)
        scale = data[B * 128 + off * 4:B * 128 + off * 4 + 4].view(torch.float32)
        want, want_scale = ref.quantize_blocks(entry[None].to(F64), 128)
        assert float(scale) == float(want_scale) and torch.equal(codes * float(scale), want[0])
    else:
        got = ref.decode_model1(cache.contiguous(), B, [slot])[0]
        nope, _ = ref.quantize_blocks(entry[None, :448].to(F64), 64)
        assert torch.equal(got[:448], nope[0])
        assert torch.equal(got[448:].float(), entry[448:].bfloat16().float())


# Two steps over two requests whose chunks split windows (the second step pools ring rows).
STEPS = {4: [[(0, 0, 6), (1, 0, 3)], [(1, 3, 7), (0, 6, 8)]], 128: [[(0, 0, 100)], [(0, 100, 31)]]}


@pytest.mark.parametrize("ratio,target", [(4, "kv_cache"), (128, "kv_cache"),
                                          (4, "indexer_keys")])
def test_deepseek_compressor(device, ratio, target):
    ref_comp = random_compressor(ratio, target)
    comp = copy.deepcopy(ref_comp).to(device)
    cos_sin = dsv4attn.rope_cos_sin(512)
    B = 8 if target == "indexer_keys" else 4
    paged = PagedState(comp, 2, 140 // ratio + 2, B, device)
    hist = {q: torch.randn(200, HIDDEN).bfloat16() for q in range(2)}
    for step in STEPS[ratio]:
        pos, t2r, ctx = [], [], [0, 0]
        for q, c, n in step:
            pos += range(c, c + n)
            t2r += [q] * n
            ctx[q] = c
        x = torch.stack([hist[q][p] for q, p in zip(t2r, pos)])
        entries = poisoned((len(pos), comp.head_dim), torch.float32, device)
        comp(x.to(device), torch.tensor(pos, device=device), cos_sin.to(device), paged.state,
             paged.cache, paged.metadata(t2r, ctx), paged.state_block_size, B, entries)
        entries = entries.cpu()
        for t, (q, p) in enumerate(zip(t2r, pos)):
            if (p + 1) % ratio:
                assert entries[t].isnan().all(), "rows of tokens that emit nothing: untouched"
                continue
            j = (p + 1) // ratio - 1
            want = expected_entry(ref_comp, hist[q][:p + 1], j)
            assert (entries[t].to(F64) - want).abs().max() <= 1e-4 * want.abs().max(), (q, j)
            check_cache_entry(comp, paged.cache, B, paged.slot(q, j), entries[t])


def test_deepseek_compressor_bad_input():
    comp = random_compressor(4, "kv_cache")
    paged = PagedState(comp, 1, 4, 4, torch.device("cpu"))
    cache_before, state_before = paged.cache.clone(), paged.state.clone()
    x, pos, cs = torch.randn(4, HIDDEN).bfloat16(), torch.arange(4), dsv4attn.rope_cos_sin(64)
    meta = paged.metadata([0] * 4, [0])
    with pytest.raises(dsv4attn.Error, match="state_cache"):
        comp(x, pos, cs, paged.state[..., :-1], paged.cache, meta, 4, 4)
    with pytest.raises(dsv4attn.Error, match="k_cache"):
        comp(x, pos, cs, paged.state, paged.cache[:, :100], meta, 4, 4)
    with pytest.raises(dsv4attn.Error, match="token_to_req"):
        comp(x, pos, cs, paged.state, paged.cache, paged.metadata([0, 0, 1, 0], [0]), 4, 4)
    with pytest.raises(dsv4attn.Error, match="hidden_states"):
        comp(None, pos, cs, paged.state, paged.cache, meta, 4, 4)
    with pytest.raises(dsv4attn.Error, match="metadata"):
        comp(x, pos, cs, paged.state, paged.cache, {"token_to_req": meta.token_to_req}, 4, 4)
    with pytest.raises(dsv4attn.Error, match="compress_ratio"):
        vllm_ops.DeepseekCompressor(8, HIDDEN)
    assert torch.equal(paged.cache, cache_before) and torch.equal(paged.state, state_before)


def test_metadata_from_query_start_loc(device):
    """vLLM's query_start_loc / seq_lens (a batch slice starting at token 5) give each token's
    request and each request's consumed positions."""
    qsl = torch.tensor([5, 8, 8, 12], dtype=I32, device=device)
    seq_lens = torch.tensor([10, 4, 4], dtype=I32, device=device)
    table = torch.zeros(3, 1, dtype=I32, device=device)
    meta = vllm_ops.CompressorMetadata.from_query_start_loc(qsl, seq_lens, table, table, 8)
    assert meta.token_to_req.dtype == I32 and meta.token_to_req.device == device
    assert meta.token_to_req.tolist() == [0, 0, 0, 2, 2, 2, 2, -1]  # token 7 lies beyond
    assert meta.context_lens.tolist() == [7, 4, 0]


def test_compressor_ops_bad_config():
    """The torch ops name a bad config field before touching any tensor."""
    t = torch.zeros(1)
    with pytest.raises(dsv4attn.Error, match="target"):
        torch.ops.dsv4.compressor_project(512, 4, 64, 1e-6, "keys", t, t, t, t, t, t, t)
    with pytest.raises(dsv4attn.Error, match="head_dim"):
        torch.ops.dsv4.compressor_project(256, 4, 64, 1e-6, "kv_cache", t, t, t, t, t, t, t)
    with pytest.raises(dsv4attn.Error, match="ratio"):
        torch.ops.dsv4.compressor_project(512, 5, 64, 1e-6, "kv_cache", t, t, t, t, t, t, t)


def random_indexer(n_heads, topk):
    ix = vllm_ops.Indexer(HIDDEN, Q_LORA, n_heads, topk)
    with torch.no_grad():
        ix.wq_b.weight.copy_(torch.randn(n_heads * 128, Q_LORA) / math.sqrt(Q_LORA))
        ix.weights_proj.weight.copy_(torch.randn(n_heads, HIDDEN))
    comp = random_compressor(4, "indexer_keys")
    ix.compressor.load_state_dict(comp.state_dict())
    return ix


def test_indexer(device):
    """One prefill step of two requests (43 and 30 tokens): keys written by the indexer's
    compressor, then each token's top-4 of its visible entries against the float64 scores of
    its exact (unquantized) query over the cached keys."""
    n_heads, topk, B = 4, 4, 8
    ref_ix = random_indexer(n_heads, topk)
    ix = copy.deepcopy(ref_ix).to(device)
    cos_sin = dsv4attn.rope_cos_sin(512)
    paged = PagedState(ix.compressor, 2, 16, B, device)
    lens = [43, 30]
    t2r = [0] * lens[0] + [1] * lens[1]
    pos = list(range(lens[0])) + list(range(lens[1]))
    T = len(pos)
    x = torch.randn(T, HIDDEN).bfloat16()
    qr = torch.randn(T, Q_LORA).bfloat16()
    buf = poisoned((T + 3, topk), I32, device)
    counts = poisoned((T,), I32, device)
    ix(x.to(device), qr.to(device), torch.tensor(pos, device=device), cos_sin.to(device),
       paged.state, paged.cache, paged.metadata(t2r, [0, 0]), paged.state_block_size, B,
       buf, counts)
    buf, counts, cache = buf.cpu(), counts.cpu(), paged.cache.cpu()
    assert (buf[T:] == 0x7F).all(), "rows beyond T untouched"
    Hm = ref.hadamard(128)
    q = (qr.to(F64) @ ref_ix.wq_b.weight.to(F64).T).view(T, n_heads, 128)
    w = x.to(F64) @ ref_ix.weights_proj.weight.to(F64).T / math.sqrt(128 * n_heads)
    for t in range(T):
        r, p = t2r[t], pos[t]
        visible = (p + 1) // 4
        n = min(topk, visible)
        got = buf[t].tolist()
        assert int(counts[t]) == n and got[n:] == [-1] * (topk - n), t
        if n == 0:
            continue
        keys = []
        for j in range(visible):
            blk, off = divmod(paged.slot(r, j), B)
            codes = cache[blk, off * 128:(off + 1) * 128].view(torch.float8_e4m3fn).to(F64)
            scale = cache[blk, B * 128 + off * 4:B * 128 + off * 4 + 4].view(torch.float32)
            keys.append(codes * float(scale))
        k = torch.stack(keys)
        qh = ref.rope(q[t][None], torch.tensor([p]))[0] @ Hm.T
        scores = (w[t][:, None] * torch.relu(qh @ k.T)).sum(0)
        kth = scores.sort(descending=True).values[n - 1]
        spread = float(scores.max() - scores.min()) + 1e-30
        assert len(set(got[:n])) == n and all(0 <= j < visible for j in got[:n]), t
        assert all(float(scores[j]) >= float(kth) - 0.05 * spread for j in got[:n]), t


def test_indexer_bad_input():
    ix = random_indexer(4, 4)
    paged = PagedState(ix.compressor, 1, 8, 8, torch.device("cpu"))
    cache_before, state_before = paged.cache.clone(), paged.state.clone()
    x, qr = torch.randn(4, HIDDEN).bfloat16(), torch.randn(4, Q_LORA).bfloat16()
    pos, cs, meta = torch.arange(4), dsv4attn.rope_cos_sin(64), paged.metadata([0] * 4, [0])
    buf = torch.zeros(4, 4, dtype=I32)
    with pytest.raises(dsv4attn.Error, match="topk_indices_buffer"):
        ix(x, qr, pos, cs, paged.state, paged.cache, meta, 8, 8, buf[:, :3])
    with pytest.raises(dsv4attn.Error, match="qr"):
        ix(x, qr[:, :64], pos, cs, paged.state, paged.cache, meta, 8, 8, buf)
    with pytest.raises(dsv4attn.Error, match="qr.dtype"):
        ix(x, qr.float(), pos, cs, paged.state, paged.cache, meta, 8, 8, buf)
    with pytest.raises(dsv4attn.Error, match="topk_lens"):
        ix(x, qr, pos, cs, paged.state, paged.cache, meta, 8, 8, buf, torch.zeros(3, dtype=I32))
    assert torch.equal(paged.cache, cache_before) and torch.equal(paged.state, state_before)
    assert (buf == 0).all()


def test_indexer_topk_and_prefix_ops(device):
    """torch.ops.dsv4.indexer_topk and compressed_prefix_indices against their formulas."""
    T, N, K = 6, 30, 5
    scores = torch.randn(T, N)
    pos = torch.tensor([0, 3, 10, 50, 77, 119])  # visible: up to N = 30
    idx, lens = poisoned((T, K), I32, device), poisoned((T,), I32, device)
    torch.ops.dsv4.indexer_topk(scores.to(device), pos.to(device), 4, idx, lens)
    for t in range(T):
        vis = min((int(pos[t]) + 1) // 4, N)
        order = sorted(range(vis), key=lambda j: (-float(scores[t, j]), j))[:K]
        assert idx[t].cpu().tolist() == order + [-1] * (K - len(order))
        assert int(lens[t]) == len(order)
    pos = torch.tensor([0, 126, 127, 300, 511])
    idx, lens = poisoned((5, 4), I32, device), poisoned((5,), I32, device)
    torch.ops.dsv4.compressed_prefix_indices(pos.to(device), 128, idx, lens)
    counts = [0, 0, 1, 2, 4]
    assert lens.cpu().tolist() == counts
    assert idx.cpu().tolist() == [list(range(n)) + [-1] * (4 - n) for n in counts]


def test_indexer_topk_unsorted(device):
    """sorted=False: the entries sorted=True selects (ties: lowest entries; NaN below -inf), in
    ascending entry order. Reference: entry j is taken iff fewer than min(K, visible) entries rank
    ahead of it; the rows have ties, NaN, -inf, ±0, K < visible, K == visible and K > visible."""
    T, N, K = 8, 24, 6
    nan, inf = float("nan"), float("inf")
    scores = torch.randint(-2, 3, (T, N)).float() * 0.5  # few levels: many ties
    scores[1, 3] = scores[1, 9] = scores[4, 0] = nan
    scores[2, 5] = scores[4, 7] = -inf
    scores[3, 1], scores[3, 2] = -0.0, 0.0  # equal keys
    scores[6] = nan  # all NaN
    pos = torch.tensor([0, 95, 50, 23, 27, 19, 95, 60])  # visible 0, 24, 12, 6, 7, 5, 24, 15

    def rank_key(t, j):  # ascending = descending score, NaN after every number, then entry
        v = float(scores[t, j])
        return ((1, 0.0) if math.isnan(v) else (0, -v)), j

    for is_sorted in (True, False):
        idx, lens = poisoned((T, K), I32, device), poisoned((T,), I32, device)
        torch.ops.dsv4.indexer_topk(scores.to(device), pos.to(device), 4, idx, lens,
                                    sorted=is_sorted)
        for t in range(T):
            vis = min((int(pos[t]) + 1) // 4, N)
            count = min(K, vis)
            chosen = [j for j in range(vis)  # ascending entries
                      if sum(rank_key(t, i) < rank_key(t, j) for i in range(vis)) < count]
            if is_sorted:
                chosen.sort(key=lambda j: rank_key(t, j))
            assert idx[t].cpu().tolist() == chosen + [-1] * (K - count), (t, is_sorted)
            assert int(lens[t]) == count


def test_new_ops_fake_kernels():
    """torch.library.opcheck: schema and fake tensor of the compressor and indexer ops."""
    utils = ("test_schema", "test_faketensor")
    torch.library.opcheck(torch.ops.dsv4.compressed_prefix_indices.default,
                          (torch.arange(4), 4, torch.empty(4, 2, dtype=I32),
                           torch.empty(4, dtype=I32)), test_utils=utils)
    for is_sorted in (True, False):
        torch.library.opcheck(torch.ops.dsv4.indexer_topk.default,
                              (torch.randn(3, 8), torch.tensor([3, 20, 31]), 4,
                               torch.empty(3, 2, dtype=I32), None, is_sorted), test_utils=utils)
    x = torch.randn(3, HIDDEN)
    torch.library.opcheck(torch.ops.dsv4.compressor_project.default,
                          (512, 4, 64, 1e-6, "kv_cache", x, torch.randn(1024, HIDDEN),
                           torch.randn(1024, HIDDEN), torch.randn(4, 1024), torch.arange(3),
                           torch.empty(3, 1024), torch.empty(3, 1024)), test_utils=utils)


@requires_cuda
def test_modules_cuda_no_host_sync():
    """A compressor step and an indexer step on CUDA tensors synchronize nothing."""
    dev = torch.device("cuda")
    ix = random_indexer(4, 4).to(dev)
    comp = random_compressor(4, "kv_cache").to(dev)
    cos_sin = dsv4attn.rope_cos_sin(512).to(dev)
    p_ix = PagedState(ix.compressor, 1, 16, 8, dev)
    p_c = PagedState(comp, 1, 16, 4, dev)
    T = 20
    x = torch.randn(T, HIDDEN, device=dev).bfloat16()
    qr = torch.randn(T, Q_LORA, device=dev).bfloat16()
    pos = torch.arange(T, device=dev)
    buf = torch.empty(T, 4, dtype=I32, device=dev)
    meta_ix, meta_c = p_ix.metadata([0] * T, [0]), p_c.metadata([0] * T, [0])
    torch.cuda.synchronize()
    torch.cuda.set_sync_debug_mode("error")
    try:
        comp(x, pos, cos_sin, p_c.state, p_c.cache, meta_c, p_c.state_block_size, 4)
        ix(x, qr, pos, cos_sin, p_ix.state, p_ix.cache, meta_ix, p_ix.state_block_size, 8, buf)
    finally:
        torch.cuda.set_sync_debug_mode("default")
    torch.cuda.synchronize()
    assert ((buf >= -1) & (buf < 5)).all()


def test_new_ops_bad_input():
    """The torch ops name the bad argument and write nothing (outputs poisoned beforehand)."""
    from dsv4attn import ops
    cpu = torch.device("cpu")
    T, HI, B = 3, 4, 16
    q8 = torch.zeros(T, HI, 128, dtype=torch.float8_e4m3fn)
    qs, w, pos = torch.ones(T, HI), torch.ones(T, HI), torch.tensor([3, 7, 11])
    t2r, table = torch.zeros(T, dtype=I32), torch.zeros(1, 1, dtype=I32)
    scores = poisoned((T, 16), torch.float32, cpu)
    with pytest.raises(dsv4attn.Error, match="indexer_scores: keys"):
        ops.indexer_scores(q8, qs, w, pos, t2r, torch.zeros(1, B * 132 - 4, dtype=torch.uint8),
                           B, table, 4, scores)
    assert scores.isnan().all()
    idx, lens = poisoned((T, 4), I32, cpu), poisoned((T,), I32, cpu)
    with pytest.raises(dsv4attn.Error, match="compressed_prefix_indices: ratio"):
        ops.compressed_prefix_indices(pos, 0, idx, lens)
    with pytest.raises(dsv4attn.Error, match="indexer_topk: positions: expected a tensor"):
        ops.indexer_topk(scores, None, 4, idx, lens)
    assert (idx == 0x7F).all() and (lens == 0x7F).all()
    q_scale, weights = poisoned((T, HI), torch.float32, cpu), poisoned((T, HI), torch.float32, cpu)
    with pytest.raises(dsv4attn.Error, match="indexer_query: q_fp8: expected a tensor, got None"):
        ops.indexer_query(torch.zeros(T, Q_LORA), torch.zeros(HI * 128, Q_LORA), None,
                          torch.zeros(T, HIDDEN), torch.zeros(HI, HIDDEN), pos,
                          dsv4attn.rope_cos_sin(16), None, q_scale, weights, None, None)
    assert q_scale.isnan().all() and weights.isnan().all()
    comp = random_compressor(4, "kv_cache")
    paged = PagedState(comp, 1, 4, 4, cpu)
    cache_before = paged.cache.clone()
    rows = torch.zeros(T, 1024)
    with pytest.raises(dsv4attn.Error, match="compressor_update_and_emit: out_block_size"):
        ops.compressor_update_and_emit(
            512, 4, 64, 1e-6, "kv_cache", rows, rows, pos, t2r, torch.zeros(1, dtype=I32),
            torch.ones(512), dsv4attn.rope_cos_sin(16), paged.state.view(-1, 2048),
            paged.state_table, 4, paged.cache, paged.table, 2**40, "model1_fp8", 1.0, None)
    assert torch.equal(paged.cache, cache_before)


@requires_cuda
def test_indexer_cuda_graph_replay():
    """An Indexer step (its compressor, queries, scores, top-k) captured in a CUDA graph and
    replayed from the same cache contents gives the eager step's indices and cache bytes."""
    dev = torch.device("cuda")
    ix = random_indexer(4, 4).to(dev)
    paged = PagedState(ix.compressor, 1, 16, 8, dev)
    state0, cache0 = paged.state.clone(), paged.cache.clone()
    T = 20
    x = torch.randn(T, HIDDEN, device=dev).bfloat16()
    qr = torch.randn(T, Q_LORA, device=dev).bfloat16()
    pos, cos_sin = torch.arange(T, device=dev), dsv4attn.rope_cos_sin(512).to(dev)
    meta = paged.metadata([0] * T, [0])
    buf = torch.full((T, 4), 7, dtype=I32, device=dev)

    def step():
        ix(x, qr, pos, cos_sin, paged.state, paged.cache, meta, paged.state_block_size, 8, buf)

    step()
    torch.cuda.synchronize()
    want_buf, want_cache = buf.clone(), paged.cache.clone()
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):  # warm-up off the capture stream, as torch advises
        step()
    torch.cuda.current_stream().wait_stream(side)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        step()
    paged.state.copy_(state0)
    paged.cache.copy_(cache0)
    buf.fill_(7)
    graph.replay()
    torch.cuda.synchronize()
    assert torch.equal(buf, want_buf) and torch.equal(paged.cache, want_cache)


def test_modules_load_checkpoint_tensors():
    """The modules' state dicts are the checkpoint's compressor / indexer tensors, by name."""
    cfg = dsv4attn.ModelConfig.builtin("tiny")
    layer = [cfg.layer_kind(i) for i in range(cfg.n_layers)].index("C4A")
    tensors = dsv4attn.AttentionWeights.random(cfg, layer, fp8=False).tensors(cfg)

    def under(prefix):
        return {name.split(prefix, 1)[1]: t for name, t in tensors.items()
                if prefix in name and not (prefix == "compressor." and "indexer." in name)}

    comp = vllm_ops.DeepseekCompressor(4, cfg.dim, cfg.head_dim, cfg.rope_head_dim, cfg.norm_eps)
    comp.load_state_dict(under("compressor."), strict=True)
    ix = vllm_ops.Indexer(cfg.dim, cfg.q_lora_rank, cfg.index_n_heads, cfg.index_topk,
                          cfg.index_head_dim, cfg.rope_head_dim, cfg.norm_eps)
    ix.load_state_dict(under("indexer."), strict=True)
    assert torch.equal(ix.wq_b.weight, under("indexer.")["wq_b.weight"].to(ix.wq_b.weight.dtype))

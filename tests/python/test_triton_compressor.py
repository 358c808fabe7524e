"""The compressor (include/dsv4/compressor.h) and the indexer (indexer.h) on the Triton backend,
against float64 formulas of docs/spec.md §4–§5 written here, on fresh random data.

Tolerances. Pooled entries (softmax over <= 128 rows per dim, RMSNorm, RoPE) are fp32 sums and
exps: within 2e-5 of the entry's largest value (fp32 rounding of <= 128-term sums and the
library exp is ~1e-6 relative; a wrong row or window moves an entry by O(1)). What the caches
then hold is checked EXACTLY against the float64 quantization of the entries the kernel
reports (FP8 blocks with UE8M0 scales, bf16 rope dims, indexer keys with one scale), since the
encoders are integer code. Indexer queries come from fp32 GEMMs: a value may cross an FP8
rounding boundary, so codes are compared within one FP8 step on at most 2% of the elements.
Scores sum exact fp8 products in fp32 (bound: 2^-20 of the sum of magnitudes); top-k is exact.
"""
import math

import pytest
import torch

import dsv4attn
import reference as ref
from triton_support import DEVICE, F64, gpu_or, op, poisoned, to_dev

I32 = torch.int32
CFG = dsv4attn.ModelConfig.builtin("tiny")


def rope_table(n=4096):
    r = CFG.rope_for_layer(1)
    return dsv4attn.rope_cos_sin(n, 64, r["theta"], r["yarn"], r["factor"],
                                 r["original_seq_len"], r["beta_fast"], r["beta_slow"])


def rope64(x, cs_row):
    """GPT-J rotation of the last 64 dims of x [D] by one table row, float64."""
    x = x.clone()
    c, s = cs_row[:32].to(F64), cs_row[32:].to(F64)
    e, o = x[-64::2].clone(), x[-63::2].clone()
    x[-64::2], x[-63::2] = e * c - o * s, e * s + o * c
    return x


def hadamard(n):
    i = torch.arange(n)
    bits = (i[:, None] & i[None, :])
    sign = torch.zeros_like(bits)
    for b in range(int(math.log2(n))):
        sign += (bits >> b) & 1
    return torch.where(sign % 2 == 0, 1.0, -1.0).to(F64) / math.sqrt(n)


class Ring:
    """A request ring in a paged state cache: K rows, blocks of `ratio` rows."""

    def __init__(self, ccfg, requests):
        self.K, self.bs = ccfg.ring_rows, ccfg.ratio
        blocks = -(-self.K // self.bs)
        perm = torch.randperm(requests * blocks + 2)
        self.table = perm[:requests * blocks].view(requests, blocks).to(I32)
        self.rows = to_dev(torch.randn(perm.numel() * self.bs, ccfg.state_width))  # stale data

    def slot(self, req, pos):
        r = pos % self.K
        return int(self.table[req, r // self.bs]) * self.bs + r % self.bs


def pooled_entry(ccfg, kv_hist, s_hist, j):
    """Entry j of one request (docs/spec.md §4) from its full fp32 row history, float64."""
    D, r = ccfg.head_dim, ccfg.ratio
    kvs, ss = [], []
    if ccfg.coff == 2:
        for p in range(j * r - r, j * r):
            if p >= 0:
                kvs.append(kv_hist[p, :D])
                ss.append(s_hist[p, :D])
        cur = slice(D, 2 * D)
    else:
        cur = slice(0, D)
    for p in range(j * r, j * r + r):
        kvs.append(kv_hist[p, cur])
        ss.append(s_hist[p, cur])
    kv, s = torch.stack(kvs).to(F64), torch.stack(ss).to(F64)
    return (torch.softmax(s, 0) * kv).sum(0)


@pytest.mark.parametrize("ratio,target,layout", [
    (4, "kv_cache", "model1_fp8"), (4, "kv_cache", "bf16"), (4, "indexer_keys", None),
    (128, "kv_cache", "model1_fp8")])
def test_compressor_update_and_emit(ratio, target, layout):
    """Two calls over two requests (chunks that split windows, so the second call pools rows
    from the ring), against the float64 pooling of every emitted entry; the cache bytes against
    the float64 quantization of the reported entries; the ring rows after each call."""
    from dsv4attn.triton.compressor import CompressorConfig
    ccfg = CompressorConfig.indexer(CFG) if target == "indexer_keys" else \
        CompressorConfig.attention(CFG, ratio)
    D, width = ccfg.head_dim, ccfg.proj_width
    if ratio == 4:
        calls = [[(0, 0, 6), (1, 0, 3)], [(1, 3, 7), (0, 6, 8)]]   # (req, context, tokens)
    else:
        calls = [[(0, 0, 100)], [(0, 100, 31)]]
    R, B = 2, 8 if target == "indexer_keys" else 4
    cs = rope_table()
    weight = (1 + 0.1 * torch.randn(D)).bfloat16()
    ring = Ring(ccfg, R)
    n_entries = 40 // ratio + 2
    out_blocks = torch.randperm(R * (-(-n_entries // B)) + 1)[:R * (-(-n_entries // B))]
    out_table = out_blocks.view(R, -1).to(I32)
    nb = out_blocks.numel() + 1
    if target == "indexer_keys":
        cache = to_dev(torch.zeros(nb, B * 132, dtype=torch.uint8))
    else:
        nbytes = dsv4attn._runtime.kv_geometry(layout, B)["block_bytes"]
        cache = to_dev(torch.zeros(nb, nbytes, dtype=torch.uint8))
    hist = {q: (torch.zeros(200, width), torch.zeros(200, width)) for q in range(R)}
    H = hadamard(D)
    for call in calls:
        pos, t2r, ctx = [], [], [0] * R
        for q, c, n in call:
            pos += range(c, c + n)
            t2r += [q] * n
            ctx[q] = c
        T = len(pos)
        kv_rows, s_rows = torch.randn(T, width), torch.randn(T, width) * 2
        for t, (q, p) in enumerate(zip(t2r, pos)):
            hist[q][0][p], hist[q][1][p] = kv_rows[t], s_rows[t]
        entries = poisoned((T, D), torch.float32)
        op("compressor_update_and_emit")(
            ccfg, *to_dev(kv_rows, s_rows, torch.tensor(pos), torch.tensor(t2r, dtype=I32),
                          torch.tensor(ctx), weight, cs),
            ring.rows, to_dev(ring.table), ring.bs, cache, to_dev(out_table), B,
            layout or "model1_fp8", 1.0, entries)
        entries = entries.cpu()
        for t, (q, p) in enumerate(zip(t2r, pos)):
            if (p + 1) % ratio:
                assert entries[t].isnan().all()  # rows of tokens that emit nothing untouched
                continue
            j = (p + 1) // ratio - 1
            e = pooled_entry(ccfg, *hist[q], j)
            e = e * torch.rsqrt(e.pow(2).mean() + ccfg.eps) * weight.to(F64)
            e = rope64(e, cs[j * ratio])
            if target == "indexer_keys":
                e = H @ e
            got = entries[t].to(F64)
            assert (got - e).abs().max() <= 2e-5 * e.abs().max(), (q, j)
            # The cache holds exactly the quantization of the reported entry.
            slot = int(out_table[q, j // B]) * B + j % B
            blk, off = divmod(slot, B)
            if target == "indexer_keys":
                data = cache[blk].cpu()
                codes = data[off * 128:(off + 1) * 128].view(torch.float8_e4m3fn).to(F64)
                scale = data[B * 128 + off * 4:B * 128 + off * 4 + 4].view(torch.float32)
                want, want_scale = ref.quantize_blocks(got[None], 128)
                assert float(scale) == float(want_scale)
                assert torch.equal(codes * float(scale), want[0])
            else:
                row = torch.empty(1, 512)
                torch.ops.dsv4.kv_dequantize(cache.cpu(), layout, B, 1.0, torch.tensor([slot]),
                                             row)
                nope, _ = ref.quantize_blocks(got[None, :448], 64)
                assert torch.equal(row[0, :448].to(F64), nope[0])
                assert torch.equal(row[0, 448:], got[448:].float().bfloat16().float())
        # The ring holds the last K rows of every request in the call.
        rows = ring.rows.cpu()
        for q, c, n in call:
            for p in range(max(0, c + n - ring.K), c + n):
                assert torch.equal(rows[ring.slot(q, p), :width], hist[q][0][p])
                assert torch.equal(rows[ring.slot(q, p), width:], hist[q][1][p])


def test_compressor_project():
    """fp32 products of the given operands (bf16 on a GPU), 2^-20 of the row's magnitude; the
    score rows carry ape[p mod r]; a negative position gives a NaN score row (CUDA)."""
    from dsv4attn.triton.compressor import CompressorConfig
    ccfg = CompressorConfig.attention(CFG, 4)
    T, dim, width = gpu_or(5, 64), CFG.dim, ccfg.proj_width
    x = torch.randn(T, dim).bfloat16()
    wkv, wg = torch.randn(width, dim).bfloat16(), torch.randn(width, dim).bfloat16()
    ape = torch.randn(4, width)
    pos = torch.randint(0, 100, (T,))
    pos[-1] = -1
    kv, s = poisoned((T, width), torch.float32), poisoned((T, width), torch.float32)
    op("compressor_project")(ccfg, *to_dev(x, wkv, wg, ape, pos), kv, s)
    mag = x.to(F64).abs() @ wkv.to(F64).abs().T
    want = x.to(F64) @ wkv.to(F64).T
    assert ((kv.cpu().to(F64) - want).abs() <= 2.0 ** -20 * mag).all()
    want_s = x.to(F64) @ wg.to(F64).T + ape.to(F64)[pos.clamp_min(0) % 4]
    mag_s = x.to(F64).abs() @ wg.to(F64).abs().T + ape.to(F64).abs()[pos.clamp_min(0) % 4]
    err = (s.cpu().to(F64) - want_s).abs()
    assert (err[:-1] <= 2.0 ** -20 * mag_s[:-1]).all() and s[-1].isnan().all()


def test_compressor_skips_unmapped_output():
    """CUDA semantics: an entry whose output block is unmapped is not emitted (the cache and
    the entries row stay untouched); the ring is still saved."""
    from dsv4attn.triton.compressor import CompressorConfig
    ccfg = CompressorConfig.attention(CFG, 4)
    ring = Ring(ccfg, 1)
    cache = to_dev(torch.zeros(2, dsv4attn._runtime.kv_geometry("model1_fp8", 4)["block_bytes"],
                               dtype=torch.uint8))
    entries = poisoned((4, 512), torch.float32)
    rows = torch.randn(4, ccfg.proj_width)
    op("compressor_update_and_emit")(
        ccfg, *to_dev(rows, rows, torch.arange(4), torch.zeros(4, dtype=I32),
                      torch.zeros(1, dtype=I32), torch.ones(512), rope_table(64)),
        ring.rows, to_dev(ring.table), ring.bs, cache, to_dev(torch.full((1, 1), -1, dtype=I32)),
        4, "model1_fp8", 1.0, entries)
    assert (cache == 0).all() and entries.isnan().all()
    assert torch.equal(ring.rows.cpu()[ring.slot(0, 3), :ccfg.proj_width], rows[3])


# ---------------------------------------------------------------- indexer
def fp8_step(v):
    """The spacing of e4m3 values around v, after its block scale (float64)."""
    return torch.exp2(torch.floor(torch.log2(v.abs().clamp_min(2.0 ** -9))) - 3)


def test_indexer_query():
    T, HI, q_lora = gpu_or(4, 32), gpu_or(4, 64), gpu_or(128, 1024)
    qr = torch.randn(T, q_lora).bfloat16()
    wq = (torch.randn(HI * 128, q_lora) / math.sqrt(q_lora)).bfloat16()
    x = torch.randn(T, CFG.dim).bfloat16()
    wp = torch.randn(HI, CFG.dim).bfloat16()
    pos = torch.randint(0, 4000, (T,))
    cs = rope_table()
    q8 = poisoned((T, HI, 128), torch.uint8).view(torch.float8_e4m3fn)
    qs, w = poisoned((T, HI), torch.float32), poisoned((T, HI), torch.float32)
    op("indexer_query")(*to_dev(qr, wq), None, *to_dev(x, wp, pos, cs), q8, qs, w)
    q = (qr.to(F64) @ wq.to(F64).T).view(T, HI, 128)
    Hm = hadamard(128)
    want = torch.stack([torch.stack([Hm @ rope64(q[t, h], cs[pos[t]]) for h in range(HI)])
                        for t in range(T)])
    deq_want, scale_want = ref.quantize_blocks(want, 128)
    got = q8.cpu().to(F64) * qs.cpu().to(F64)[..., None]
    off = (got - deq_want).abs()
    assert (off <= fp8_step(deq_want) * 1.01 + 1e-30).all()
    assert (off > 0).to(F64).mean() <= 0.02
    assert (qs.cpu().to(F64) == scale_want[..., 0]).to(F64).mean() >= 0.98
    want_w = x.to(F64) @ wp.to(F64).T / math.sqrt(128 * HI)
    assert ((w.cpu().to(F64) - want_w).abs() <= 1e-5 * want_w.abs().max()).all()


def key_cache(n_blocks, B, n_used):
    data = torch.zeros(n_blocks, B * 132, dtype=torch.uint8)
    codes = torch.randint(0, 256, (n_blocks, B * 128), dtype=torch.uint8)
    codes[(codes & 0x7F) == 0x7F] = 0  # no NaN codes
    data[:, :B * 128] = codes
    scales = torch.exp2(torch.randint(-6, 2, (n_blocks, B)).float())
    data[:, B * 128:] = scales.view(torch.uint8).view(n_blocks, B * 4)
    return data


def test_indexer_scores():
    T, HI, B, ratio = gpu_or(4, 32), gpu_or(4, 64), 16, 4
    N = gpu_or(40, 700)
    q8 = torch.randint(0, 256, (T, HI, 128), dtype=torch.uint8)
    q8[(q8 & 0x7F) == 0x7F] = 0
    qs = torch.exp2(torch.randint(-4, 4, (T, HI)).float())
    w = torch.randn(T, HI)
    blocks = -(-N // B)
    pool = max(60, 3 * blocks)   # enough key blocks for three requests' tables at any N
    keys = key_cache(pool, B, 0)
    table = torch.randperm(pool)[:3 * blocks].view(3, blocks).to(I32)
    t2r = torch.randint(0, 2, (T,), dtype=I32)
    t2r[2] = 2                    # request 2: token 2 alone
    pos = torch.randint(0, N * ratio, (T,))
    pos[0] = N * ratio - 1        # sees every column
    pos[1] = 2                    # sees none
    table[2, 0] = -1              # token 2: its first visible block unmapped -> NaN
    pos[2] = max(int(pos[2]), 40)
    scores = poisoned((T, N), torch.float32)
    op("indexer_scores")(to_dev(q8.view(torch.float8_e4m3fn)), *to_dev(qs, w, pos, t2r, keys),
                         B, to_dev(table), ratio, scores)
    scores = scores.cpu().to(F64)
    qf = q8.view(torch.float8_e4m3fn).to(F64)
    for t in range(T):
        vis = min((int(pos[t]) + 1) // ratio, N)
        assert (scores[t, vis:] == -math.inf).all()
        j = torch.arange(vis)
        blk = table[int(t2r[t]), j // B].long()
        if t == 2:
            assert scores[t, :B].isnan().all()
            continue
        off = j % B
        kc = keys[blk][torch.arange(vis)[:, None], (off * 128)[:, None] + torch.arange(128)]
        kf = kc.view(torch.float8_e4m3fn).to(F64)
        ks = keys[blk][torch.arange(vis)[:, None], (B * 128 + off * 4)[:, None] +
                       torch.arange(4)].view(torch.float32).to(F64)[:, 0]
        dots = qf[t] @ kf.T                                    # [HI, vis]
        terms = w[t].to(F64)[:, None] * torch.relu(dots * qs[t].to(F64)[:, None] * ks)
        mag = (w[t].to(F64).abs()[:, None] * (qf[t].abs() @ kf.abs().T) *
               qs[t].to(F64)[:, None] * ks).sum(0)
        assert ((scores[t, :vis] - terms.sum(0)).abs() <= 2.0 ** -20 * mag + 1e-30).all()


def test_indexer_topk_order():
    """Descending score, ties to the lowest index, -0 == +0, NaN after -inf; K > visible and
    N < K pad with -1."""
    T, N, K = 5, gpu_or(37, 3000), gpu_or(16, 512)
    scores = torch.randn(T, N).round(decimals=1)  # many exact ties
    scores[0, :6] = torch.tensor([float("nan"), -math.inf, 0.0, -0.0, 5.0, 5.0])
    pos = torch.tensor([4 * N - 1, 4 * N + 50, 9, 2, 4 * 5 - 1])
    for n_idx in (K, N + 3):
        idx, lens = poisoned((T, n_idx), I32), poisoned((T,), I32)
        op("indexer_topk")(*to_dev(scores, pos), 4, idx, lens)

        def key(v):
            if math.isnan(v):
                return (2, 0.0)
            return (1, 0.0) if v == -math.inf else (0, -v)
        for t in range(T):
            vis = min((int(pos[t]) + 1) // 4, N)
            order = sorted(range(vis), key=lambda j: (key(float(scores[t, j])), j))[:n_idx]
            want = order + [-1] * (n_idx - len(order))
            assert idx[t].cpu().tolist() == want and int(lens[t]) == len(order)


def test_compressed_prefix_indices():
    pos = torch.tensor([0, 126, 127, 300, 1000, -1])
    idx, lens = poisoned((6, 4), I32), poisoned((6,), I32)
    op("compressed_prefix_indices")(to_dev(pos), 128, idx, lens)
    counts = [0, 0, 1, 2, 4, 0]  # (p + 1) div 128, clamped to K = 4 (as on CUDA)
    assert lens.cpu().tolist() == counts
    for t, n in enumerate(counts):
        assert idx[t].cpu().tolist() == list(range(n)) + [-1] * (4 - n)

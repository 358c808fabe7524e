"""dsv4attn.Attention(caller_caches=True): the engine's caches (padded pages, scrambled blocks,
poisoned storage) and vLLM's metadata give the same outputs, bit for bit, as the layer's own
caches over the same steps; bad metadata is refused by name and writes nothing."""
import random

import pytest
import torch

import dsv4attn
from dsv4attn import _C

CFG = _C.ModelConfig.builtin("tiny")
SWA_BLOCK = 64
PAD = 64  # bytes added to every KV / key page


def geometry(kind):
    """{cache name: (block_size, block_bytes, ring)} of a layer of `kind` (the tiny config)."""
    kv = lambda b: _C.kv_geometry("model1_fp8", b)["block_bytes"]  # noqa: E731
    out = {"swa": (SWA_BLOCK, kv(SWA_BLOCK), False)}
    if kind == "SWA":
        return out
    ratio = 4 if kind == "C4A" else 128
    coff = 2 if ratio == 4 else 1
    out["compressed"] = (256 // ratio, kv(256 // ratio), False)
    out["compressor_state"] = (ratio, ratio * 2 * coff * CFG.head_dim * 4, True)
    if kind == "C4A":
        out["indexer_keys"] = (64, 64 * 132, False)
        out["indexer_state"] = (4, 4 * 2 * 2 * CFG.index_head_dim * 4, True)
    return out


class EngineCaches:
    """The engine's side: cache tensors and per-request block tables, blocks handed out in a
    scrambled order; KV / key pages padded, rings as fp32 [num_blocks, block_size, row]."""

    def __init__(self, kind, device, num_blocks=48):
        self.kind, self.geo = kind, geometry(kind)
        self.ratio = {"SWA": 0, "C4A": 4, "C128A": 128}[kind]
        rng = random.Random(7)
        self.tensors, self.free, self.tables = {}, {}, {}
        for name, (bs, bb, ring) in self.geo.items():
            if ring:
                t = torch.full((num_blocks, bs, bb // bs // 4), float("nan"), device=device)
            else:
                t = torch.full((num_blocks, bb + PAD), 0xFF, dtype=torch.uint8,
                               device=device)[:, :bb]
            self.tensors[name] = t
            self.free[name] = list(range(num_blocks))
            rng.shuffle(self.free[name])
            self.tables[name] = {}

    def entries(self, name, seq_len):
        bs = self.geo[name][0]
        n = {"swa": seq_len, "compressed": seq_len // max(self.ratio, 1),
             "indexer_keys": seq_len // max(self.ratio, 1),
             "compressor_state": (2 if self.ratio == 4 else 1) * self.ratio,
             "indexer_state": 8}[name]
        return -(-n // bs)

    def step(self, steps):
        """steps: [(req, context, num_new)] in kernel order → forward_step's metadata."""
        qsl, seq, pos, slots = [0], [], [], []
        for req, ctx, n in steps:
            qsl.append(qsl[-1] + n)
            seq.append(ctx + n)
            for name in self.geo:
                t = self.tables[name].setdefault(req, [])
                while len(t) < self.entries(name, ctx + n):
                    t.append(self.free[name].pop())
            for p in range(ctx, ctx + n):
                pos.append(p)
                slots.append(self.tables["swa"][req][p // SWA_BLOCK] * SWA_BLOCK + p % SWA_BLOCK)
        tables = {}
        for name in self.geo:
            width = max(len(self.tables[name][req]) for req, _, _ in steps) + 2
            rows = [self.tables[name][req] + [1 << 30] * (width - len(self.tables[name][req]))
                    for req, _, _ in steps]
            tables[name] = torch.tensor(rows, dtype=torch.int32)
        return dict(query_start_loc=torch.tensor(qsl, dtype=torch.int32),
                    seq_lens=torch.tensor(seq, dtype=torch.int32),
                    positions=torch.tensor(pos, dtype=torch.int64),
                    slot_mapping=torch.tensor(slots, dtype=torch.int64), block_tables=tables)


def hidden(steps, device):
    g = torch.Generator().manual_seed(sum(r * 1000 + c for r, c, _ in steps))
    T = sum(n for _, _, n in steps)
    return torch.randn((T, CFG.dim), generator=g).to(torch.bfloat16).float().to(device)


STEPS = [[(7, 0, 150), (9, 0, 40)], [(7, 150, 1), (9, 40, 87)],
         [(7, 151, 1), (9, 127, 1), (11, 0, 5)]] + \
        [[(7, 152 + i, 1), (9, 128 + i, 1), (11, 5 + i, 1)] for i in range(4)]


@pytest.mark.parametrize("layer,kind", [(0, "SWA"), (1, "C4A"), (2, "C128A")])
def test_caller_caches_match_own_caches(device, layer, kind):
    own = dsv4attn.Attention(CFG, layer, seed=3, device=device)
    mine = dsv4attn.Attention(CFG, layer, seed=3, device=device, caller_caches=True)
    engine = EngineCaches(kind, device)
    mine.bind_caches(**engine.tensors)
    for steps in STEPS:
        x = hidden(steps, device)
        batch = dsv4attn.BatchDescription([r for r, _, _ in steps], [c for _, c, _ in steps],
                                          [n for _, _, n in steps])
        want = own.forward(batch, x)
        got = mine.forward_step(x, **engine.step(steps))
        assert not torch.isnan(got).any()
        assert torch.equal(got, want)


def test_caller_caches_bad_input_changes_nothing():
    mine = dsv4attn.Attention(CFG, 1, seed=3, caller_caches=True)
    engine = EngineCaches("C4A", "cpu")
    steps = [(3, 0, 20)]
    x = hidden(steps, "cpu")
    with pytest.raises(dsv4attn.Error, match="bind_caches"):
        mine.forward_step(x, **engine.step(steps))
    with pytest.raises(dsv4attn.Error, match="caches.indexer_keys"):
        mine.bind_caches(**{**engine.tensors, "indexer_keys": None})
    mine.bind_caches(**engine.tensors)
    before = {k: v.clone() for k, v in engine.tensors.items()}
    meta = engine.step(steps)
    bad = dict(meta, slot_mapping=meta["slot_mapping"] + 1)
    with pytest.raises(dsv4attn.Error, match=r"step.slot_mapping\[0\]"):
        mine.forward_step(x, **bad)
    tables = dict(meta["block_tables"])
    tables["compressed"] = tables["compressed"].clone().fill_(48)
    with pytest.raises(dsv4attn.Error, match=r"step.compressed_block_table\[0\]\[0\]"):
        mine.forward_step(x, **dict(meta, block_tables=tables))
    for k, v in engine.tensors.items():
        assert torch.equal(v.view(torch.uint8), before[k].view(torch.uint8)), k
    with pytest.raises(dsv4attn.Error, match="caller-owned"):
        mine.forward(dsv4attn.BatchDescription([3], [0], [20]), x)
    assert not torch.isnan(mine.forward_step(x, **meta)).any()

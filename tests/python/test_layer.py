"""dsv4attn.Attention (SWA layers) against a float64 re-implementation of SPEC §2 over whole
request histories, across steps with chunked prefill and decodes; loading from a state dict and
from a checkpoint directory (config.json + safetensors written by the test).

Tolerance: |y - ref| <= 4e-2 · max|ref|. The layer rounds to bf16 at every stage boundary (qr, q,
kv, o, o after inverse RoPE, z, y: ~7 roundings of 2^-9 relative each) and quantizes kv[:448] to
FP8 from bf16 rather than float64 values (a one-step fp8 difference in a few keys); a wrong
window, position or head mapping changes y by O(max|ref|).
"""
import json
import math

import pytest
import torch

import dsv4attn
import reference as ref

CFG_JSON = {
    "dim": 256, "n_heads": 16, "head_dim": 512, "rope_head_dim": 64, "q_lora_rank": 128,
    "o_groups": 4, "o_lora_rank": 64, "window_size": 16, "compress_ratios": [0, 0],
    "norm_eps": 1e-6, "rope_theta": 10000.0, "index_n_heads": 4, "index_head_dim": 128,
    "index_topk": 16, "max_position_embeddings": 4096,
}


def random_weights(cfg):
    H, D, dim, ql = cfg.n_heads, cfg.head_dim, cfg.dim, cfg.q_lora_rank
    G, L = cfg.o_groups, cfg.o_lora_rank

    def lin(o, i):
        return (torch.randn(o, i) / math.sqrt(i)).to(torch.bfloat16)

    return {
        "wq_a.weight": lin(ql, dim), "q_norm.weight": (1 + 0.05 * torch.randn(ql)).bfloat16(),
        "wq_b.weight": lin(H * D, ql), "wkv.weight": lin(D, dim),
        "kv_norm.weight": (1 + 0.05 * torch.randn(D)).bfloat16(),
        "wo_a.weight": lin(G * L, H * D // G), "wo_b.weight": lin(dim, G * L),
        "attn_sink": torch.randn(H),
    }


def reference_layer(cfg, w, x_hist, pos_hist):
    """y for the last len(x_hist) tokens of one request, float64, SPEC §2 (SWA layer)."""
    d = {k: v.double() for k, v in w.items()}
    H, D, W, G = cfg.n_heads, cfg.head_dim, cfg.window_size, cfg.o_groups
    x = x_hist.double()
    qr = ref.rms_norm(x @ d["wq_a.weight"].T, d["q_norm.weight"])
    q = ref.rope(ref.rms_norm((qr @ d["wq_b.weight"].T).view(-1, H, D)), pos_hist)
    kv = ref.rope(ref.rms_norm(x @ d["wkv.weight"].T, d["kv_norm.weight"])[:, None], pos_hist)[:, 0]
    kv[:, :448], _ = ref.quantize_blocks(kv[:, :448], 64)
    T = x.shape[0]
    rows = torch.zeros(T, W, D, dtype=torch.float64)
    valid = torch.zeros(T, W, dtype=torch.bool)
    for t in range(T):
        lo = max(0, t - W + 1)
        rows[t, :t + 1 - lo] = kv[lo:t + 1]
        valid[t, :t + 1 - lo] = True
    o, _, _ = ref.sparse_attention(q, rows, valid, D ** -0.5, D, d["attn_sink"])
    o = ref.rope(o, pos_hist, inverse=True).reshape(T, G, -1)
    wo_a = d["wo_a.weight"].view(G, cfg.o_lora_rank, -1)
    z = torch.einsum("tgk,glk->tgl", o, wo_a).reshape(T, -1)
    return z @ d["wo_b.weight"].T


@pytest.fixture
def config(tmp_path):
    (tmp_path / "config.json").write_text(json.dumps(CFG_JSON))
    return dsv4attn.ModelConfig.from_json_file(str(tmp_path))


def run_steps(layer, cfg, steps, device):
    """steps: list of [(request_id, num_new_tokens)], decodes first. Returns max relative error."""
    cache = layer.new_cache(num_blocks=32, block_size=8)
    history = {}
    worst = 0.0
    for step in steps:
        reqs = [(rid, n, sum(h.shape[0] for h in history.get(rid, []))) for rid, n in step]
        batch = dsv4attn.BatchDescription.from_lengths(reqs, device=device)
        x = torch.randn(batch.query_start_loc[-1], cfg.dim).bfloat16()
        y = layer(x.to(device), batch, cache).cpu()
        for r, (rid, n, cached) in enumerate(reqs):
            rows = slice(batch.query_start_loc[r], batch.query_start_loc[r + 1])
            history.setdefault(rid, []).append(x[rows])
            xs = torch.cat(history[rid])
            want = reference_layer(cfg, layer_weights(layer), xs, torch.arange(xs.shape[0]))[-n:]
            got = y[rows].double()
            worst = max(worst, float((got - want).abs().max() / want.abs().max()))
    return worst


def layer_weights(layer):
    return {k: v.cpu() for k, v in layer.w.items()}


def test_swa_layer_matches_reference_over_steps(config, device):
    layer = dsv4attn.Attention(config, 0, random_weights(config), device=device)
    steps = [[(7, 21), (9, 5)],            # two prefills (21 > W: the window slides)
             [(7, 1), (9, 1), (11, 3)],    # decodes first, then a new prefill
             [(11, 1), (9, 1), (7, 4)]]    # decodes, then a chunked-prefill continuation
    assert run_steps(layer, config, steps, device) <= 4e-2


def test_from_state_dict_and_checkpoint(config, tmp_path):
    w = random_weights(config)
    state = {f"layers.1.attn.{k}": v for k, v in w.items()}
    state["layers.0.attn.wq_a.weight"] = torch.zeros(1)  # another layer's tensor: ignored
    a = dsv4attn.Attention.from_state_dict(config, 1, state)
    write_safetensors(tmp_path / "model.safetensors", state)
    b = dsv4attn.Attention.from_checkpoint(str(tmp_path), 1)
    for k in w:
        assert torch.equal(a.w[k], w[k]) and torch.equal(b.w[k], w[k])
    batch = dsv4attn.BatchDescription.from_lengths([(0, 3, 0)])
    x = torch.randn(3, config.dim).bfloat16()
    assert torch.equal(a(x, batch, a.new_cache(4)), b(x, batch, b.new_cache(4)))


def write_safetensors(path, tensors):
    names = {torch.bfloat16: "BF16", torch.float32: "F32"}
    header, blobs, offset = {}, [], 0
    for name, t in tensors.items():
        raw = t.contiguous().view(torch.uint8).reshape(-1).numpy().tobytes()
        header[name] = {"dtype": names[t.dtype], "shape": list(t.shape),
                        "data_offsets": [offset, offset + len(raw)]}
        blobs.append(raw)
        offset += len(raw)
    h = json.dumps(header).encode()
    h += b" " * ((8 - len(h) % 8) % 8)
    with open(path, "wb") as f:
        f.write(len(h).to_bytes(8, "little") + h + b"".join(blobs))


def test_layer_errors(config):
    w = random_weights(config)
    del w["wkv.weight"]
    with pytest.raises(dsv4attn.Error, match="wkv.weight"):
        dsv4attn.Attention(config, 0, w)
    tiny = dsv4attn.ModelConfig.builtin("tiny")
    with pytest.raises(dsv4attn.Error, match="C4A"):
        dsv4attn.Attention(tiny, 1, random_weights(tiny))
    layer = dsv4attn.Attention(config, 0, random_weights(config))
    batch = dsv4attn.BatchDescription.from_lengths([(0, 3, 0)])
    with pytest.raises(dsv4attn.Error, match="x.shape"):
        layer(torch.randn(4, config.dim).bfloat16(), batch, layer.new_cache(4))

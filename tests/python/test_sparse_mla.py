"""dsv4attn.SparseMlaAttention (the bound C++ DeepSeek-V3.2 sparse-MLA layer) on tiny-v3.2: against
the bound float64 reference, prefill vs chunked prefill vs decode, weights from a state dict in
both naming styles, the stack and the documented errors; on CUDA (skipped without a GPU) against
the CPU layer over mixed batches, and the stack on the GPU.
"""
import pytest
import torch

import dsv4attn
from conftest import HAVE_CUDA, requires_cuda

CFG = dsv4attn.ModelConfig.builtin("tiny-v3.2")
SEED = 5


def hidden(n, gen_seed=0):
    return torch.randn(n, CFG.dim, generator=torch.Generator().manual_seed(gen_seed))


def row_rel_err(got, want):
    got, want = got.double(), want.double()
    return (got - want).abs().amax(1) / want.abs().amax(1)


def run(layer, x, chunk, decodes=0):
    """Request 7: x's rows prefilled in chunks of `chunk`, the last `decodes` rows as decodes."""
    out, done, n = [], 0, x.shape[0]
    while done < n - decodes:
        k = min(chunk, n - decodes - done)
        out.append(layer.forward(dsv4attn.BatchDescription([7], [done], [k]), x[done:done + k]))
        done += k
    for p in range(done, n):
        out.append(layer.forward(dsv4attn.BatchDescription([7], [p], [1]), x[p:p + 1]))
    return torch.cat(out)


def test_matches_float64_reference():
    # 40 tokens: from token 16 on, the indexer's top-16 is a real selection. Tolerances as for the
    # C++ test (tests/cpu/test_sparse_mla_layer.cpp): fp32-vs-double accumulation flips an FP8 or
    # bf16 rounding only rarely, so every token < 5e-2 and the median < 1e-4.
    layer = dsv4attn.SparseMlaAttention(CFG, 0, seed=SEED, cache_blocks=16, block_size=16)
    assert layer.padded_heads == 64
    x = hidden(40)
    y = run(layer, x, 25, decodes=15)
    ref = dsv4attn.reference_sparse_mla_layer(CFG, layer.weights, x.double())
    err = row_rel_err(y, ref)
    assert not torch.isnan(y).any()
    assert err.max() < 5e-2, err
    assert err.median() < 1e-4, err
    # The comparison can fail: another layer's weights give O(1) errors.
    other = dsv4attn.SparseMlaWeights.random(CFG, 1, SEED)
    assert row_rel_err(y, dsv4attn.reference_sparse_mla_layer(CFG, other, x.double())).min() > 0.2


def test_chunked_and_decoded_agree_with_one_prefill():
    x = hidden(30, 1)
    whole = run(dsv4attn.SparseMlaAttention(CFG, 1, seed=SEED), x, 30)
    for chunk, decodes in [(7, 0), (30, 12)]:
        got = run(dsv4attn.SparseMlaAttention(CFG, 1, seed=SEED), x, chunk, decodes)
        assert row_rel_err(got, whole).max() < 2e-2


def test_state_dict_in_both_namings():
    w = dsv4attn.SparseMlaWeights.random(CFG, 0, SEED)
    sd = w.tensors(CFG)
    assert "layers.0.attn.wkv_b.weight" in sd and "layers.0.attn.indexer.k_norm.bias" in sd
    hf_names = {"wq_a": "q_a_proj", "q_norm": "q_a_layernorm", "wq_b": "q_b_proj",
                "wkv_a": "kv_a_proj_with_mqa", "kv_norm": "kv_a_layernorm", "wkv_b": "kv_b_proj",
                "wo": "o_proj"}
    hf = {}
    for name, t in sd.items():
        key, _, suffix = name[len("layers.0.attn."):].rpartition(".")
        suffix = "weight_scale_inv" if suffix == "scale" else suffix
        hf[f"model.layers.0.self_attn.{hf_names.get(key, key)}.{suffix}"] = t
    x = hidden(6, 2)
    batch = dsv4attn.BatchDescription([1], [0], [6])
    a = dsv4attn.SparseMlaAttention(CFG, 0, sd).forward(batch, x)
    b = dsv4attn.SparseMlaAttention(CFG, 0, hf).forward(batch, x)
    c = dsv4attn.SparseMlaAttention(CFG, 0, seed=SEED).forward(batch, x)
    assert torch.equal(a, b) and torch.equal(a, c)
    del sd["layers.0.attn.wo.weight"]
    with pytest.raises(dsv4attn.Error, match="layers.0.attn.wo.weight"):
        dsv4attn.SparseMlaAttention(CFG, 0, sd)


def test_stack_runs_v32_layers():
    stack = dsv4attn.AttentionStack(CFG, layers=[0, 1], seed=SEED)
    assert stack.layers == [(0, "MLA"), (1, "MLA")]
    y = stack.forward(dsv4attn.BatchDescription([3], [0], [5]), hidden(5, 3))
    assert y.shape == (5, CFG.dim) and torch.isfinite(y).all()


def test_errors():
    with pytest.raises(dsv4attn.Error, match="family"):
        dsv4attn.SparseMlaAttention("tiny", 0)
    layer = dsv4attn.SparseMlaAttention(CFG, 0, seed=SEED)
    layer.forward(dsv4attn.BatchDescription([1], [0], [4]), hidden(4))
    with pytest.raises(dsv4attn.Error, match="context"):
        layer.forward(dsv4attn.BatchDescription([1], [3], [1]), hidden(1))
    with pytest.raises(dsv4attn.Error, match="x.shape"):
        layer.forward(dsv4attn.BatchDescription([1], [4], [2]), hidden(1))
    layer.release(1)
    with pytest.raises(dsv4attn.Error, match="unknown request"):
        layer.release(1)


@pytest.mark.skipif(HAVE_CUDA, reason="the refusal needs a machine where CUDA cannot run")
def test_cuda_device_refused_where_it_cannot_run():
    with pytest.raises(dsv4attn.Error, match="SparseMlaAttention: device cuda"):
        dsv4attn.SparseMlaAttention(CFG, 0, device="cuda")


@requires_cuda
def test_cuda_layer_matches_cpu_layer_over_mixed_batches():
    # Requests listed out of the layer's order (a decode among prefills: the wrapper gathers the
    # rows decodes-first and scatters y back), a continuing chunk, a new request, then decodes.
    # bf16 weights: with FP8 weights tiny-v3.2's top-16 selection flips near-ties between the
    # backends (tests/cuda/test_sparse_mla_layer_cuda.cpp says why and tests FP8 weights on a
    # config that keeps every token). Tolerances from there: median < 4e-3, every token < 2e-2
    # but up to 2% near-tied top-k selections, each < 0.3.
    kw = dict(seed=SEED, cache_blocks=64, block_size=16, fp8_weights=False)
    cpu = dsv4attn.SparseMlaAttention(CFG, 0, **kw)
    gpu = dsv4attn.SparseMlaAttention(CFG, 0, device="cuda", **kw)
    assert gpu.device.type == "cuda" and "cuda" in repr(gpu)
    B = dsv4attn.BatchDescription
    steps = [B([1, 2], [0, 0], [40, 21]), B([1, 2, 3], [40, 21, 0], [9, 1, 13])]
    steps += [B([3, 1, 2], [13 + i, 49 + i, 22 + i], [1, 1, 1]) for i in range(4)]
    errs = []
    for i, b in enumerate(steps):
        x = hidden(b.num_tokens, 10 + i).bfloat16().float()  # the same input for both backends
        want = cpu.forward(b, x)
        got = gpu.forward(b, x.to(gpu.device))
        assert got.device == gpu.device and got.dtype == torch.float32
        errs.append(row_rel_err(got.cpu(), want))
    err = torch.cat(errs)
    assert not torch.isnan(err).any()
    assert int((err > 2e-2).sum()) <= max(1, err.numel() // 50), err
    assert err.max() < 0.3 and err.median() < 4e-3, err
    # A host x is taken too (rounded to bf16 on the GPU); a rejected step changes nothing.
    with pytest.raises(dsv4attn.Error, match="context"):
        gpu.forward(B([1], [3], [1]), hidden(1))
    mem = gpu.memory()
    assert mem.weights > 0 and mem.caches > 0 and mem.workspace_used > 0


@requires_cuda
def test_stack_runs_v32_layers_on_cuda():
    stack = dsv4attn.AttentionStack(CFG, layers=[0, 1], seed=SEED, device="cuda")
    b = dsv4attn.BatchDescription([3, 4], [0, 0], [5, 7])
    y = stack.forward(b, hidden(12, 3))
    assert y.device.type == "cuda" and y.shape == (12, CFG.dim) and torch.isfinite(y).all()
    # The same model as the CPU stack's: the GPU stack feeds its layers bf16 (the CPU one fp32),
    # which with the layers' own differences moves tokens by a few 1e-2; other weights give O(1).
    cpu = dsv4attn.AttentionStack(CFG, layers=[0, 1], seed=SEED).forward(b, hidden(12, 3))
    assert row_rel_err(y.cpu(), cpu).median() < 0.1

"""dsv4attn.SparseMlaAttention's decode steps under CUDA graphs (CUDA only; skipped without a GPU):
the layer's own graphs (cuda_graphs=True) against cuda_graphs=False, and a forward captured by the
caller with torch.cuda.graph, replayed with new inputs, against an eager twin layer; on any machine,
the option reaching the layer.

Tolerances: none, bit for bit. A decode-only step runs padded to its bucket with graphs on or off
(include/dsv4/sparse_mla_layer.h), so both layers run the same kernels on the same shapes; a
caller's capture records exactly the eager step's kernels. tests/cuda/test_sparse_mla_graphs_cuda.cpp
says why padding rows never reach a real row."""
import pytest
import torch

import dsv4attn
from dsv4attn import BatchDescription, SparseMlaAttention
from conftest import requires_cuda
from graph_capture_support import expect_capture_replays_like_eager

CFG = dsv4attn.ModelConfig.builtin("tiny-v3.2")


def _x(n, seed):
    g = torch.Generator().manual_seed(seed)
    return torch.randn(n, CFG.dim, generator=g).to(torch.bfloat16).to("cuda")


@requires_cuda
@pytest.mark.parametrize("fp8_weights", [True, False])
def test_cuda_graphs_match_eager_steps(fp8_weights):
    kw = dict(seed=3, cache_blocks=64, block_size=16, fp8_weights=fp8_weights, device="cuda")
    eager = SparseMlaAttention(CFG, 0, cuda_graphs=False, **kw)
    graphs = SparseMlaAttention(CFG, 0, cuda_graphs=True, **kw)
    ctx = {1: 0, 2: 0, 3: 0, 4: 0, 5: 0}
    steps = [([1, 2, 3], [30, 45, 17]), ([4, 5], [52, 8])]
    steps += [([1, 2, 3], [1, 1, 1])] * 5       # 3 requests: bucket 4, one padding request
    steps += [([1, 2, 3, 4, 5], [1] * 5)] * 5   # 5 requests: bucket 8, three padding requests
    for i, (ids, new) in enumerate(steps):
        b = BatchDescription(ids, [ctx[r] for r in ids], new)
        for r, n in zip(ids, new):
            ctx[r] += n
        x = _x(b.num_tokens, 10 + i)
        want, got = eager.forward(b, x), graphs.forward(b, x)
        assert torch.isfinite(got).all(), f"step {i}"
        assert torch.equal(got, want), f"step {i}: graphs on and off differ"
    assert eager.graph_stats == (0, 0)
    captures, replays = graphs.graph_stats
    assert captures >= 2 and replays >= 6, graphs.graph_stats


@requires_cuda
def test_torch_cuda_graph_capture_and_replay_match_eager():
    prefill = BatchDescription([1, 2, 3], contexts=[0, 0, 0], num_new=[50, 30, 21])
    warm = BatchDescription([1, 2, 3], contexts=[50, 30, 21], num_new=[1, 1, 1])
    step = BatchDescription([1, 2, 3], contexts=[51, 31, 22], num_new=[1, 1, 1])
    xp, xw = _x(prefill.num_tokens, 0), _x(3, 1)

    def layer_before_step():
        # Prefill, then one eager decode step of the captured shape (it sizes the workspaces).
        a = SparseMlaAttention(CFG, 0, seed=4, device="cuda", cuda_graphs=False)
        a.forward(prefill, xp)
        a.forward(warm, xw)
        return a

    expect_capture_replays_like_eager(layer_before_step, step, lambda seed: _x(3, seed))


def test_cuda_graphs_option_reaches_the_layer():
    # The option crosses the binding on any layer; a CPU layer has no graphs to count.
    for graphs in (True, False):
        layer = SparseMlaAttention(CFG, 0, seed=3, cuda_graphs=graphs)
        layer.forward(BatchDescription([1], [0], [5]), torch.randn(5, CFG.dim))
        layer.forward(BatchDescription([1], [5], [1]), torch.randn(1, CFG.dim))
        assert layer.graph_stats == (0, 0)

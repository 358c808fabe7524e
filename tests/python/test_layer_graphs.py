"""The device-resident layer from Python (CUDA only; skipped without a GPU): a forward captured by
torch.cuda.graph and replayed with new inputs matches the eager result, the layer's own decode
graphs are used, and AttentionStack keeps its residual stream on the GPU.

Tolerances: the captured step runs exactly the eager step's kernels on the same shapes, so a
replay is compared bit for bit with an eager twin layer. The stack's GPU result is compared with
the CPU stack per token by max |diff| / max |ref| < 2.4e-1 (3 layers x the FP8-weight CUDA-vs-CPU layer bound of
tests/cuda/test_attention_layer_cuda.cpp, from bf16 P and FP8 rounding flips)."""
import pytest
import torch

import dsv4attn
from dsv4attn import Attention, AttentionStack, BatchDescription
from graph_capture_support import expect_capture_replays_like_eager

cuda = pytest.mark.skipif(not (dsv4attn._C.with_cuda and torch.cuda.is_available()),
                          reason="needs a CUDA device and a CUDA build")


def _x(n, dim, seed):
    g = torch.Generator().manual_seed(seed)
    return torch.randn(n, dim, generator=g).to(torch.bfloat16).to("cuda")


@cuda
@pytest.mark.parametrize("layer", [0, 1, 2])
def test_torch_cuda_graph_capture_and_replay_match_eager(layer):
    cfg = dsv4attn.ModelConfig.builtin("tiny")
    prefill = BatchDescription([1, 2], contexts=[0, 0], num_new=[50, 30])
    warm = BatchDescription([1, 2], contexts=[50, 30], num_new=[1, 1])
    step = BatchDescription([1, 2], contexts=[51, 31], num_new=[1, 1])
    xp, xw = _x(prefill.num_tokens, cfg.dim, 0), _x(2, cfg.dim, 1)

    def layer_before_step():
        # Prefill, then one eager decode step of the captured shape (it sizes the workspaces).
        a = Attention(cfg, layer, seed=3, device="cuda", cuda_graphs=False)
        a.forward(prefill, xp)
        a.forward(warm, xw)
        return a

    expect_capture_replays_like_eager(layer_before_step, step, lambda seed: _x(2, cfg.dim, seed))


@cuda
def test_layer_decode_graphs_are_captured_and_replayed():
    cfg = dsv4attn.ModelConfig.builtin("tiny")
    a = Attention(cfg, 1, seed=5, device="cuda")
    a.forward(BatchDescription([7, 8], [0, 0], [20, 12]), _x(32, cfg.dim, 0))
    for i in range(5):
        y = a.forward(BatchDescription([7, 8], [20 + i, 12 + i], [1, 1]), _x(2, cfg.dim, i + 1))
        assert torch.isfinite(y).all()
    captures, replays = a.graph_stats
    assert captures >= 1 and replays >= 3
    mem = a.memory()
    assert mem.weights > 0 and mem.caches > 0 and mem.workspace >= mem.workspace_used > 0


@cuda
def test_stack_residual_on_gpu_matches_cpu_stack():
    cfg = dsv4attn.ModelConfig.builtin("tiny")
    gpu = AttentionStack(cfg, [0, 1, 2], seed=9, device="cuda")
    cpu = AttentionStack(cfg, [0, 1, 2], seed=9)
    steps = [BatchDescription([3, 4], [0, 0], [17, 9])]
    steps += [BatchDescription([4, 3], [9 + i, 17 + i], [1, 1]) for i in range(4)]
    for i, step in enumerate(steps):
        x = _x(step.num_tokens, cfg.dim, 10 + i).float()
        y_gpu = gpu.forward(step, x)
        assert y_gpu.device.type == "cuda"
        y_cpu = cpu.forward(step, x.cpu())
        err = ((y_gpu.cpu() - y_cpu).abs().amax(dim=1) / y_cpu.abs().amax(dim=1)).max().item()
        assert err < 2.4e-1, f"step {i}: {err}"

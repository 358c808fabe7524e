"""dsv4attn.Attention's tensor-parallel option (tp_rank / tp_size / reduce, docs/design.md
"Tensor parallelism") on the CPU: the tiny config's 16 heads / 4 wo_a groups split over 2
ranks (4 would cut its FP8 wo_b inside a 128-column scale block, which is refused); the ranks' partial y's, summed by a reduce callback that stands in for
torch.distributed.all_reduce, match the whole layer within 1e-5 per token (only wo_b's fp32
summation order differs). Where 2+ GPUs are visible, the same option on a torch.distributed NCCL
group, one process per GPU under torchrun (tests/python/multi_gpu/tp_torchrun.py)."""
import os
import subprocess
import sys

import pytest
import torch

import dsv4attn

TINY = dsv4attn.ModelConfig.builtin("tiny")


def layer(rank=0, size=1, reduce=None):
    return dsv4attn.Attention(TINY, 1, seed=3, swa_blocks=64, compressed_blocks=64,
                              state_blocks=64, tp_rank=rank, tp_size=size, reduce=reduce)


@pytest.mark.parametrize("tp", [2])
def test_partial_outputs_sum_to_the_whole_layer(tp):
    x = torch.randn(11, TINY.dim, generator=torch.Generator().manual_seed(5))
    batch = dsv4attn.BatchDescription([4], [0], [11])
    want = layer().forward(batch, x).double()
    partials = []
    ranks = [layer(r, tp, reduce=partials.append) for r in range(tp)]
    got = sum(rank.forward(batch, x).double() for rank in ranks)
    assert len(partials) == tp  # the callback saw every rank's y
    err = (got - want).abs().amax(1) / want.abs().amax(1)
    assert err.max().item() < 1e-5


def test_bad_tp_options_name_the_field():
    with pytest.raises(dsv4attn.Error, match="tp.size"):
        layer(0, 3)
    with pytest.raises(dsv4attn.Error, match="tp.rank"):
        layer(2, 2)
    with pytest.raises(dsv4attn.Error, match="wo_b: expected a slice of whole 128-wide"):
        layer(0, 4)


def _multi_gpu_worlds():
    """2, 4, 8 ranks, each skipped (naming the counts) above the GPUs visible."""
    visible = torch.cuda.device_count() if torch.cuda.is_available() else 0
    usable = dsv4attn.with_cuda and torch.distributed.is_available() and torch.distributed.is_nccl_available()
    return [pytest.param(n, marks=pytest.mark.skipif(
        visible < n or not usable,
        reason=f"needs {n} GPUs, the CUDA backend and torch's NCCL; {visible} GPU(s) visible"))
        for n in (2, 4, 8)]


@pytest.mark.parametrize("world", _multi_gpu_worlds())
def test_ranks_on_gpus_over_torch_distributed_match_one_rank(world):
    """tests/python/multi_gpu/tp_torchrun.py under torchrun, one process per GPU: each rank's
    all-reduced y matches the whole layer on its GPU, and the ranks agree bit for bit."""
    script = os.path.join(os.path.dirname(__file__), "multi_gpu", "tp_torchrun.py")
    env = dict(os.environ, NCCL_NVLS_ENABLE="0")  # NVLink multicast off, as the device notes require
    r = subprocess.run([sys.executable, "-m", "torch.distributed.run", "--standalone",
                        f"--nproc_per_node={world}", script],
                       env=env, capture_output=True, text=True, timeout=600)
    assert r.returncode == 0, r.stdout[-4000:] + r.stderr[-4000:]
    assert r.stdout.count("-> ok") == world, r.stdout

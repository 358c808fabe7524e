"""dsv4attn.Attention's tensor-parallel option (tp_rank / tp_size / reduce, docs/design.md
"Tensor parallelism") on the CPU: the tiny config's 16 heads / 4 wo_a groups split over 2
ranks (4 would cut its FP8 wo_b inside a 128-column scale block, which is refused); the ranks' partial y's, summed by a reduce callback that stands in for
torch.distributed.all_reduce, match the whole layer within 1e-5 per token (only wo_b's fp32
summation order differs)."""
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

"""dsv4attn.Attention's tensor-parallel option on a torch.distributed NCCL group, one process per
GPU. Launched by torchrun (tests/python/test_tensor_parallel.py starts it where 2+ GPUs are
visible; bench/device_check.sh tp):

    NCCL_NVLS_ENABLE=0 python -m torch.distributed.run --standalone --nproc_per_node=N \\
        tests/python/multi_gpu/tp_torchrun.py

Rank r builds V4-Flash's first layer of each kind twice on cuda:LOCAL_RANK: whole (tp 1) and its
shard (tp_rank=r, tp_size=N, reduce=torch.distributed.all_reduce). Every rank feeds both the same
steps (a 40- and a 7-token prompt, then 3 decode steps of both; inputs from one seed), and checks
that its reduced y equals the whole layer's within 2e-3 per token (max|Δy| / max|y|; only the
fp32 order of wo_b's block sums differs, tests/nccl/test_tensor_parallel_multi_gpu.cpp derives
the bound) and that every rank's reduced y is rank 0's bit for bit. Exits non-zero on a mismatch.
"""
import os
import sys

import torch
import torch.distributed as dist

import dsv4attn

TOLERANCE = 2e-3


def steps(dim):
    """(batch, x) per step: two prefills, then three decode steps of both requests."""
    gen = torch.Generator().manual_seed(5)  # the same inputs on every rank
    out = [(dsv4attn.BatchDescription([0, 1], [0, 0], [40, 7]), torch.randn(47, dim, generator=gen))]
    for i in range(3):
        out.append((dsv4attn.BatchDescription([0, 1], [40 + i, 7 + i], [1, 1]), torch.randn(2, dim, generator=gen)))
    return out


def main():
    rank, world = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
    device = torch.device("cuda", int(os.environ["LOCAL_RANK"]))
    torch.cuda.set_device(device)
    dist.init_process_group("nccl")
    cfg = dsv4attn.ModelConfig.builtin("v4-flash")
    first_of_kind = {}
    for layer, ratio in enumerate(cfg.compress_ratios):
        first_of_kind.setdefault(ratio, layer)
    worst, same = 0.0, True
    for ratio, layer in sorted(first_of_kind.items()):
        whole = dsv4attn.Attention(cfg, layer, seed=3, device=device)
        shard = dsv4attn.Attention(cfg, layer, seed=3, device=device, tp_rank=rank, tp_size=world,
                                   reduce=lambda y: dist.all_reduce(y))
        for batch, x in steps(cfg.dim):
            want = whole.forward(batch, x).double()
            got = shard.forward(batch, x)
            err = ((got.double() - want).abs().amax(1) / want.abs().amax(1)).max().item()
            worst = max(worst, err)
            ranks = [torch.empty_like(got) for _ in range(world)]
            dist.all_gather(ranks, got)
            same = same and all(torch.equal(ranks[0], y) for y in ranks)
        print(f"rank {rank}: layer {layer} (ratio {ratio}) worst token error so far {worst:.3g}", flush=True)
    dist.destroy_process_group()
    ok = worst < TOLERANCE and same
    print(f"rank {rank} of {world}: worst token error {worst:.3g} (< {TOLERANCE}), ranks bit-identical: {same}"
          f" -> {'ok' if ok else 'FAIL'}", flush=True)
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())

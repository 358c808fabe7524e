"""Launching a kernel with the largest tile configuration the device can hold.

The attention kernels' shared-memory needs depend on the tile sizes and on the target (H100:
227 KB per block, A100: 163 KB, MI300: 64 KB, consumer GPUs: 99-100 KB). Rather than guess per
target, an op lists its configurations from the fastest to the smallest, and the first launch on
a device tries them in order: a configuration Triton refuses for lack of resources is skipped,
and the one that launched is remembered for that device and kernel variant (later launches use
it directly, so steady-state calls compile nothing and try nothing).
"""
from __future__ import annotations

import dataclasses
from typing import Callable, Dict, Sequence, Tuple

from triton.runtime.errors import OutOfResources


@dataclasses.dataclass(frozen=True)
class Config:
    block_h: int
    block_n: int
    num_warps: int
    num_stages: int = 2


_chosen: Dict[Tuple, int] = {}


def launch(kernel, key: Tuple, configs: Sequence[Config], grid: Callable[[Config], tuple],
           args: tuple, constexprs: dict) -> None:
    """kernel[grid(c)](*args, **constexprs, BLOCK_H=c.block_h, BLOCK_N=c.block_n,
    num_warps=c.num_warps, num_stages=c.num_stages) for the first config c that fits."""
    first = _chosen.get(key, 0)
    for i in range(first, len(configs)):
        c = configs[i]
        try:
            kernel[grid(c)](*args, **constexprs, BLOCK_H=c.block_h, BLOCK_N=c.block_n,
                            num_warps=c.num_warps, num_stages=c.num_stages)
        except OutOfResources:
            if i + 1 == len(configs):
                raise
            continue
        _chosen[key] = i
        return

"""Host time of a call that launches GPU work, without the GPU's time in it.

Shared by bench/scripts/host_overhead.py and bench/experiments/host_breakdown.py."""
from __future__ import annotations

import statistics
import time

import torch


def host_us(fn, calls: int = 100, batches: int = 5) -> float:
    """Mean host µs of `fn()` over `calls` calls queued behind ~100 ms of GPU sleep (so no call
    waits for the GPU and the kernels' own duration does not count); median of `batches`."""
    for _ in range(10):
        fn()
    torch.cuda.synchronize()
    means = []
    for _ in range(batches):
        torch.cuda._sleep(200_000_000)  # ~100 ms at ~2 GHz: every call below is queued behind it
        t0 = time.perf_counter()
        for _ in range(calls):
            fn()
        means.append((time.perf_counter() - t0) / calls * 1e6)
        torch.cuda.synchronize()
    return statistics.median(means)

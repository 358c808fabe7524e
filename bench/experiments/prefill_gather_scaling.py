"""Is the sparse prefill's gather bound per SM or by the whole GPU's L2?

The per-tile trace (docs/notes/prefill.md, "The item boundary, traced") shows one 64-row gather in
flight per SM at a time, landing at ~22 bytes a cycle per SM, and the chain and the gather bound
coinciding. Two readings fit: each SM's own intake (its load/store queue, in-flight requests) is
the limit, or all SMs together are at the L2's bandwidth. They predict different things when
fewer SMs work: a per-SM limit gives the same time per tile at any number of CTAs; a shared L2
limit gives less time per tile as CTAs drop.

This runs the prefill with s_q = the number of CTAs wanted (one item each: the persistent grid is
min(items, SMs)), H 64 (one head group), a long top-k so the tiles outweigh the item's prologue
and epilogue, and reports the median time per tile per CTA, and the bytes per µs per SM and over
the GPU. The indices are random rows of a kv that fits in L2, so every gather is an L2 hit.

With --invalid, a fraction of the slots is -1: those rows read nothing of the kv (since 6a1980a they
are copied from rows of zeros in global memory, L2-resident; before, cp.async zero-filled them),
while S, the softmax and P·V run on the whole tile as before. If the time per tile falls with the bytes
read, the gather binds; if it stays, the math warpgroups' chain does.

Run (device, after a build of the Python extension, e.g. `BUILD_TARGETS=_C bash
bench/scripts/device_session.sh`):
  PYTHONPATH=$PWD/build/python:$PWD/third_party/pylib python3 bench/experiments/prefill_gather_scaling.py
"""
from __future__ import annotations

import argparse
import time

import torch

import dsv4attn  # noqa: F401
from dsv4attn.flash_mla import flash_mla_sparse_fwd

H, D_V, TILE = 64, 512, 64


def time_call(fn, iters: int) -> float:
    """Median µs of `iters` calls, each timed alone with CUDA events after an L2-neutral warm-up.
    Each call is queued behind ~1 ms of GPU sleep, so the events time the GPU's work only, not the
    host's time to reach the launch (which an idle GPU would wait out inside the events)."""
    fn()
    torch.cuda.synchronize()
    times = []
    for _ in range(iters):
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        torch.cuda._sleep(2_000_000)
        start.record()
        fn()
        end.record()
        end.synchronize()
        times.append(start.elapsed_time(end) * 1e3)
    times.sort()
    return times[len(times) // 2]


def host_us(fn, iters: int) -> float:
    """Host µs per call from Python to the launch, the GPU kept busy so no call waits for it."""
    torch.cuda.synchronize()
    torch.cuda._sleep(50_000_000)
    t0 = time.perf_counter()
    for _ in range(iters):
        fn()
    us = (time.perf_counter() - t0) / iters * 1e6
    torch.cuda.synchronize()
    return us


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--ctas", default="1,8,16,33,66,99,132", help="numbers of CTAs (items) to run")
    ap.add_argument("--topk", type=int, default=16384, help="slots a token (tiles = topk / 64)")
    ap.add_argument("--d-qk", type=int, default=576, choices=(512, 576))
    ap.add_argument("--s-kv", type=int, default=8192)
    ap.add_argument("--iters", type=int, default=20)
    ap.add_argument("--invalid", default="0",
                    help="fractions of each token's slots set to -1, comma-separated: an invalid row is "
                    "copied from rows of zeros (no kv read), so the kv bytes fall and the math stays the same")
    args = ap.parse_args()
    dev = "cuda"
    sms = torch.cuda.get_device_properties(0).multi_processor_count
    gen = torch.Generator().manual_seed(0)
    kv = (torch.rand((args.s_kv, 1, args.d_qk), generator=gen) * 2 - 1).to(dev, torch.bfloat16)
    tiles = args.topk // TILE
    tile_bytes = TILE * args.d_qk * 2
    print(f"d_qk {args.d_qk}, H {H}, topk {args.topk} ({tiles} tiles an item), s_kv {args.s_kv}, {sms} SMs")
    print(f"{'CTAs':>5} {'invalid':>7} {'µs':>9} {'µs/tile':>8} {'GB/s per SM':>12} {'GB/s, all':>10} {'host µs':>8}")
    for ctas in (int(c) for c in args.ctas.split(",")):
        if ctas > sms:
            continue
        for invalid in (float(f) for f in args.invalid.split(",")):
            q = (torch.rand((ctas, H, args.d_qk), generator=gen) * 2 - 1).to(dev, torch.bfloat16)
            idx = torch.randint(0, args.s_kv, (ctas, 1, args.topk), dtype=torch.int32, generator=gen)
            idx[torch.rand(idx.shape, generator=gen) < invalid] = -1
            idx = idx.to(dev)
            out = torch.empty((ctas, H, D_V), dtype=torch.bfloat16, device=dev)
            us = time_call(lambda: flash_mla_sparse_fwd(q, kv, idx, args.d_qk ** -0.5, out=out), args.iters)
            per_tile = us / tiles
            per_sm = tile_bytes * (1 - invalid) / per_tile / 1e3  # bytes read / µs = MB/s → GB/s
            host = host_us(lambda: flash_mla_sparse_fwd(q, kv, idx, args.d_qk ** -0.5, out=out), 10)
            print(f"{ctas:5d} {invalid:7.2f} {us:9.1f} {per_tile:8.3f} {per_sm:12.1f} {per_sm * ctas:10.1f} {host:8.1f}")


if __name__ == "__main__":
    main()

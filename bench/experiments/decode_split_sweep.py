"""Decode at small batches: every split count the planner could choose, timed, and where the time
goes for the one it chooses.

V4-Flash's shape (MODEL1_FP8, H 64, d 512, topk 128 at block 256 plus extra topk 512 at block
64, with a sink) at b = 1 ... 32 and s_q = 1, 2. FlashMLA's b2 case runs at 0.83x its speed
although both split each row into about ten one-tile pieces (docs/notes/decode.md), so this asks
two questions no patch is needed for:
  1. is the planner's split count (make_decode_schedule) the fastest one at these batches, and
  2. of the chosen plan's time, how much is the split kernel and how much the combine?
Each plan is timed alone (L2 flushed before each call, CUDA events, median of --iters); the
breakdown comes from the torch profiler's kernel durations over the same number of calls.

Run (device, after a build of the Python extension, e.g. `BUILD_TARGETS=_C bash
bench/scripts/device_session.sh`):
  PYTHONPATH=$PWD/build/python:$PWD/third_party/pylib python3 bench/experiments/decode_split_sweep.py
"""
from __future__ import annotations

import argparse
import math
import os
import sys
from pathlib import Path

import torch

import dsv4attn  # noqa: F401  (registers torch.ops.dsv4.*)
from dsv4attn._runtime import decode_schedule, planner_sms
from dsv4attn.flash_mla import kv_cache_block_bytes

H, D_QK, D_V, TILE = 64, 512, 512, 64
TOPK, BLOCK, EXTRA_TOPK, EXTRA_BLOCK = 128, 256, 512, 64


def plans(tiles: int):
    """Every distinct (splits, split_len) with no empty split: split_len = ceil(tiles / s) tiles."""
    seen = {}
    for s in range(1, tiles + 1):
        per = math.ceil(tiles / s)
        seen.setdefault(math.ceil(tiles / per), per * TILE)
    return sorted(seen.items())


def make_inputs(b: int, s_q: int, gen: torch.Generator, dev: str):

    def cache(topk: int, block: int):
        # Random tokens through dsv4attn's quantizer (on the CPU), several times what one call reads.
        blocks = max(4 * b * s_q * topk // block, 64)
        data = torch.empty((blocks, kv_cache_block_bytes("model1_fp8", block)), dtype=torch.uint8)
        torch.ops.dsv4.kv_quantize(data, "model1_fp8", block, 1.0,
                                   torch.randn((blocks * block, D_QK), generator=gen),
                                   torch.arange(blocks * block))
        idx = torch.randint(0, blocks * block, (b, s_q, topk), dtype=torch.int32, generator=gen)
        return data.to(dev), idx.to(dev)

    main, idx = cache(TOPK, BLOCK)
    extra, eidx = cache(EXTRA_TOPK, EXTRA_BLOCK)
    q = (torch.rand((b, s_q, H, D_QK), generator=gen) * 2 - 1).to(dev, torch.bfloat16)
    sink = torch.linspace(-1, 1, H).to(dev)
    out = torch.empty((b, s_q, H, D_V), dtype=torch.bfloat16, device=dev)
    lse = torch.empty((b, s_q, H), dtype=torch.float32, device=dev)
    return q, main, idx, extra, eidx, sink, out, lse


def call(inputs, b: int, s_q: int, splits: int, split_len: int):
    q, main, idx, extra, eidx, sink, out, lse = inputs
    ws_bytes = b * s_q * H * splits * (D_V + 1) * 4
    ws = torch.empty(max(ws_bytes, 16), dtype=torch.uint8, device=q.device)
    return lambda: torch.ops.dsv4.sparse_decode(
        q, main, "model1_fp8", BLOCK, idx, None, extra, "model1_fp8", EXTRA_BLOCK, eidx, None, sink,
        D_QK ** -0.5, D_V, splits, split_len, ws_bytes, ws, out, lse)


def kernel_split(fn, iters: int) -> dict:
    """Mean µs per call of each kernel fn launches, L2 flushed before each call as `timed` does
    (the flush's memset left out). Launches are programmatic (src/cuda/common/launch.cuh): the
    combine becomes resident while the decode kernel runs and waits for it, and the profiler
    counts that wait as the combine's. Run with DSV4_PDL=0 for each kernel's own time."""
    from torch.profiler import ProfilerActivity, profile
    flush = torch.empty(256 << 20, dtype=torch.uint8, device="cuda")
    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        for _ in range(iters):
            flush.zero_()
            fn()
        torch.cuda.synchronize()
    per = {}
    for ev in prof.key_averages():
        name = ev.key.lower()
        if ev.device_type.name == "CUDA" and not ("fill" in name or "elementwise" in name or "memset" in name):
            per[ev.key[:60]] = ev.device_time_total / iters
    return per


def check_plans(args, gen: torch.Generator) -> None:
    """Every plan's out and lse against the planner's: the splits only regroup the same fp32
    sums, so out agrees to bf16 rounding (an output may round the other way: one bf16 unit,
    2^-7 relative at the top of its binade, allowed against max |out|) and lse to fp32 rounding
    of a few additions (1e-4 allowed)."""
    dev = "cuda" if torch.cuda.is_available() else "cpu"
    plan_list = plans(math.ceil((TOPK + EXTRA_TOPK) / TILE))
    failed = False
    for s_q in map(int, args.sq.split(",")):
        for b in map(int, args.batches.split(",")):
            inputs = make_inputs(b, s_q, gen, dev)
            out, lse = inputs[-2], inputs[-1]
            chosen = decode_schedule(b, s_q, H, TOPK + EXTRA_TOPK, planner_sms(torch.device(dev)), D_V)[0]
            call(inputs, b, s_q, chosen, dict(plan_list)[chosen])()
            ref_out, ref_lse = out.float().clone(), lse.clone()
            worst_out = worst_lse = 0.0
            for splits, split_len in plan_list:
                out.fill_(float("nan")); lse.fill_(float("nan"))  # poisoned: every entry written
                call(inputs, b, s_q, splits, split_len)()
                d = (out.float() - ref_out).abs().max().item() / ref_out.abs().max().item()
                worst_out = max(worst_out, d if d == d else float("inf"))
                d = (lse - ref_lse).abs().max().item()
                worst_lse = max(worst_lse, d if d == d else float("inf"))
            ok = worst_out <= 2.0 ** -7 and worst_lse <= 1e-4
            print(f"b {b} s_q {s_q}: {len(plan_list)} plans, planner's {chosen} splits; largest "
                  f"difference out {worst_out:.3g} (of max |out|), lse {worst_lse:.3g}: "
                  f"{'ok' if ok else 'MISMATCH'}")
            failed |= not ok
    if failed:
        raise SystemExit("decode_split_sweep: plans disagree")


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--batches", default="1,2,4,8,16,32")
    ap.add_argument("--sq", default="1,2")
    ap.add_argument("--iters", type=int, default=30)
    ap.add_argument("--check-only", action="store_true",
                    help="no timing: every plan's output against the planner's (runs on the CPU too)")
    args = ap.parse_args()
    gen = torch.Generator().manual_seed(5)
    if args.check_only:
        return check_plans(args, gen)
    sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "scripts"))
    from bench_triton import timed  # median µs, CUDA events, L2 flushed before each call
    sms = planner_sms(torch.device("cuda"))
    tiles = math.ceil((TOPK + EXTRA_TOPK) / TILE)
    plan_list = plans(tiles)
    print(f"{torch.cuda.get_device_name()}, {sms} SMs; V4-Flash H{H} MODEL1 {TOPK}+{EXTRA_TOPK}, "
          f"{tiles} tiles per row; us = median of {args.iters}, L2 flushed")
    print(f"{'b':>4} {'s_q':>3} {'splits':>6} {'tiles/split':>11} {'us':>8}  note")
    for s_q in map(int, args.sq.split(",")):
        for b in map(int, args.batches.split(",")):
            inputs = make_inputs(b, s_q, gen, "cuda")
            chosen = decode_schedule(b, s_q, H, TOPK + EXTRA_TOPK, sms, D_V)[0]
            times = {splits: timed(call(inputs, b, s_q, splits, split_len), args.iters)
                     for splits, split_len in plan_list}
            best = min(times, key=times.get)
            for splits, split_len in plan_list:
                note = ("planner" if splits == chosen else "") + (" fastest" if splits == best else "")
                print(f"{b:4} {s_q:3} {splits:6} {split_len // TILE:11} {times[splits]:8.2f}  {note}")
            parts = kernel_split(call(inputs, b, s_q, chosen, dict(plan_list)[chosen]), args.iters)
            pdl = os.environ.get("DSV4_PDL", "1") != "0"
            print("       planner's plan, kernel us per call" +
                  (" (PDL: the combine's includes its wait)" if pdl else "") + ": " +
                  ", ".join(f"{k}: {v:.2f}" for k, v in parts.items()))


if __name__ == "__main__":
    main()

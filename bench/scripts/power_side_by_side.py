#!/usr/bin/env python3
"""power_side_by_side.py CASE [--seconds S] [--rounds R]: FlashMLA's kernel and ours on one of
ncu_side_by_side.py's cases (FlashMLA's own inputs), each run back to back for S seconds while
nvidia-smi samples the SM clock and the board power every 50 ms. Prints, per implementation and
round, the mean time per call and the median clock and power over the run.

Why: Nsight Compute locks the clocks (1.35 GHz on the H200), the side-by-side timing does not. A
case whose ratio differs between the two (decode peak H 128: ours 1.4 % faster under the profiler,
2 % slower in side_by_side.py) is decided by the clock each kernel holds under the power cap, which
this shows. Calls are not separated by L2 flushes here (a steady state is what draws the power).

Needs what ncu_side_by_side.py needs (FlashMLA's measurement-only build and tests/ on the path).
"""
import argparse
import statistics
import subprocess
import time

import torch

import ncu_side_by_side as cases  # FlashMLA's lib and side_by_side.with_impl, the case tables


def sampled(run_for_seconds):
    """Runs run_for_seconds() while nvidia-smi samples; returns (its result, clocks MHz, watts)."""
    smi = subprocess.Popen(
        ["nvidia-smi", "--query-gpu=clocks.sm,power.draw", "--format=csv,noheader,nounits", "-lms", "50"],
        stdout=subprocess.PIPE, text=True)
    try:
        result = run_for_seconds()
    finally:
        smi.terminate()
    clocks, watts = [], []
    for line in smi.communicate()[0].splitlines():
        parts = [x.strip() for x in line.split(",")]
        if len(parts) == 2:
            try:
                clocks.append(float(parts[0]))
                watts.append(float(parts[1]))
            except ValueError:
                pass
    return result, clocks, watts


def timed_loop(call, seconds):
    """Calls call() in batches of 10 for about `seconds`; returns the mean µs per call."""
    call()
    torch.cuda.synchronize()
    start, calls = time.perf_counter(), 0
    begin, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    begin.record()
    while time.perf_counter() - start < seconds:
        for _ in range(10):
            call()
        calls += 10
        torch.cuda.synchronize()
    end.record()
    torch.cuda.synchronize()
    return begin.elapsed_time(end) * 1e3 / calls


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("case", choices=sorted(cases.CASES) + sorted(cases.PREFILL_CASES))
    ap.add_argument("--seconds", type=float, default=3.0)
    ap.add_argument("--rounds", type=int, default=2)
    args = ap.parse_args()
    torch.set_default_dtype(torch.bfloat16)
    torch.set_default_device("cuda:0")
    lib = cases.lib
    calls = {}
    for name, mod in (("flashmla", cases.flash_mla), ("dsv4attn", cases.ours)):
        if args.case in cases.PREFILL_CASES:
            p = cases.PREFILL_CASES[args.case]
            p.seed = 1
            t = lib.generate_testcase(p)
            calls[name] = (mod, lambda p=p, t=t: lib.run_flash_mla_sparse_fwd(p, t, False))
        else:
            p = cases.CASES[args.case].to_test_param()
            p.seed = 1
            t = lib.generate_testcase_for_decode(p)
            meta, _ = mod.get_mla_metadata()
            calls[name] = (mod, lambda p=p, t=t, meta=meta: lib.run_flash_mla_decode(p, t, meta, None))
    print(f"{'round':>5} {'impl':>9} {'us/call':>9} {'SM MHz (median)':>16} {'W (median)':>11} {'samples':>8}")
    for r in range(args.rounds):
        order = list(calls) if r % 2 == 0 else list(reversed(list(calls)))
        for name in order:
            mod, call = calls[name]
            time.sleep(2.0)  # idle between cases: the power cap's state should not carry over
            us, clocks, watts = sampled(lambda: cases.side_by_side.with_impl(mod, lambda: timed_loop(call, args.seconds)))
            tail = len(clocks) // 5  # the first fifth is the ramp up
            mhz = statistics.median(clocks[tail:]) if clocks[tail:] else float("nan")
            w = statistics.median(watts[tail:]) if watts[tail:] else float("nan")
            print(f"{r:>5} {name:>9} {us:>9.1f} {mhz:>16.0f} {w:>11.0f} {len(clocks):>8}", flush=True)


if __name__ == "__main__":
    main()

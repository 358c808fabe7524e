#!/usr/bin/env python3
"""prefill_call_spread.py [--shape D:H:TOPK:S_KV] [--calls N] [--placements P] [--json PATH]:
every call's time, not a median, for FlashMLA's sparse prefill and ours on one of FlashMLA's
production shapes (default V3.2: d 576, H 128, top-k 2048, s_kv 8k), with FlashMLA's inputs.

Why: on the H 128 prefill cases our median moves 3-8 % between runs of one call (V3.2 s_kv 8k:
3472 against 3623 µs in two processes, bench/RESULTS.md) while FlashMLA's stays within 1 %, and
Nsight Compute finds the two kernels at the same cycles. This says where the spread lives:
- within a process: N calls timed one by one, after an 8 GB L2 flush each (side_by_side.py's
  method) and back to back without it (the steady state), both implementations on the same
  tensors;
- across placements of the kv rows: P times the kv tensor is moved to a fresh allocation (the old
  ones kept alive, so each lands elsewhere), the calls repeated on each. If ours jumps with the
  placement and FlashMLA does not, where the rows sit (L2 partitions, pages) is what moves it;
- across processes: run the script more than once.

Needs what side_by_side.py needs: the measurement-only FlashMLA build and its tests/ on
PYTHONPATH, dsv4attn, and .peers/flashmla (for side_by_side itself).
"""
import argparse
import json
import os
import statistics
import sys
import time

import torch
import lib  # FlashMLA's tests/lib.py
from lib import TestParam

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "..", ".peers", "flashmla"))
import side_by_side  # noqa: E402


def call_times_us(fn, calls, flush):
    """Each call's time in µs (CUDA events), after two warm-up calls; the L2 flushed before each
    call when `flush` is a buffer, back to back when it is None."""
    for _ in range(2):
        fn()
    times = []
    for _ in range(calls):
        if flush is not None:
            flush.zero_()
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        fn()
        end.record()
        torch.cuda.synchronize()
        times.append(start.elapsed_time(end) * 1e3)
    return times


def summary(times):
    return f"median {statistics.median(times):8.1f}  min {min(times):8.1f}  max {max(times):8.1f}"


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--shape", default="576:128:2048:8192", help="d_qk:h_q:topk:s_kv")
    ap.add_argument("--calls", type=int, default=10)
    ap.add_argument("--placements", type=int, default=3)
    ap.add_argument("--json", default="prefill_call_spread.json")
    a = ap.parse_args()
    d_qk, h_q, topk, s_kv = (int(x) for x in a.shape.split(":"))
    torch.set_default_dtype(torch.bfloat16)
    torch.set_default_device("cuda:0")
    p = TestParam(4096, s_kv, topk, h_q=h_q, d_qk=d_qk, have_attn_sink=True)
    p.seed = 1
    t = lib.generate_testcase(p)
    flush = torch.empty(int(8e9 // 4), dtype=torch.int)
    kept = []  # earlier placements of the kv, alive so that each new one lands elsewhere
    rows = []
    for placement in range(a.placements):
        if placement > 0:
            kept.append(t.kv)
            moved = torch.empty_strided(t.kv.size(), t.kv.stride(), dtype=t.kv.dtype)
            moved.copy_(t.kv)
            t.kv = moved
        address = t.kv.data_ptr()
        for name, module in (("flashmla", side_by_side.fm_real), ("dsv4", side_by_side.fm_d4)):
            fn = lambda: side_by_side.with_impl(module, lambda: lib.run_flash_mla_sparse_fwd(p, t, False))
            for mode, buffer in (("flushed", flush), ("steady", None)):
                time.sleep(1.0)  # idle between runs, as dsv4 bench does (the power cap)
                times = call_times_us(fn, a.calls, buffer)
                rows.append({"placement": placement, "kv_address": address, "impl": name, "mode": mode,
                             "us": times})
                print(f"placement {placement} (kv at {address:#x}, {address % (2 << 20) >> 10} KB into a 2 MB page) "
                      f"{name:8} {mode:7}: {summary(times)}  | " + " ".join(f"{x:.0f}" for x in times), flush=True)
                json.dump({"shape": a.shape, "rows": rows}, open(a.json, "w"), indent=1)


if __name__ == "__main__":
    main()

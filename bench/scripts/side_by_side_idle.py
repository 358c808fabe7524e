#!/usr/bin/env python3
"""side_by_side_idle.py [--idle S] MODE... [--json PATH]: side_by_side.py (.peers/flashmla) with
the GPU idle for S seconds (default 1) before each implementation's timing, not only before
each case.

Why: side_by_side.py idles one second before a case, then times FlashMLA (3 warm-up calls and 10
or 20 timed ones, each behind an 8 GB L2 flush) and ours right after it, with no pause between.
Where a case runs near the board's power cap (the H 128 prefill: 3.4 ms a call) the second
implementation starts on a board that the first has just heated. prefill_call_spread.py
(bench/experiments), which idles before each implementation, timed ours flushed at 3437-3468 µs on
V3.2 s_kv 8k, flat across 30 calls and three kv placements, while side_by_side.py's runs in the
same device call put it at 3530-3687 µs (bench/RESULTS.md, "The side by side's order"). This
script changes nothing else: the same cases, inputs, flush, events and medians (it patches
side_by_side.timed and calls side_by_side.main), so both numbers can be reported from one call.

Needs what side_by_side.py needs (the measurement-only FlashMLA build and its tests/ on
PYTHONPATH, dsv4attn, and .peers/flashmla).
"""
import argparse
import os
import sys
import time

import torch

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "..", ".peers", "flashmla"))
import side_by_side  # noqa: E402


def main():
    ap = argparse.ArgumentParser(add_help=False)
    ap.add_argument("--idle", type=float, default=1.0, help="seconds idle before each implementation's timing")
    a, rest = ap.parse_known_args()
    timed_as_is = side_by_side.timed

    def timed_after_idle(fn, n=20):
        torch.cuda.synchronize()
        time.sleep(a.idle)
        return timed_as_is(fn, n)

    side_by_side.timed = timed_after_idle
    sys.argv = [sys.argv[0]] + rest
    side_by_side.main()


if __name__ == "__main__":
    main()

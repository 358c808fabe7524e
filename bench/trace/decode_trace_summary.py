#!/usr/bin/env python3
"""decode_trace_summary.py FILE: reads a sparse decode kernel's trace (a -DDSV4_KERNEL_TRACE build
run with DSV4_KERNEL_TRACE=FILE: src/cuda/common/kernel_trace.cuh; the events are listed beside
trace_cta() in src/cuda/attention/sparse_decode/trace.cuh) and prints, per traced CTA, where a
tile's period goes: the median cycles of each role's steps over the steady tiles (the first two
and the last are left out), the hand-offs between roles, and the CTA's prologue and epilogue.
clock64 is one SM's counter, so every difference is taken within one CTA."""
import sys

from trace_file import med, summarise_each_cta

STEPS = {
    "producer": [("empty wait", 0, 1), ("convert + store", 1, 2), ("fence + arrive", 2, 3), ("refill issue", 3, 4)],
    "warpgroup 0": [("stage wait", 5, 6), ("S", 6, 7), ("p_free wait", 7, 8), ("softmax + P publish", 8, 9),
                    ("own P·V + release", 9, 10)],
    "warpgroup 1": [("stage wait", 11, 12), ("p_ready wait", 12, 13), ("P·V + release", 13, 14)],
}
PERIOD_EVENT = {"producer": 0, "warpgroup 0": 5, "warpgroup 1": 11}
ONCE = [("entry → block barrier", 0, 1), ("barrier → Q loaded", 1, 2), ("Q → warpgroup 0's last tile", 2, 3),
        ("last tile → O stored (warpgroup 0)", 3, 4), ("producer start → end", 5, 6), ("entry → warpgroup 1's O", 0, 7)]



def summarise(slot, rows):
    once = rows.pop(max(rows))  # the last row holds the once-per-CTA events
    tiles = sorted(t for t, ev in rows.items() if any(ev))
    if not tiles:
        print(f"== CTA slot {slot}: no tile events")
        return
    steady = [t for t in tiles if 2 <= t < tiles[-1]]
    print(f"== CTA slot {slot}: {len(tiles)} tiles traced, {len(steady)} steady (median cycles)")
    for role, steps in STEPS.items():
        e = PERIOD_EVENT[role]
        period = [rows[t + 1][e] - rows[t][e] for t in steady if t + 1 in rows and rows[t][e] and rows[t + 1][e]]
        print(f"  {role:12s} period {med(period)}")
        for name, a, b in steps:
            xs = [rows[t][b] - rows[t][a] for t in steady if rows[t][a] and rows[t][b]]
            print(f"    {name:24s} {med(xs)}")
    # Hand-offs: the producer's arrive → warpgroup 0 sees the stage (in a cluster it also waits for
    # the peer's stores), and the later consumer release of tile t → the producer past tile t+2's
    # empty wait (in a cluster both CTAs' consumers release it).
    seen = [rows[t][6] - rows[t][3] for t in steady if rows[t][3] and rows[t][6]]
    freed = [rows[t + 2][1] - max(rows[t][10], rows[t][14]) for t in steady
             if t + 2 in rows and rows[t + 2][1] and rows[t][10] and rows[t][14]]
    print(f"  hand-offs: arrive → stage seen by warpgroup 0 {med(seen)};"
          f" tile t released → producer past tile t+2's wait {med(freed)}")
    print("  once per CTA:")
    for name, a, b in ONCE:
        print(f"    {name:36s} " + (f"{once[b] - once[a]:8d}" if once[a] and once[b] else "       -"))
    base = once[0] or min(v for ev in rows.values() for v in ev if v)
    print("  first tiles, cycles since entry (-: not recorded): producer 0-4 | warpgroup 0 5-10 | warpgroup 1 11-14")
    for t in tiles[:6]:
        ev = rows[t]
        cell = lambda i: str(ev[i] - base) if ev[i] else "-"
        print(f"    {t:3d}: " + " ".join(cell(i) for i in range(5)) + " | " + " ".join(cell(i) for i in range(5, 11))
              + " | " + " ".join(cell(i) for i in range(11, 15)))


if __name__ == "__main__":
    summarise_each_cta(summarise, sys.argv[1])

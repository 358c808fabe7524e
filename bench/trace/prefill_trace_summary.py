#!/usr/bin/env python3
"""prefill_trace_summary.py FILE: reads a sparse prefill kernel's trace (a -DDSV4_KERNEL_TRACE build
run with DSV4_KERNEL_TRACE=FILE; the events are listed in src/cuda/attention/sparse_prefill/trace.cuh)
and prints, per traced CTA, where a tile's period goes: the median cycles of each step over the
steady tiles (CTA tiles 4 to 249, across items), the hand-offs between the roles, and how often a
role waited at all. A CTA whose trace carries the pair schedule's mark is read by
prefill_pair_trace_summary.py, by pairs of tiles. clock64 is one SM's counter, so every difference
is taken within one CTA."""
import sys

import prefill_pair_trace_summary
from trace_file import med, print_first_tiles, print_steps, summarise_each_cta

(EMPTY_WAIT, EMPTY_DONE, GATHER_ISSUED, FULL_WAIT, FULL_DONE, S_DONE, PUBLISHED, OWN_PV_DONE, REMOTE_WAIT,
 REMOTE_SEEN, REMOTE_PV_DONE, EPILOGUE_START, O_STAGED, EPILOGUE_START_WG1, ROW_SUMS_EXCHANGED, Q_SEEN, FACTORS,
 O_STORES) = range(18)

# (label, from event, to event, the row offset of the second event)
STEPS = [
    ("producer: k_empty wait (+ O store)", EMPTY_WAIT, EMPTY_DONE, 0),
    ("producer: gather issue", EMPTY_DONE, GATHER_ISSUED, 0),
    ("gather issued -> owner past k_full", GATHER_ISSUED, FULL_DONE, 0),
    ("owner: k_full wait", FULL_WAIT, FULL_DONE, 0),
    ("owner: S", FULL_DONE, S_DONE, 0),
    ("owner: softmax + publish", S_DONE, PUBLISHED, 0),
    ("owner: publish -> own P.V done", PUBLISHED, OWN_PV_DONE, 0),
    ("other: p_ready wait", REMOTE_WAIT, REMOTE_SEEN, 0),
    ("publish -> other sees P", PUBLISHED, REMOTE_SEEN, 0),
    ("other: rescale + P.V", REMOTE_SEEN, REMOTE_PV_DONE, 0),
    ("other's P.V done -> next tile's S issued (other is its owner)", REMOTE_PV_DONE, FULL_DONE, 1),
    ("released (both P.V) -> producer on to tile g+2", None, EMPTY_DONE, 2),
    ("residency: gather issued -> released", GATHER_ISSUED, None, 0),
    ("period: owner past k_full, tile g -> g+1", FULL_DONE, FULL_DONE, 1),
    ("period: producer gather issued, g -> g+1", GATHER_ISSUED, GATHER_ISSUED, 1),
]


def released(ev):
    return max(ev[OWN_PV_DONE], ev[REMOTE_PV_DONE]) if ev[OWN_PV_DONE] and ev[REMOTE_PV_DONE] else 0


def value(ev, e):
    return released(ev) if e is None else ev[e]



PAIR_MARKER = 19  # trace.cuh's kTracePairMarker, in the once-per-CTA row


def summarise(slot, rows):
    once = rows.pop(max(rows), None)  # the once-per-CTA row: only the pair schedule's mark
    if once and once[PAIR_MARKER]:
        prefill_pair_trace_summary.summarise(slot, rows)
        return
    tiles = sorted(g for g, ev in rows.items() if any(ev))
    if not tiles:
        print(f"== CTA slot {slot}: no tile events")
        return
    steady = [g for g in tiles if 4 <= g < 250]
    print(f"== CTA slot {slot}: {len(tiles)} tiles traced, {len(steady)} steady (median cycles; waits: share > 50 cycles)")
    for label, a, b, off in STEPS:
        xs = []
        for g in steady:
            if g + off not in rows:
                continue
            va, vb = value(rows[g], a), value(rows[g + off], b)
            if va and vb:
                xs.append(vb - va)
        waited = ""
        if "wait" in label and xs:
            waited = f"   waited {sum(x > 50 for x in xs) / len(xs):4.0%}"
        print(f"  {label:62s} {med(xs)}{waited}")
    # The item boundary: the last tile g (its epilogue events) and the next item's first tile g + 1.
    recorded = set(tiles)
    ends = [g for g in steady if rows[g][EPILOGUE_START] and rows[g][O_STAGED] and g + 1 in recorded]
    print(f"  item boundary ({len(ends)} items), last tile g -> the next item's first tile g+1:")
    # (label, (row offset, event) it starts at, (row offset, event) it ends at)
    boundary = [
        ("last tile past k_full -> next item's tile 0 past k_full", (0, FULL_DONE), (1, FULL_DONE)),
        ("last tile published -> WG0's epilogue start", (0, PUBLISHED), (0, EPILOGUE_START)),
        ("WG0's epilogue start -> WG1's (negative: WG1 first)", (0, EPILOGUE_START), (0, EPILOGUE_START_WG1)),
        ("WG0: epilogue start -> past the row-sum exchange", (0, EPILOGUE_START), (0, ROW_SUMS_EXCHANGED)),
        ("WG0: row sums -> output factors", (0, ROW_SUMS_EXCHANGED), (0, FACTORS)),
        ("WG0: factors -> O's shared-memory stores issued", (0, FACTORS), (0, O_STORES)),
        ("WG0: stores issued -> past the fence and arrival", (0, O_STORES), (0, O_STAGED)),
        ("WG0: O staged -> past the next Q's wait", (0, O_STAGED), (1, Q_SEEN)),
        ("WG0: past the Q wait -> next tile 0's k_full wait", (1, Q_SEEN), (1, FULL_WAIT)),
        ("O staged -> producer on to tile g+2 (O stored)", (0, O_STAGED), (2, EMPTY_DONE)),
    ]
    print_steps(rows, ends, boundary, indent="    ", width=60, waits=False)
    print_first_tiles(rows, tiles, 18)


if __name__ == "__main__":
    summarise_each_cta(summarise, sys.argv[1])

#!/usr/bin/env python3
"""prefill_trace_summary.py FILE: reads a sparse prefill kernel's trace (a -DDSV4_KERNEL_TRACE build
run with DSV4_KERNEL_TRACE=FILE; the events are listed in src/cuda/attention/sparse_prefill/trace.cuh)
and prints, per traced CTA, where a tile's period goes: the median cycles of each step over the
steady tiles (CTA tiles 4 to 249, across items), the hand-offs between the roles, and how often a
role waited at all. clock64 is one SM's counter, so every difference is taken within one CTA."""
import statistics
import sys

(EMPTY_WAIT, EMPTY_DONE, GATHER_ISSUED, FULL_WAIT, FULL_DONE, S_DONE, PUBLISHED, OWN_PV_DONE, REMOTE_WAIT,
 REMOTE_SEEN, REMOTE_PV_DONE, EPILOGUE_START, O_STAGED) = range(13)

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


def med(xs):
    return f"{statistics.median(xs):8.0f}" if xs else "       -"


def summarise(slot, rows):
    rows.pop(max(rows), None)  # the once row: unused by the prefill
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
    epi = [rows[g][O_STAGED] - rows[g][EPILOGUE_START] for g in steady if rows[g][EPILOGUE_START] and rows[g][O_STAGED]]
    print(f"  {'epilogue (WG0: start -> O staged), per item':62s} {med(epi)}   ({len(epi)} items)")
    base = min(v for g in tiles for v in rows[g] if v)
    print("  first tiles, cycles since the first event (-: not recorded), events 0-12:")
    for g in tiles[:6]:
        ev = rows[g]
        print(f"    {g:3d}: " + " ".join(str(ev[i] - base) if ev[i] else "-" for i in range(13)))


def main():
    ctas = {}
    for line in open(sys.argv[1]):
        f = [int(x) for x in line.split()]
        ctas.setdefault(f[0], {})[f[1]] = f[2:]
    for slot in sorted(ctas):
        summarise(slot, ctas[slot])


if __name__ == "__main__":
    main()

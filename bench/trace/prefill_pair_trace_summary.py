"""The pair schedule's part of prefill_trace_summary.py (which reads the trace and calls
summarise() for a CTA whose trace carries the pair's mark; the events are listed in
src/cuda/attention/sparse_prefill/trace.cuh): where a pair of tiles' period goes, the median cycles
of each step of WG0 (the pair's first tile, buffer 0), of WG1 (the second, buffer 1) and of the
producer over the steady rows (CTA tiles 4 to 249, across items), and the item boundary."""
from trace_file import print_first_tiles, print_steps

(EMPTY_WAIT0, EMPTY_DONE0, ISSUED0, EMPTY_WAIT1, EMPTY_DONE1, ISSUED1, FULL_WAIT_FIRST, FULL_DONE_FIRST,
 FULL_DONE_SECOND, S_DONE, MAX_PUBLISHED, OTHER_MAX_SEEN, P_PUBLISHED, OWN_PV_DONE, REMOTE_P_SEEN,
 REMOTE_PV_DONE, EPILOGUE_START, O_STORED, Q_SEEN) = range(19)

# (label, (row offset, event) it starts at, (row offset, event) it ends at), from a WG0 row g
# (its tile in buffer 0; g + 1 is the pair's WG1 tile, g + 2 the next pair's WG0 tile).
WG0_STEPS = [
    ("WG0: k_full wait, first half (half 0)", (0, FULL_WAIT_FIRST), (0, FULL_DONE_FIRST)),
    ("WG0: first half -> second half in", (0, FULL_DONE_FIRST), (0, FULL_DONE_SECOND)),
    ("WG0: second half in -> S done", (0, FULL_DONE_SECOND), (0, S_DONE)),
    ("WG0: S done -> max published", (0, S_DONE), (0, MAX_PUBLISHED)),
    # The own product is issued after the max is published and completes after P0 is published
    # from rS (41885d7), unless WG1 moved the reference.
    ("WG0: max published -> WG1's max seen (own P.V issued; wait)", (0, MAX_PUBLISHED), (0, OTHER_MAX_SEEN)),
    ("WG0: WG1's max -> P0 published", (0, OTHER_MAX_SEEN), (0, P_PUBLISHED)),
    ("WG0: P0 published -> own P.V done", (0, P_PUBLISHED), (0, OWN_PV_DONE)),
    ("WG0: own P.V done -> P1 seen (wait)", (0, OWN_PV_DONE), (1, REMOTE_P_SEEN)),
    ("WG0: P1 seen -> remote P.V done (next S0's half 0 issued)", (1, REMOTE_P_SEEN), (1, REMOTE_PV_DONE)),
    ("WG0: remote P.V done -> next S0 done", (1, REMOTE_PV_DONE), (2, S_DONE)),
]
WG1_STEPS = [
    ("WG1: k_full wait, first half (half 1)", (1, FULL_WAIT_FIRST), (1, FULL_DONE_FIRST)),
    ("WG1: first half -> second half in", (1, FULL_DONE_FIRST), (1, FULL_DONE_SECOND)),
    ("WG1: second half in -> S done", (1, FULL_DONE_SECOND), (1, S_DONE)),
    ("WG1: S done -> WG0's max seen (wait)", (1, S_DONE), (1, OTHER_MAX_SEEN)),
    ("WG1: WG0's max -> its max published", (1, OTHER_MAX_SEEN), (1, MAX_PUBLISHED)),
    ("WG1: max published -> P1 published", (1, MAX_PUBLISHED), (1, P_PUBLISHED)),
    ("WG1: P1 published -> P0 seen (wait)", (1, P_PUBLISHED), (0, REMOTE_P_SEEN)),
    ("WG1: P1 published -> own P.V done", (1, P_PUBLISHED), (1, OWN_PV_DONE)),
    ("WG1: P0 seen -> remote P.V done", (0, REMOTE_P_SEEN), (0, REMOTE_PV_DONE)),
    ("WG1: remote P.V done -> next pair's S1 start", (0, REMOTE_PV_DONE), (3, FULL_WAIT_FIRST)),
]
PAIR_STEPS = [
    ("WG0 S done -> WG1 S done", (0, S_DONE), (1, S_DONE)),
    ("period: WG0 S done, pair -> next pair", (0, S_DONE), (2, S_DONE)),
    ("period: WG1 S done, pair -> next pair", (1, S_DONE), (3, S_DONE)),
]


def producer_steps():
    steps = []
    for row, who in ((0, "buffer 0"), (1, "buffer 1")):
        for h, (wait, done, issued) in enumerate(((EMPTY_WAIT0, EMPTY_DONE0, ISSUED0),
                                                   (EMPTY_WAIT1, EMPTY_DONE1, ISSUED1))):
            first = h == row  # the owner's first half: half 0 of buffer 0, half 1 of buffer 1
            landed = FULL_DONE_FIRST if first else FULL_DONE_SECOND
            steps += [
                (f"producer, {who} half {h}: k_empty wait", (row, wait), (row, done)),
                (f"producer, {who} half {h}: copies issued", (row, done), (row, issued)),
                (f"producer, {who} half {h}: issued -> owner past its k_full", (row, issued), (row, landed)),
            ]
    return steps


def is_wg0_row(ev):
    # WG0 publishes its max before it sees WG1's; WG1 sees WG0's before publishing its own.
    return ev[MAX_PUBLISHED] and ev[OTHER_MAX_SEEN] and ev[OTHER_MAX_SEEN] > ev[MAX_PUBLISHED]


def summarise(slot, rows):
    """rows: the CTA's tile rows (the once-per-CTA row already taken off)."""
    tiles = sorted(g for g, ev in rows.items() if any(ev))
    if not tiles:
        print(f"== CTA slot {slot}: no tile events")
        return
    # Pairs whose two tiles (g: WG0's, g + 1: WG1's) are both steady.
    pairs = [g for g in tiles if 4 <= g < 248 and is_wg0_row(rows[g]) and g + 1 in rows
             and rows[g + 1][S_DONE] and not is_wg0_row(rows[g + 1])]
    print(f"== CTA slot {slot}: {len(tiles)} tiles traced, {len(pairs)} steady whole pairs "
          "(median cycles; waits: share > 50 cycles)")
    print_steps(rows, pairs, PAIR_STEPS + WG0_STEPS + WG1_STEPS + producer_steps())
    recorded = set(tiles)
    ends = [g for g in tiles if 4 <= g < 249 and rows[g][EPILOGUE_START] and g + 1 in recorded]
    print(f"  item boundary ({len(ends)} items), last tile g -> the next item's first tile g+1:")
    boundary = [
        ("last tile's remote P.V done -> WG0's epilogue start", (0, REMOTE_PV_DONE), (0, EPILOGUE_START)),
        ("WG0: epilogue start -> O stored", (0, EPILOGUE_START), (0, O_STORED)),
        ("WG0: O stored -> past the next Q's wait", (0, O_STORED), (1, Q_SEEN)),
        ("WG0: past the Q wait -> next tile 0 past its first k_full", (1, Q_SEEN), (1, FULL_DONE_FIRST)),
        ("last tile's S done -> next item's first S done", (0, S_DONE), (1, S_DONE)),
    ]
    print_steps(rows, ends, boundary)
    print_first_tiles(rows, tiles, 19)

"""Reads a kernel trace dump (src/cuda/common/kernel_trace.cuh: one line per traced CTA slot and
row, "slot row e0 e1 …", 0 = not recorded) into {slot: {row: [events]}}, for the summaries beside
it (decode_trace_summary.py, prefill_trace_summary.py, prefill_pair_trace_summary.py)."""
import statistics


def med(xs):
    """The median of xs as an 8-wide column ("-" when empty)."""
    return f"{statistics.median(xs):8.0f}" if xs else "       -"


def read_trace(path):
    ctas = {}
    with open(path) as f:
        for line in f:
            fields = [int(x) for x in line.split()]
            ctas.setdefault(fields[0], {})[fields[1]] = fields[2:]
    return ctas


def summarise_each_cta(summarise, path):
    """Calls summarise(slot, rows) for each traced CTA slot of the dump at `path`, in slot order."""
    ctas = read_trace(path)
    for slot in sorted(ctas):
        summarise(slot, ctas[slot])


def print_steps(rows, starts, steps, indent="  ", width=66, waits=True):
    """One line per step (label, (row offset, event) it starts at, (row offset, event) it ends at):
    the median cycles between the two over the rows g in `starts` that recorded both, and for a
    step named a wait (with `waits`) the share of them longer than 50 cycles."""
    for label, (ra, ea), (rb, eb) in steps:
        xs = [rows[g + rb][eb] - rows[g + ra][ea] for g in starts
              if g + ra in rows and g + rb in rows and rows[g + ra][ea] and rows[g + rb][eb]]
        waited = ""
        if waits and "wait" in label and xs:
            waited = f"   waited {sum(x > 50 for x in xs) / len(xs):4.0%}"
        print(f"{indent}{label:{width}s} {med(xs)}{waited}")


def print_first_tiles(rows, tiles, num_events):
    """The first six traced tiles' events, in cycles since the earliest event of the CTA."""
    base = min(v for g in tiles for v in rows[g] if v)
    print(f"  first tiles, cycles since the first event (-: not recorded), events 0-{num_events - 1}:")
    for g in tiles[:6]:
        ev = rows[g]
        print(f"    {g:3d}: " + " ".join(str(ev[i] - base) if ev[i] else "-" for i in range(num_events)))

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

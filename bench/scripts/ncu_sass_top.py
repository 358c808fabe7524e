#!/usr/bin/env python3
"""ncu_sass_top.py FILE [N | --listing]: from `ncu --import R --page source --csv --print-source sass`,
per profiled kernel the N (default 40) SASS instructions with the most warp-stall samples, as shares
of that kernel's samples: where its warps wait (mbarrier spins, fences, loads) at a glance.

--listing prints every instruction instead, in address order: its offset in the kernel, warp-level
instructions executed, stall samples and the SASS. A role's loop (say the decode producer's, the
stretch holding its F2FP conversions and bulk copies) can then be read off whole, with where its
issue slots and its waits go, which the top-N view scatters."""
import csv
import io
import sys


def kernel_tables(text):
    """The CSV tables of the export, one per kernel: (kernel name, rows). A table is named by the
    last "Kernel Name" line before its header (not the one that follows it, the next kernel's)."""
    name, table_name, lines, tables = None, None, [], []
    for line in text.splitlines():
        if line.startswith('"Kernel Name"'):
            name = next(csv.reader([line]))[1] if "," in line else line
            continue
        if line.startswith('"Address"'):
            if lines:
                tables.append((table_name, lines))
            lines, table_name = [line], name
        elif lines:
            lines.append(line)
    if lines:
        tables.append((table_name, lines))
    return [(n, list(csv.reader(io.StringIO("\n".join(t))))) for n, t in tables]


def main():
    listing = len(sys.argv) > 2 and sys.argv[2] == "--listing"
    top = int(sys.argv[2]) if len(sys.argv) > 2 and not listing else 40
    for name, rows in kernel_tables(open(sys.argv[1], errors="replace").read()):
        header = rows[0]
        try:
            samples = next(i for i, h in enumerate(header) if h.startswith("Warp Stall Sampling (All"))
            source = header.index("Source")
        except (StopIteration, ValueError):
            print(f"== {name}: no stall-sample columns")
            continue
        if listing:
            print_listing(name, header, rows[1:], samples, source)
            continue
        counted = []
        for r in rows[1:]:
            try:
                counted.append((float(r[samples] or 0), r[source].strip()))
            except (ValueError, IndexError):
                pass
        total = sum(c for c, _ in counted) or 1.0
        print(f"== {(name or '?')[:120]}: {total:.0f} stall samples")
        for c, src in sorted(counted, reverse=True)[:top]:
            print(f"  {100 * c / total:5.1f}%  {src[:110]}")


def print_listing(name, header, rows, samples, source):
    """Every instruction of one kernel in address order: offset, executed, samples, SASS."""
    address = header.index("Address") if "Address" in header else None
    executed = next((i for i, h in enumerate(header) if h == "Instructions Executed"), None)
    print(f"== {(name or '?')[:120]}")
    print("  offset  executed  samples  sass")
    base = None
    for r in rows:
        try:
            at = int(r[address], 16) if address is not None else None
        except (ValueError, IndexError):
            at = None
        if at is not None and base is None:
            base = at
        offset = f"{at - base:6x}" if at is not None else "     ?"
        count = r[executed].strip() if executed is not None and executed < len(r) else ""
        stalls = r[samples].strip() if samples < len(r) else ""
        print(f"  {offset}  {count:>8}  {stalls:>7}  {r[source].strip()[:110]}")


if __name__ == "__main__":
    main()

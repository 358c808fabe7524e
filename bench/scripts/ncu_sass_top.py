#!/usr/bin/env python3
"""ncu_sass_top.py FILE [N]: from `ncu --import R --page source --csv --print-source sass`, per
profiled kernel the N (default 40) SASS instructions with the most warp-stall samples, as shares of
that kernel's samples: where its warps wait (mbarrier spins, fences, loads) at a glance."""
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
    top = int(sys.argv[2]) if len(sys.argv) > 2 else 40
    for name, rows in kernel_tables(open(sys.argv[1], errors="replace").read()):
        header = rows[0]
        try:
            samples = next(i for i, h in enumerate(header) if h.startswith("Warp Stall Sampling (All"))
            source = header.index("Source")
        except (StopIteration, ValueError):
            print(f"== {name}: no stall-sample columns")
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


if __name__ == "__main__":
    main()

#!/usr/bin/env python3
"""Lines up a `dsv4 bench --json` sweep with an nvidia-smi clock log sampled beside it.

The log is `nvidia-smi --query-gpu=timestamp,clocks.sm,clocks.mem,power.draw,temperature.gpu,
clocks_event_reasons.active --format=csv,noheader -lms 20`, gzipped, with a first line
`unix_ms_at_sampler_start <unix ms> local <YYYY/MM/DD> <HH:MM:SS.mmm>` that ties nvidia-smi's local
timestamps to the Unix milliseconds of the JSON's run_from/run_to_unix_ms.

usage: clocks_per_case.py SWEEP.json CLOCKS.csv.gz
prints per case: TFLOP/s, the SM clock range and the peak (1 s averaged) power sampled while it
ran, and the clock-event flags seen (0x04: software power cap).
"""
import datetime
import gzip
import json
import sys


def main(sweep_path, clocks_path):
    lines = gzip.open(clocks_path, "rt").read().splitlines()
    meta = lines[0].split()
    base_unix = int(meta[1])
    base_local = datetime.datetime.strptime(meta[3] + " " + meta[4], "%Y/%m/%d %H:%M:%S.%f")
    samples = []
    for line in lines[1:]:
        f = [x.strip() for x in line.split(",")]
        try:
            t = datetime.datetime.strptime(f[0], "%Y/%m/%d %H:%M:%S.%f")
        except (ValueError, IndexError):
            continue
        unix_ms = base_unix + (t - base_local).total_seconds() * 1000
        samples.append((unix_ms, int(f[1].split()[0]), float(f[3].split()[0]), f[5][-2:]))
    for r in json.load(open(sweep_path))["results"]:
        a, b = r["run_from_unix_ms"], r["run_to_unix_ms"]
        inside = [s for s in samples if a <= s[0] <= b] or [min(samples, key=lambda s: abs(s[0] - a))]
        print(f"{r['name'][:50]:50s} {r['tflops']:6.1f} TFLOP/s  SM {min(s[1] for s in inside)}-"
              f"{max(s[1] for s in inside)} MHz  {max(s[2] for s in inside):4.0f} W  "
              f"flags {','.join(sorted(set(s[3] for s in inside)))}")


if __name__ == "__main__":
    if len(sys.argv) != 3:
        sys.exit(__doc__)
    main(sys.argv[1], sys.argv[2])

"""The device-reading tools run on CPU data: bench/trace/decode_trace_summary.py (a decode kernel's
event trace, src/cuda/common/kernel_trace.cuh) reports each role's step medians and hand-offs, and
bench/scripts/ncu_sass_top.py names each kernel's stall table after its own kernel."""
import os
import re
import subprocess
import sys

ROOT = os.path.join(os.path.dirname(__file__), "..", "..")
SUMMARY = os.path.join(ROOT, "bench", "trace", "decode_trace_summary.py")
SASS_TOP = os.path.join(ROOT, "bench", "scripts", "ncu_sass_top.py")

# Per tile: event → cycles after the tile's start (period 8000; the producer waits 300 on `empty`
# from tile 2 on). kernel_trace.cuh's layout: "slot row e0 … e15", row 255 the once-per-CTA row.
TILE = {0: 0, 1: 300, 2: 2800, 3: 2900, 4: 3000, 5: 2000, 6: 3100, 7: 3900, 8: 4000, 9: 4700, 10: 5700,
        11: 2100, 12: 3150, 13: 4750, 14: 5900}


def write_trace(path, tiles=18, period=8000):
    lines = []
    for slot in range(2):
        for row in range(256):
            ev = [0] * 16
            if row < tiles:
                start = 1000 + row * period
                for e, dt in TILE.items():
                    ev[e] = start + (dt if e != 1 or row >= 2 else 0)
            if row == 255:
                end = 1000 + tiles * period
                ev[:8] = [10, 500, 2500, end, end + 3000, 600, end, end + 3100]
            lines.append(f"{slot} {row} " + " ".join(map(str, ev)))
    path.write_text("\n".join(lines) + "\n")


def step(out, name):
    m = re.search(rf"{re.escape(name)}\s+(-?\d+)", out)
    assert m, f"{name!r} missing from:\n{out}"
    return int(m.group(1))


def test_decode_trace_summary_reports_steps_and_handoffs(tmp_path):
    trace = tmp_path / "trace.txt"
    write_trace(trace)
    out = subprocess.run([sys.executable, SUMMARY, str(trace)], check=True, capture_output=True, text=True).stdout
    assert out.count("== CTA slot") == 2 and "18 tiles traced, 15 steady" in out
    assert step(out, "producer     period") == 8000
    assert step(out, "empty wait") == 300          # tiles ≥ 2 only: the first two never wait
    assert step(out, "convert + store") == 2500
    assert step(out, "S") == 800
    assert step(out, "p_ready wait") == 1600
    # warpgroup 0 sees the stage 200 cycles after the arrive; the later release of tile t (5900)
    # to the producer past tile t+2's wait (2 · 8000 + 300): 10400.
    assert step(out, "arrive → stage seen by warpgroup 0") == 200
    assert step(out, "producer past tile t+2's wait") == 10400
    assert step(out, "barrier → Q loaded") == 2000


def test_ncu_sass_top_names_each_table_by_its_own_kernel(tmp_path):
    csv = tmp_path / "sass.csv"
    csv.write_text('"Kernel Name","peer_kernel"\n'
                   '"Address","Source","Warp Stall Sampling (All Samples)"\n"0x1","UMOV","30"\n"0x2","BRA","10"\n'
                   '"Kernel Name","our_kernel"\n'
                   '"Address","Source","Warp Stall Sampling (All Samples)"\n"0x1","BRA","7"\n')
    out = subprocess.run([sys.executable, SASS_TOP, str(csv), "5"], check=True, capture_output=True, text=True).stdout
    assert "== peer_kernel: 40 stall samples" in out and "75.0%  UMOV" in out
    assert "== our_kernel: 7 stall samples" in out

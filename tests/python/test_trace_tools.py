"""The device-reading tools run on CPU data: bench/trace/decode_trace_summary.py and
prefill_trace_summary.py (the kernels' event traces, src/cuda/common/kernel_trace.cuh) report each
role's step medians, hand-offs and, for the prefill, the item boundary;
bench/scripts/ncu_sass_top.py names each kernel's stall table after its own kernel; and
bench/scripts/sass_stats.py names the loads a hot loop reads in their own iteration."""
import os
import re
import subprocess
import sys

ROOT = os.path.join(os.path.dirname(__file__), "..", "..")
SUMMARY = os.path.join(ROOT, "bench", "trace", "decode_trace_summary.py")
PREFILL_SUMMARY = os.path.join(ROOT, "bench", "trace", "prefill_trace_summary.py")
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


# The prefill's rows are CTA tiles g (src/cuda/attention/sparse_prefill/trace.cuh): events at these
# cycles after the tile's gather issue starts, a period of 3000, items of 8 tiles whose last tile
# also carries the epilogue (11-14, 16, 17, 12) and whose next tile 0 carries the Q wait (15).
PREFILL_TILE = {0: 0, 1: 1500, 2: 2300, 3: 4600, 4: 4720, 5: 6000, 6: 6650, 7: 7500, 8: 4000, 9: 6700,
                10: 7800}


def write_prefill_trace(path, tiles=40, period=3000, boundary=2500):
    lines = []
    for slot in range(2):
        start = 1000
        for row in range(256):
            ev = [0] * 20
            if row < tiles:
                for e, dt in PREFILL_TILE.items():
                    ev[e] = start + dt
                if row % 8 == 7:  # an item's last tile: the epilogue, then the next item is late
                    epi = start + 7900
                    ev[11], ev[13], ev[14], ev[16], ev[17], ev[12] = epi, epi - 400, epi + 250, epi + 600, epi + 1400, epi + 1600
                if row % 8 == 0 and row > 0:
                    ev[15] = ev[3] - 200  # Q seen 200 cycles before the k_full wait
                start += period + (boundary if row % 8 == 7 else 0)
            lines.append(f"{slot} {row} " + " ".join(map(str, ev)))
    path.write_text("\n".join(lines) + "\n")


def test_prefill_trace_summary_reports_steps_and_the_item_boundary(tmp_path):
    trace = tmp_path / "trace.txt"
    write_prefill_trace(trace)
    out = subprocess.run([sys.executable, PREFILL_SUMMARY, str(trace)], check=True, capture_output=True,
                         text=True).stdout
    assert out.count("== CTA slot") == 2 and "40 tiles traced, 36 steady" in out
    assert step(out, "producer: k_empty wait (+ O store)") == 1500
    assert step(out, "owner: S") == 1280
    assert step(out, "owner: softmax + publish") == 650
    assert step(out, "publish -> other sees P") == 50
    assert step(out, "residency: gather issued -> released") == 5500  # 7800 (both P·V done) - 2300
    assert step(out, "period: owner past k_full, tile g -> g+1") == 3000  # the median: boundaries are 1 in 8
    # Items end at tiles 7, 15, …; the steady ones (4 ≤ g < 250 with a next tile): 7, 15, 23, 31.
    assert "item boundary (4 items)" in out
    assert step(out, "last tile past k_full -> next item's tile 0 past k_full") == 5500
    assert step(out, "WG0's epilogue start -> WG1's (negative: WG1 first)") == -400
    assert step(out, "WG0: row sums -> output factors") == 350
    assert step(out, "WG0: factors -> O's shared-memory stores issued") == 800
    assert step(out, "WG0: stores issued -> past the fence and arrival") == 200


def test_ncu_sass_top_names_each_table_by_its_own_kernel(tmp_path):
    csv = tmp_path / "sass.csv"
    csv.write_text('"Kernel Name","peer_kernel"\n'
                   '"Address","Source","Warp Stall Sampling (All Samples)"\n"0x1","UMOV","30"\n"0x2","BRA","10"\n'
                   '"Kernel Name","our_kernel"\n'
                   '"Address","Source","Warp Stall Sampling (All Samples)"\n"0x1","BRA","7"\n')
    out = subprocess.run([sys.executable, SASS_TOP, str(csv), "5"], check=True, capture_output=True, text=True).stdout
    assert "== peer_kernel: 40 stall samples" in out and "75.0%  UMOV" in out
    assert "== our_kernel: 7 stall samples" in out


def test_sass_stats_names_loads_read_in_their_own_iteration():
    """sass_stats.early_reads: a load whose value a later instruction of the same loop iteration
    reads is listed with its distance; a register overwritten before any read, a read by an
    mbarrier operation, and a register inside an address next to a vector operand are not reads
    of the load; a .WIDE instruction writes and adds register pairs."""
    import importlib.util
    spec = importlib.util.spec_from_file_location("sass_stats", os.path.join(ROOT, "bench", "scripts", "sass_stats.py"))
    sass_stats = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(sass_stats)
    loop = [(16 * n, ins) for n, ins in enumerate([
        "@P0 LDG.E.EL.LTC256B.128.CONSTANT R8, desc[UR4][R2.64]",   # 0: R8..R11, first read by the STS at 2
        "LDG.E.CONSTANT R20, desc[UR4][R6.64]",                    # 1: R20 overwritten at 3, never read
        "STS.128 [R9+UR6+0x100], R40",                              # 2: reads R9 (its address) and R40..R43
        "IMAD.MOV.U32 R20, RZ, RZ, 0x4",
        "MOV R30, R10",
        "LDG.E.64.CONSTANT R12, desc[UR4][R2.64+0x40]",            # 5: read only by the SYNCS below
        "SYNCS.PHASECHK.TRANS64.TRYWAIT P1, [UR8+0x10], R13",
        "BRA 0x0",
    ])]
    assert sass_stats.early_reads(loop) == [(0, 2)]
    # The STS reads R9 (an address register from the first load): a read at distance 2. Without
    # it, the first load's first read is the MOV at distance 4.
    loop[2] = (32, "STS.128 [R6+UR6+0x100], R40")
    assert sass_stats.early_reads(loop) == [(0, 4)]
    # A .WIDE instruction writes a register pair: the load into R23 is overwritten by the IMAD's
    # high half before the MOV reads R23, so nothing reads the load. Its 64-bit addend is a pair
    # too: an IMAD.WIDE adding R22:R23 reads the load.
    wide = [(16 * n, ins) for n, ins in enumerate([
        "LDG.E.CONSTANT R23, desc[UR4][R6.64]",
        "IMAD.WIDE.U32 R22, R3, 0x4, R4",
        "MOV R30, R23",
        "BRA 0x0",
    ])]
    assert sass_stats.early_reads(wide) == []
    wide[1] = (16, "IMAD.WIDE.U32 R24, R3, 0x4, R22")
    assert sass_stats.early_reads(wide) == [(0, 1)]

#!/usr/bin/env python3
"""Draws a `dsv4 bench layer --json` report (tools/dsv4/layer_bench_report.h) as one PNG.

    python3 bench/plot_layer.py REPORT.json OUT.png [--split]

Top: every case's GPU and wall time as multiples of its floor (log scale; 1 = at the floor).
Then one row per case:
  left   each op's GPU time (bar) against its floor (black tick), log µs, with the ratio;
  right  a roofline: each op with FLOPs as a point (arithmetic intensity in FLOP/byte against
         achieved TFLOP/s), under the measured ceilings (copy bandwidth slope, FP8 and bf16 roofs).
Ops without FLOPs (norms, RoPE, quantization, index building, gathers) are memory-bound by
construction; their bars carry the achieved GB/s. Ops the cost model does not know are drawn
grey and marked UNMODELED. --split also writes OUT-<model>-<kind>.png per layer.

`dsv4 bench layer --plot FILE.png` runs this script; where matplotlib is missing (the GPU
machine has no registry access) run it afterwards on the JSON.
"""
import argparse
import json
import sys

import matplotlib

matplotlib.use("Agg")
import matplotlib.patches  # noqa: E402
import matplotlib.pyplot as plt  # noqa: E402

COLORS = {"fp8": "#d62728", "bf16": "#ff7f0e", "memory": "#1f77b4", None: "#9e9e9e"}


def case_label(c):
    return f"{c['model']} L{c['layer']} {c['kind']} {c['case']}"


def draw_summary(ax, cases):
    labels = [case_label(c) for c in cases]
    y = range(len(cases))
    gpu = [c["gpu_us"] / c["floor_us"] if c["floor_us"] > 0 else float("nan") for c in cases]
    wall = [c["wall_us"] / c["floor_us"] if c["floor_us"] > 0 else float("nan") for c in cases]
    ax.barh([i - 0.2 for i in y], wall, height=0.4, color="#bdbdbd", label="wall / floor")
    ax.barh([i + 0.2 for i in y], gpu, height=0.4, color="#2ca02c", label="GPU / floor")
    for i, c in enumerate(cases):
        note = f"  floor {c['floor_us']:.0f} µs, GPU {c['gpu_us']:.0f} µs, wall {c['wall_us']:.0f} µs ({c['wall_mode']})"
        if not c.get("floor_complete", True):
            note += "  [floor incomplete: " + ", ".join(c.get("unmodeled_ops", [])) + "]"
        ax.text(max(wall[i], gpu[i]) if wall[i] == wall[i] else 1, i, note, va="center", fontsize=7)
    ax.axvline(1.0, color="black", lw=1)
    ax.set_xscale("log")
    ax.set_yticks(list(y))
    ax.set_yticklabels(labels, fontsize=7)
    ax.invert_yaxis()
    ax.set_xlabel("time / layer floor (1 = at the floor)")
    ax.legend(loc="lower right", fontsize=8)
    ax.grid(axis="x", which="both", alpha=0.3)


def draw_ops(ax, case, ceilings):
    ops = case["ops"]
    names = [o["name"] for o in ops]
    y = list(range(len(ops)))
    colors = [COLORS[o["bound"]] if o["modeled"] else COLORS[None] for o in ops]
    gpu = [max(o["gpu_us"], 1e-3) for o in ops]
    ax.barh(y, gpu, color=colors, height=0.7)
    for i, o in enumerate(ops):
        if not o["modeled"]:
            ax.text(gpu[i], i, "  UNMODELED", va="center", fontsize=6, color="black")
            continue
        floor = o["floor_us"]
        ax.plot([floor, floor], [i - 0.45, i + 0.45], color="black", lw=1.5)
        text = f"  {o['gpu_us'] / floor:.1f}x" if floor > 0 else ""
        if o["flop"] == 0 and o["gpu_us"] > 0:
            text += f" {o['bytes'] / (o['gpu_us'] * 1e-6) / 1e9:.0f} GB/s"
        ax.text(max(gpu[i], floor), i, text, va="center", fontsize=6)
    ax.set_xscale("log")
    ax.set_yticks(y)
    ax.set_yticklabels(names, fontsize=7)
    ax.invert_yaxis()
    ax.set_xlabel("µs (bar: GPU time, tick: floor)", fontsize=7)
    ax.tick_params(axis="x", labelsize=7)
    ax.grid(axis="x", which="both", alpha=0.3)
    floor = case["floor_us"]
    ax.set_title(
        f"{case_label(case)}: {case['requests']} req x {case['tokens'] // max(case['requests'], 1)} tok @ ctx "
        f"{case['context']} — GPU {case['gpu_us']:.0f} µs = {case['gpu_us'] / floor if floor else float('nan'):.2f}x "
        f"floor {floor:.0f} µs, wall {case['wall_us']:.0f} µs",
        fontsize=8, loc="left")


def draw_roofline(ax, case, ceilings):
    bw = ceilings["copy_gbps"] * 1e9
    roofs = [("FP8", ceilings["fp8_tflops"], COLORS["fp8"]), ("bf16", ceilings["bf16_tflops"], COLORS["bf16"])]
    points = [o for o in case["ops"] if o["modeled"] and o["flop"] > 0 and o["bytes"] > 0 and o["gpu_us"] > 0]
    intens = [o["flop"] / o["bytes"] for o in points]
    lo = min(intens + [1.0]) / 3
    hi = max(intens + [2 * max(r[1] for r in roofs) * 1e12 / bw]) * 3
    xs = [lo, hi]
    ax.plot(xs, [x * bw / 1e12 for x in xs], color=COLORS["memory"], lw=1, label=f"copy {bw / 1e9:.4g} GB/s")
    for name, tf, color in roofs:
        ax.axhline(tf, color=color, lw=1, ls="--", label=f"{name} {tf:.3g} TFLOP/s")
    for o, x in zip(points, intens):
        achieved = o["flop"] / (o["gpu_us"] * 1e-6) / 1e12
        ax.plot([x], [achieved], "o", ms=4, color=COLORS[o["bound"]])
        ax.annotate(o["name"], (x, achieved), fontsize=6, xytext=(3, 2), textcoords="offset points")
    ax.set_xscale("log")
    ax.set_yscale("log")
    ax.set_xlim(lo, hi)
    top = max(r[1] for r in roofs) * 2
    ax.set_ylim(top / 1e5, top)
    ax.set_xlabel("FLOP / byte", fontsize=7)
    ax.set_ylabel("TFLOP/s", fontsize=7)
    ax.tick_params(labelsize=7)
    ax.grid(which="both", alpha=0.2)
    ax.legend(fontsize=6, loc="lower right")


def draw(report, cases, out):
    ceilings = report["ceilings"]
    row_h = [max(1.6, 0.19 * len(c["ops"]) + 0.6) for c in cases]
    summary_h = max(2.0, 0.22 * len(cases) + 0.8)
    height = summary_h + sum(row_h) + 0.8
    fig = plt.figure(figsize=(17, height))
    # Margins in inches, not fractions: the figure's height grows with the number of cases.
    grid = fig.add_gridspec(len(cases) + 1, 2, height_ratios=[summary_h] + row_h, width_ratios=[2.2, 1],
                            hspace=0.55, wspace=0.25, top=1 - 0.5 / height, bottom=0.4 / height)
    draw_summary(fig.add_subplot(grid[0, :]), cases)
    for i, c in enumerate(cases):
        ax = fig.add_subplot(grid[i + 1, 0])
        draw_ops(ax, c, ceilings)
        if i == 0:
            handles = [matplotlib.patches.Patch(color=COLORS[k], label=label) for k, label in
                       (("fp8", "FP8-tensor-bound"), ("bf16", "bf16-tensor-bound"), ("memory", "memory-bound"),
                        (None, "unmodeled"))]
            ax.legend(handles=handles, fontsize=6, loc="lower right")
        draw_roofline(fig.add_subplot(grid[i + 1, 1]), c, ceilings)
    fig.suptitle(
        f"dsv4 bench layer — {report['device']}, commit {report['commit']}, {report['date']} — ceilings "
        f"FP8 {ceilings['fp8_tflops']:.3g} / bf16 {ceilings['bf16_tflops']:.3g} TFLOP/s, copy "
        f"{ceilings['copy_gbps']:.4g} GB/s", fontsize=10, y=1 - 0.15 / height)
    fig.savefig(out, dpi=70, bbox_inches="tight")
    plt.close(fig)


def main(argv):
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("report", help="JSON written by `dsv4 bench layer --json`")
    p.add_argument("out", help="PNG to write")
    p.add_argument("--split", action="store_true", help="also one PNG per model and layer kind")
    args = p.parse_args(argv)
    with open(args.report) as f:
        report = json.load(f)
    cases = report["cases"]
    if not cases:
        sys.exit(f"{args.report}: no cases to draw")
    draw(report, cases, args.out)
    if args.split:
        stem = args.out[:-4] if args.out.endswith(".png") else args.out
        for key in dict.fromkeys((c["model"], c["kind"]) for c in cases):
            draw(report, [c for c in cases if (c["model"], c["kind"]) == key], f"{stem}-{key[0]}-{key[1]}.png")


if __name__ == "__main__":
    main(sys.argv[1:])

#!/usr/bin/env python3
"""prefill_shapes_side_by_side.py [--schedules auto,serial,pair] [--shapes D:H:TOPK:S_KV[:len],...]
[--json PATH]: FlashMLA's sparse
prefill and ours side by side on shapes its own table lacks, with FlashMLA's input generator and
side_by_side.py's timing (L2 flushed, CUDA events, median of 10): V3.2 (d 576, top-k 2048) at H 64,
the head count a V3.2 rank serves at tensor parallelism 2 (and, padded to 64, at 4 and 8), beside
V3.2's H 128 and V4-Flash's H 64 for reference. With bench/experiments/prefill-schedule-env.patch
applied, DSV4_PREFILL_SCHEDULE forces our schedule for each pass ("auto" leaves it unset): does the
pair schedule beat the serial one at H 64 when an item has many tiles (32 here, 8 in V4-Flash)?
--shapes replaces the list below (d_qk:h_q:topk:s_kv, ":len" for FlashMLA's random topk_length).

Needs what side_by_side.py needs: the measurement-only FlashMLA build and its tests/ on
PYTHONPATH, dsv4attn, and .peers/flashmla (for side_by_side itself).
"""
import argparse
import json
import os
import sys
import time

import torch
from lib import TestParam  # FlashMLA's tests/lib.py

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "..", ".peers", "flashmla"))
import side_by_side  # noqa: E402

SHAPES = "576:64:2048:8192,576:64:2048:65536,576:128:2048:8192,512:64:512:8192"


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--schedules", default="auto,serial,pair")
    ap.add_argument("--shapes", default=SHAPES)
    ap.add_argument("--json", default="prefill_shapes_side_by_side.json")
    a = ap.parse_args()
    shapes = []
    for spec in a.shapes.split(","):
        f = spec.split(":")
        shapes.append((int(f[0]), int(f[1]), int(f[2]), int(f[3]), len(f) > 4 and f[4] == "len"))
    torch.set_default_dtype(torch.bfloat16)
    torch.set_default_device("cuda:0")
    rows = []
    for schedule in a.schedules.split(","):
        if schedule == "auto":
            os.environ.pop("DSV4_PREFILL_SCHEDULE", None)
        else:
            os.environ["DSV4_PREFILL_SCHEDULE"] = schedule
        for d_qk, h_q, topk, s_kv, topk_len in shapes:
            time.sleep(1.0)  # idle between cases, as dsv4 bench does (the power cap)
            row = side_by_side.prefill_case(TestParam(4096, s_kv, topk, h_q=h_q, d_qk=d_qk, have_attn_sink=True,
                                                      have_topk_length=topk_len),
                                            perf=True, check=False)
            row["schedule"] = schedule
            rows.append(row)
            fm, ours = row.get("flashmla", {}), row.get("dsv4", {})
            ratio = fm["us"] / ours["us"] if fm.get("us") and ours.get("us") else float("nan")
            print(f"{schedule:6} d{d_qk} H{h_q} topk {topk}{' len' if topk_len else ''} s_kv {s_kv}: FlashMLA {fm.get('us', float('nan')):8.1f} us, "
                  f"ours {ours.get('us', float('nan')):8.1f} us, FlashMLA / ours {ratio:.3f} {ours.get('error', '')}",
                  flush=True)
            json.dump(rows, open(a.json, "w"), indent=1)


if __name__ == "__main__":
    main()

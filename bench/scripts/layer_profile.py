"""Per-kernel GPU time of one V4 layer step (torch profiler): a decode step of R x 1 at context C
and a prefill step, for the given layer, printed as a table sorted by time. Development aid."""
import argparse

import torch
from torch.profiler import ProfilerActivity, profile

import dsv4attn
from dsv4attn import Attention, BatchDescription


def print_host_side(prof):
    """The decode step's CUDA API calls on the host and the span of its kernels, in microseconds from
    the first API call: where the host's half of a step goes."""
    import json
    import os
    import tempfile

    with tempfile.TemporaryDirectory() as d:
        path = os.path.join(d, "trace.json")
        prof.export_chrome_trace(path)
        with open(path) as f:
            events = [e for e in json.load(f)["traceEvents"] if e.get("ph") == "X"]
    api = sorted((e for e in events if e.get("cat") in ("cuda_runtime", "cuda_driver")), key=lambda e: e["ts"])
    gpu = [e for e in events if e.get("cat") in ("kernel", "gpu_memcpy", "gpu_memset")]
    if not api:
        print("no CUDA API events in the trace")
        return
    t0 = api[0]["ts"]
    print(f"== host side of the decode step ({len(api)} CUDA API calls, {len(gpu)} GPU activities)")
    for e in api:
        if e["name"] in ("cudaStreamIsCapturing", "cudaGetDevice", "cudaGetLastError"):
            continue
        print(f"{e['ts'] - t0:9.1f} us  {e['dur']:7.1f} us  {e['name']}")
    if gpu:
        first = min(e["ts"] for e in gpu)
        last = max(e["ts"] + e["dur"] for e in gpu)
        print(f"GPU: first activity at {first - t0:.1f} us, last ends at {last - t0:.1f} us "
              f"({last - first:.1f} us on the GPU)")


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--model", default="v4-flash")
    ap.add_argument("--layer", type=int, default=2)
    ap.add_argument("--requests", type=int, default=128)
    ap.add_argument("--context", type=int, default=4096)
    ap.add_argument("--graphs", type=int, default=0)
    ap.add_argument("--trace", help="also write the decode step's timeline (Chrome trace JSON) here")
    ap.add_argument("--host", action="store_true",
                    help="also print the decode step's host side: each CUDA runtime / driver call with its "
                         "start (from the forward's start) and duration, and when the GPU began and ended")
    args = ap.parse_args()
    cfg = dsv4attn.ModelConfig.builtin(args.model)
    R, ctx = args.requests, args.context
    a = Attention(cfg, args.layer, seed=1, device="cuda", cuda_graphs=bool(args.graphs),
                  swa_blocks=R * 8 + 64, compressed_blocks=R * (ctx // 64 + 4) + 64,
                  state_blocks=R * 8 + 64)
    ids = list(range(R))
    chunk = 128
    xb = torch.randn(R * chunk, cfg.dim, device="cuda").to(torch.bfloat16)
    done = 0
    prefill_prof = None
    while done < ctx - 8:
        n = min(chunk, ctx - 8 - done)
        step = BatchDescription(ids, [done] * R, [n] * R)
        if done == chunk:  # the second 128-token step (warm)
            torch.cuda.synchronize()
            with profile(activities=[ProfilerActivity.CUDA]) as prefill_prof:
                a.forward(step, xb[: R * n])
                torch.cuda.synchronize()
        else:
            a.forward(step, xb[: R * n])
        done += n
    x1 = torch.randn(R, cfg.dim, device="cuda").to(torch.bfloat16)
    for _ in range(3):
        a.forward(BatchDescription(ids, [done] * R, [1] * R), x1)
        done += 1
    torch.cuda.synchronize()
    acts = [ProfilerActivity.CUDA] + ([ProfilerActivity.CPU] if args.host else [])
    with profile(activities=acts) as decode_prof:
        a.forward(BatchDescription(ids, [done] * R, [1] * R), x1)
        torch.cuda.synchronize()
    if args.host:
        print_host_side(decode_prof)
    if args.trace:
        decode_prof.export_chrome_trace(args.trace)
    for name, prof in (("prefill R x 128 at context 128", prefill_prof), (f"decode R x 1 at {done}", decode_prof)):
        print(f"== {cfg.name} layer {args.layer} ({a.kind}) R={R}: {name}")
        rows = [(e.device_time_total, e.count, e.key) for e in prof.key_averages() if e.device_time_total > 0]
        total = sum(r[0] for r in rows)
        for t, n, key in sorted(rows, reverse=True)[:25]:
            print(f"{t:10.1f} us {n:4d}x  {key[:90]}")
        print(f"{total:10.1f} us total")


if __name__ == "__main__":
    main()

"""Quick GPU timing of one V4 layer step through the Python Attention (device x, torch's stream):
prefill of 16384 new tokens (128 x 128 from context 0) and decode of 128 x 1 at context 4096, for
each layer kind, with and without the layer's decode CUDA graphs. Wall time (host clock around the
call, synchronized) and GPU time (CUDA events), median of N. Used until `dsv4 bench layer` covers
it; prints one line per case."""
import argparse
import statistics
import time

import torch

import dsv4attn
from dsv4attn import Attention, BatchDescription


def timed(fn, n):
    walls, gpus = [], []
    for _ in range(n):
        torch.cuda.synchronize()
        s, e = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        t0 = time.perf_counter()
        s.record()
        fn()
        e.record()
        torch.cuda.synchronize()
        walls.append((time.perf_counter() - t0) * 1e6)
        gpus.append(s.elapsed_time(e) * 1e3)
    return statistics.median(walls), statistics.median(gpus)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--model", default="v4-flash")
    ap.add_argument("--layers", default="0,2,3")
    ap.add_argument("--requests", type=int, default=128)
    ap.add_argument("--context", type=int, default=4096)
    ap.add_argument("--n", type=int, default=20)
    args = ap.parse_args()
    cfg = dsv4attn.ModelConfig.builtin(args.model)
    R, ctx = args.requests, args.context
    for layer in [int(i) for i in args.layers.split(",")]:
        for graphs in (False, True):
            a = Attention(cfg, layer, seed=1, device="cuda", cuda_graphs=graphs,
                          swa_blocks=R * 8 + 64, compressed_blocks=R * (ctx // 64 + 4) + 64,
                          state_blocks=R * 8 + 64)
            # Prefill 128 tokens per request (timed), then grow the context to ctx (untimed).
            chunk = 128
            ids = list(range(R))
            xb = torch.randn(R * chunk, cfg.dim, device="cuda").to(torch.bfloat16)
            step = BatchDescription(ids, [0] * R, [chunk] * R)
            torch.cuda.synchronize()
            s, e = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            t0 = time.perf_counter()
            s.record()
            a.forward(step, xb)
            e.record()
            torch.cuda.synchronize()
            pre_wall, pre_gpu = (time.perf_counter() - t0) * 1e6, s.elapsed_time(e) * 1e3
            done = chunk
            while done < ctx - args.n - 8:
                n = min(chunk, ctx - args.n - 8 - done)
                a.forward(BatchDescription(ids, [done] * R, [n] * R), xb[: R * n])
                done += n
            x1 = torch.randn(R, cfg.dim, device="cuda").to(torch.bfloat16)
            pos = [done]

            def decode():
                a.forward(BatchDescription(ids, [pos[0]] * R, [1] * R), x1)
                pos[0] += 1

            for _ in range(3):
                decode()
            wall, gpu = timed(decode, args.n)
            mem = a.memory()
            print(f"{args.model} layer {layer} ({a.kind}) graphs={int(graphs)}: prefill {R}x{chunk} "
                  f"wall {pre_wall:.0f} us gpu {pre_gpu:.0f} us | decode {R}x1 @ctx {pos[0]} wall "
                  f"{wall:.1f} us gpu {gpu:.1f} us | graphs {a.graph_stats} | mem weights "
                  f"{mem.weights / 2**20:.0f} MiB caches {mem.caches / 2**20:.0f} MiB workspace "
                  f"{mem.workspace / 2**20:.0f} MiB", flush=True)
            del a
            torch.cuda.empty_cache()
            time.sleep(1)


if __name__ == "__main__":
    main()

#!/usr/bin/env python3
"""Timing of every Triton-backend op (python/dsv4attn/triton) on a CUDA / ROCm GPU at V4-Flash
shapes (and the V3.2 attention cases of docs/performance.md), beside the native Hopper kernel of the same op
where one exists (torch.ops.dsv4.*, when the extension was built with CUDA).

    PYTHONPATH=build/python .venv/bin/python bench/scripts/bench_triton.py [--json out.json]
        [--only REGEX] [--n 20] [--layer]

Per case: median of --n CUDA-event timings after warm-up (the first call compiles), L2 flushed
before each timed call (a 256 MB write), µs; TFLOP/s by docs/performance.md's counting (sparse attention:
2 * H * s_q_total * topk_total * (d_qk + d_v), every slot counted); GB/s over the bytes the op
must move (each KV row read once, outputs written once). --layer adds whole-layer steps
(dsv4attn.Attention, backend triton vs native): a 16384-token prefill (128 x 128) and a
128-request decode at context 4096, per layer kind.
"""
from __future__ import annotations

import argparse
import json
import re
import statistics
import sys
import time

import torch

import dsv4attn
from dsv4attn import triton as dt
from dsv4attn._runtime import decode_schedule, kv_geometry, planner_sms

DEV = torch.device("cuda")
I32 = torch.int32
_rows = []
_l2 = None
_SCALE = 1  # --scale: divides batch and token counts (a quick smoke run, not a measurement)
_CEIL = {}  # ceilings measured in this run: copy_gbps, bf16_tflops (see measure_ceilings)
_HOST_LEAD_CYCLES = 1_000_000  # ~0.5 ms of GPU spin before each timed call (see timed)
_IDLE_S = 0.25  # idle before each case so a throttled H100 recovers (as `dsv4 bench` does)


def sc(n: int, floor: int = 1) -> int:
    return max(floor, n // _SCALE)


def timed(fn, n):
    """Median µs of n calls (CUDA events around each), L2 flushed before each."""
    global _l2
    if _l2 is None:
        _l2 = torch.empty(256 << 20, dtype=torch.uint8, device=DEV)
    fn()
    fn()
    torch.cuda.synchronize()
    events = []
    for _ in range(n):
        _l2.zero_()
        # The GPU waits here while the host enqueues the events and fn's launches behind it, so the
        # time between them is the GPU's alone. Without it an op shorter than the host's Python
        # overhead per iteration finds the GPU idle at s: its time then includes its own launch.
        torch.cuda._sleep(_HOST_LEAD_CYCLES)
        s, e = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        s.record()
        fn()
        e.record()
        events.append((s, e))
    torch.cuda.synchronize()
    return statistics.median(s.elapsed_time(e) * 1e3 for s, e in events)


def measure_ceilings():
    """The ceilings each row's fraction is taken against, measured in the same run: a 1 GiB
    device-to-device copy (bytes read + written) and a bf16 8192^3 matmul on the tensor cores.
    The Triton ops run in bf16 / fp32, so the bf16 tensor ceiling, not the FP8 one, is theirs."""
    src = torch.empty(1 << 30, dtype=torch.uint8, device=DEV)
    dst = torch.empty_like(src)
    _CEIL["copy_gbps"] = round(2 * src.numel() / timed(lambda: dst.copy_(src), 10) / 1e3, 1)
    del src, dst
    a = torch.randn(8192, 8192, dtype=torch.bfloat16, device=DEV)
    b = torch.randn(8192, 8192, dtype=torch.bfloat16, device=DEV)
    _CEIL["bf16_tflops"] = round(2 * 8192**3 / timed(lambda: a @ b, 10) / 1e6, 1)
    print(f"# ceilings measured now: copy {_CEIL['copy_gbps']} GB/s, "
          f"bf16 tensor {_CEIL['bf16_tflops']} TFLOP/s")


def fraction_of_ceiling(us, flops, nbytes):
    """floor / time, floor = max(FLOPs / bf16 tensor ceiling, bytes / copy ceiling)."""
    if not _CEIL or not (flops or nbytes):
        return None
    floor_us = max(flops / (_CEIL["bf16_tflops"] * 1e6), nbytes / (_CEIL["copy_gbps"] * 1e3))
    return round(floor_us / us, 3)


def case(args, op, name, triton_fn, native_fn=None, flops=0.0, nbytes=0.0):
    if args.only and not re.search(args.only, f"{op} {name}"):
        return
    time.sleep(_IDLE_S)
    us = timed(triton_fn, args.n)
    native = None
    if native_fn is not None and dsv4attn.with_cuda:
        try:
            native = timed(native_fn, args.n)
        except Exception as e:  # noqa: BLE001 - e.g. a shape the Hopper kernel refuses
            native = f"n/a ({type(e).__name__}: {str(e).splitlines()[0][:60]})"
    row = {"op": op, "case": name, "triton_us": round(us, 2),
           "tflops": round(flops / us / 1e6, 1) if flops else None,
           "gbps": round(nbytes / us / 1e3, 1) if nbytes else None,
           "native_us": round(native, 2) if isinstance(native, float) else native,
           "of_ceiling": fraction_of_ceiling(us, flops, nbytes)}
    _rows.append(row)
    nat = f"{native:10.1f}" if isinstance(native, float) else f"{str(native or '-'):>10s}"
    print(f"{op:28s} {name:44s} {us:10.1f} {nat} "
          f"{row['tflops'] if row['tflops'] is not None else '-':>8} "
          f"{row['gbps'] if row['gbps'] is not None else '-':>8} "
          f"{row['of_ceiling'] if row['of_ceiling'] is not None else '-':>8}", flush=True)


def filled_cache(layout, block_size, num_blocks):
    """A cache of random tokens (written on the GPU by the Triton insert)."""
    g = kv_geometry(layout, block_size)
    cache = torch.zeros(num_blocks, g["block_bytes"], dtype=torch.uint8, device=DEV)
    n, d = num_blocks * block_size, g["dim"]
    cs = dsv4attn.rope_cos_sin(64, 64, device=DEV)
    for s in range(0, n, 65536):
        m = min(65536, n - s)
        q = torch.zeros(m, 1, d, dtype=torch.bfloat16, device=DEV)
        kv = torch.randn(m, d, device=DEV).bfloat16()
        dt.get("qnorm_rope_kv_insert")(q, kv, torch.zeros(m, dtype=torch.int64, device=DEV), cs,
                                       1e-6, cache, layout, block_size, 1.0,
                                       torch.arange(s, s + m, device=DEV))
    return cache


# ---------------------------------------------------------------- sparse attention
def bench_decode(args):
    cases = [  # name, layout, b, s_q, H, topk (block), extra (block)
        ("V4-Flash b128 H64 128+512", "model1_fp8", 128, 1, 64, (128, 64), (512, 64)),
        ("V4-Flash b128 s_q2 H64 128+512", "model1_fp8", 128, 2, 64, (128, 64), (512, 64)),
        ("V4-Flash b2 H64 128+512", "model1_fp8", 2, 1, 64, (128, 64), (512, 64)),
        ("V4-Pro b128 s_q2 H128 128+1024", "model1_fp8", 128, 2, 128, (128, 64), (1024, 64)),
        ("V3.2 b64 s_q2 H128 topk2048", "v32_fp8", 64, 2, 128, (2048, 64), None),
        ("BF16 b128 H64 128+512", "bf16", 128, 1, 64, (128, 64), (512, 64)),
        ("FP8/tensor b128 H64 128+512", "fp8_per_tensor", 128, 1, 64, (128, 64), (512, 64)),
    ]
    for name, layout, b, s_q, H, (topk, B), extra in cases:
        d = 576 if layout == "v32_fp8" else 512
        b, nb = sc(b), sc(4096, 64)
        cache = filled_cache(layout, B, nb)
        xcache = filled_cache(layout, extra[1], nb) if extra else None
        q = torch.randn(b, s_q, H, d, device=DEV).bfloat16()
        idx = torch.randint(0, nb * B, (b, s_q, topk), dtype=I32, device=DEV)
        xtopk = extra[0] if extra else 0
        xidx = torch.randint(0, nb * extra[1], (b, s_q, xtopk), dtype=I32, device=DEV) \
            if extra else None
        lens = torch.full((b,), topk, dtype=I32, device=DEV)
        xlens = torch.full((b,), xtopk, dtype=I32, device=DEV) if extra else None
        sink = torch.randn(H, device=DEV)
        ns, sl, wb = decode_schedule(b, s_q, H, topk + xtopk, planner_sms(DEV), 512)
        ws = torch.empty(wb, dtype=torch.uint8, device=DEV)
        out = torch.empty(b, s_q, H, 512, dtype=torch.bfloat16, device=DEV)
        lse = torch.empty(b, s_q, H, device=DEV)
        a = (q, cache, layout, B, idx, lens, xcache, layout, extra[1] if extra else 1, xidx,
             xlens, sink, 0.0, 512, ns, sl, wb, ws, out, lse)
        tok = {"model1_fp8": 584, "v32_fp8": 656, "bf16": 1024, "fp8_per_tensor": 512}[layout]
        slots = b * s_q * (topk + xtopk)
        flops = 2 * H * b * s_q * (topk + xtopk) * (d + 512)
        nbytes = slots * (tok + 4) + q.numel() * 2 + out.numel() * 2
        native = (lambda: torch.ops.dsv4.sparse_decode(*a)) if layout in (
            "model1_fp8", "v32_fp8") else None
        case(args, "sparse_decode", f"{name} ({ns} splits)", lambda: dt.get("sparse_decode")(*a),
             native, flops, nbytes)


def bench_prefill(args):
    for name, H, d, topk, s_kv in (("V4-Flash s_q4096 H64 topk512 kv8k", 64, 512, 512, 8192),
                                   ("V4-Flash s_q4096 H64 topk512 kv64k", 64, 512, 512, 65536),
                                   ("V4-Pro s_q4096 H128 topk1024 kv8k", 128, 512, 1024, 8192),
                                   ("V3.2 s_q4096 H128 d576 topk2048 kv8k", 128, 576, 2048, 8192)):
        s_q, s_kv = sc(4096), sc(s_kv, 64)
        q = torch.randn(s_q, H, d, device=DEV).bfloat16()
        kv = torch.randn(s_kv, 1, d, device=DEV).bfloat16()
        idx = torch.randint(0, s_kv, (s_q, 1, topk), dtype=I32, device=DEV)
        sink = torch.randn(H, device=DEV)
        out = torch.empty(s_q, H, 512, dtype=torch.bfloat16, device=DEV)
        ml, lse = torch.empty(s_q, H, device=DEV), torch.empty(s_q, H, device=DEV)
        a = (q, kv, idx, None, sink, 0.0, 512, out, ml, lse)
        flops = 2 * H * s_q * topk * (d + 512)
        nbytes = q.numel() * 2 + min(s_kv, s_q * topk) * d * 2 + out.numel() * 2 + idx.numel() * 4
        case(args, "sparse_prefill", name, lambda: dt.get("sparse_prefill")(*a),
             lambda: torch.ops.dsv4.sparse_prefill(*a), flops, nbytes)
    b, H, S = sc(128), 64, 4
    po = torch.randn(b, 1, H, S, 512, device=DEV)
    pl = torch.randn(b, 1, H, S, device=DEV)
    out = torch.empty(b, 1, H, 512, dtype=torch.bfloat16, device=DEV)
    lse = torch.empty(b, 1, H, device=DEV)
    sink = torch.randn(H, device=DEV)
    a = (po, pl, sink, out, lse)
    case(args, "sparse_attention_combine", "b128 H64 4 splits",
         lambda: dt.get("sparse_attention_combine")(*a),
         lambda: torch.ops.dsv4.sparse_attention_combine(*a), 0,
         po.numel() * 4 + out.numel() * 2)


# ---------------------------------------------------------------- rows
def bench_rows(args):
    cfg = dsv4attn.ModelConfig.builtin("v4-flash")
    H, D = cfg.n_heads, cfg.head_dim
    cs = dsv4attn.rope_cos_sin(65536, 64, device=DEV)
    for T in (sc(16384), sc(128)):
        q = torch.randn(T, H, D, device=DEV).bfloat16()
        kv = torch.randn(T, D, device=DEV).bfloat16()
        pos = torch.randint(0, 65536, (T,), device=DEV)
        cache = torch.zeros(T // 64 + 1, kv_geometry("model1_fp8", 64)["block_bytes"],
                            dtype=torch.uint8, device=DEV)
        slots = torch.randperm(T, device=DEV)
        a = (q, kv, pos, cs, 1e-6, cache, "model1_fp8", 64, 1.0, slots)
        nbytes = q.numel() * 4 + kv.numel() * 4 + T * 584
        case(args, "qnorm_rope_kv_insert", f"T{T} H64 MODEL1",
             lambda: dt.get("qnorm_rope_kv_insert")(*a),
             lambda: torch.ops.dsv4.qnorm_rope_kv_insert(*a), 0, nbytes)
        o = torch.randn(T, H, D, device=DEV).bfloat16()
        xq = torch.empty(T, H * D, dtype=torch.float8_e4m3fn, device=DEV)
        osc = torch.empty(T, H * D // 128, device=DEV)
        dq = torch.empty(T, H * D, dtype=torch.bfloat16, device=DEV)
        native = getattr(torch.ops.dsv4, "inv_rope_fp8_quant", None)
        case(args, "inv_rope_fp8_quant", f"T{T} H64 block128 (+ bf16 dequant)",
             lambda: dt.get("inv_rope_fp8_quant")(o, pos, cs, 128, xq, osc, o_dequant=dq),
             (lambda: native(o, pos, cs, 128, xq, osc)) if native is not None else None, 0,
             o.numel() * 2 + xq.numel() * 3 + osc.numel() * 4)
        case(args, "quantize_act_fp8", f"T{T} K32768 block128",
             lambda: dt.get("quantize_act_fp8")(o.view(T, -1), 128, xq, osc),
             lambda: torch.ops.dsv4.quantize_act_fp8(o.view(T, -1), 128, xq, osc), 0,
             o.numel() * 3 + osc.numel() * 4)
        case(args, "apply_rope", f"T{T} H64 inverse in place",
             lambda: dt.get("apply_rope")(o, pos, cs, True, o),
             lambda: torch.ops.dsv4.apply_rope(o, pos, cs, True, o), 0, o.numel() * 4)
        qr, kvr = torch.randn(T, 1024, device=DEV), torch.randn(T, 512, device=DEV)
        wq, wkv = torch.ones(1024, device=DEV).bfloat16(), torch.ones(512, device=DEV).bfloat16()
        qo = torch.empty(T, 1024, dtype=torch.bfloat16, device=DEV)
        ko = torch.empty(T, 512, dtype=torch.bfloat16, device=DEV)
        a2 = (qr, wq, kvr, wkv, 1e-6, qo, ko)
        case(args, "fused_qkv_rms_norm", f"T{T} 1024 + 512",
             lambda: dt.get("fused_qkv_rms_norm")(*a2),
             lambda: torch.ops.dsv4.fused_qkv_rms_norm(*a2), 0, T * 1536 * 6)
    R, B, M = 4, 64, sc(4096, 64) + 128
    cache = filled_cache("model1_fp8", B, R * M // B + 8)
    table = torch.arange(R * (M // B + 1), dtype=I32, device=DEV).view(R, -1)
    seq = torch.full((R,), M, dtype=I32, device=DEV)
    ws = torch.empty(R, M, 512, dtype=torch.bfloat16, device=DEV)
    a3 = (cache, "model1_fp8", B, 1.0, table, seq, None, 0, ws)
    case(args, "dequantize_and_gather", f"{R} requests x {M} rows MODEL1",
         lambda: dt.get("dequantize_and_gather")(*a3),
         lambda: torch.ops.dsv4.dequantize_and_gather(*a3), 0, R * M * (584 + 1024))


# ---------------------------------------------------------------- compressor, indexer
def bench_compressed(args):
    from dsv4attn.triton.compressor import CompressorConfig
    cfg = dsv4attn.ModelConfig.builtin("v4-flash")
    cs = dsv4attn.rope_cos_sin(65536, 64, 160000.0, True, 16.0, 65536, device=DEV)
    for ccfg, label in ((CompressorConfig.attention(cfg, 4), "r4 kv"),
                        (CompressorConfig.attention(cfg, 128), "r128 kv"),
                        (CompressorConfig.indexer(cfg), "indexer r4")):
        for R, n, ctx in ((sc(128), 128, 0), (sc(128), 1, 4095)):
            T = R * n
            pos = (ctx + torch.arange(n, device=DEV)).repeat(R)
            t2r = torch.arange(R, dtype=I32, device=DEV).repeat_interleave(n)
            ctxs = torch.full((R,), ctx, dtype=I32, device=DEV)
            rows = torch.randn(T, ccfg.proj_width, device=DEV)
            srows = torch.randn(T, ccfg.proj_width, device=DEV)
            blocks = -(-ccfg.ring_rows // ccfg.ratio)
            state = torch.randn(R * blocks * ccfg.ratio, ccfg.state_width, device=DEV)
            stab = torch.arange(R * blocks, dtype=I32, device=DEV).view(R, blocks)
            B = 64 if ccfg.ratio == 4 else 2
            ent = (ctx + n) // ccfg.ratio + 1
            otab = torch.arange(R * (-(-ent // B)), dtype=I32, device=DEV).view(R, -1)
            if ccfg.target == "indexer_keys":
                out = torch.zeros(otab.numel(), B * 132, dtype=torch.uint8, device=DEV)
            else:
                out = torch.zeros(otab.numel(), kv_geometry("model1_fp8", B)["block_bytes"],
                                  dtype=torch.uint8, device=DEV)
            w = torch.ones(ccfg.head_dim, device=DEV).bfloat16()
            a = (*ccfg.op_args(), rows, srows, pos, t2r, ctxs, w, cs, state, stab, ccfg.ratio, out, otab, B)
            case(args, "compressor_update_and_emit", f"{label} {R}x{n} ctx{ctx}",
                 lambda: dt.get("compressor_update_and_emit")(*a), None, 0,
                 rows.numel() * 8 + T // ccfg.ratio * ccfg.proj_width * 8 * ccfg.coff)
            x = torch.randn(T, cfg.dim, device=DEV).bfloat16()
            wkv = torch.randn(ccfg.proj_width, cfg.dim, device=DEV).bfloat16()
            ape = torch.randn(ccfg.ratio, ccfg.proj_width, device=DEV)
            a2 = (*ccfg.op_args(), x, wkv, wkv, ape, pos, rows, srows)
            case(args, "compressor_project", f"{label} T{T} (2 GEMMs + ape)",
                 lambda: dt.get("compressor_project")(*a2), None,
                 4 * T * cfg.dim * ccfg.proj_width, 0)
    HI = cfg.index_n_heads
    for T in (sc(16384), sc(128)):
        qr = torch.randn(T, cfg.q_lora_rank, device=DEV).bfloat16()
        wq = torch.randn(HI * 128, cfg.q_lora_rank, device=DEV).bfloat16()
        x = torch.randn(T, cfg.dim, device=DEV).bfloat16()
        wp = torch.randn(HI, cfg.dim, device=DEV).bfloat16()
        pos = torch.randint(0, 65536, (T,), device=DEV)
        q8 = torch.empty(T, HI, 128, dtype=torch.float8_e4m3fn, device=DEV)
        qs, ww = torch.empty(T, HI, device=DEV), torch.empty(T, HI, device=DEV)
        case(args, "indexer_query", f"T{T} H_I64 (GEMMs + rope/hadamard/fp8)",
             lambda: dt.get("indexer_query")(qr, wq, None, x, wp, pos, cs, q8, qs, ww), None,
             2 * T * (cfg.q_lora_rank * HI * 128 + cfg.dim * HI), 0)
    for T, N, label in ((sc(128), sc(16384, 64), "decode 128 tokens, 16384 entries"),
                        (sc(4096), sc(1024, 64), "prefill 4096 tokens, <= 1024 entries")):
        B = 64
        decode = label.startswith("decode")
        R = T if decode else 1
        q8 = torch.randint(0, 120, (T, HI, 128), dtype=torch.uint8, device=DEV)
        qs, w = torch.ones(T, HI, device=DEV), torch.randn(T, HI, device=DEV)
        nblk = -(-N // B)
        keys = torch.randint(0, 120, (R * nblk, B * 132), dtype=torch.uint8, device=DEV)
        table = torch.arange(R * nblk, dtype=I32, device=DEV).view(R, nblk)
        t2r = torch.arange(T, dtype=I32, device=DEV) % R
        pos = torch.full((T,), 4 * N - 1, device=DEV) if decode else \
            torch.arange(T, device=DEV)
        scores = torch.empty(T, N, device=DEV)
        a = (q8.view(torch.float8_e4m3fn), qs, w, pos, t2r, keys, B, table, 4, scores)
        vis = T * N if decode else sum(min((p + 1) // 4, N) for p in range(T))
        case(args, "indexer_scores", label, lambda: dt.get("indexer_scores")(*a), None,
             2 * HI * 128 * vis, vis * 132 + q8.numel())
        idx = torch.empty(T, 512, dtype=I32, device=DEV)
        lens = torch.empty(T, dtype=I32, device=DEV)
        case(args, "indexer_topk", f"{label}, k 512",
             lambda: dt.get("indexer_topk")(scores, pos, 4, idx, lens), None, 0,
             scores.numel() * 4)
    T = sc(16384)
    pos = torch.arange(T, device=DEV)
    idx = torch.empty(T, 128, dtype=I32, device=DEV)
    case(args, "compressed_prefix_indices", f"T{T} ratio 128",
         lambda: dt.get("compressed_prefix_indices")(pos, 128, idx, None), None, 0, T * 128 * 4)


def bench_indexing(args):
    T, K, W, B, R = sc(16384), 512, 128, 64, 128
    local = torch.randint(0, 4096, (T, K), dtype=I32, device=DEV)
    t2r = torch.arange(T, dtype=I32, device=DEV) % R
    table = torch.arange(R * 128, dtype=I32, device=DEV).view(R, 128)
    glob = torch.empty(T, K, dtype=I32, device=DEV)
    lens = torch.empty(T, dtype=I32, device=DEV)
    a = (local, t2r, table, B, glob, lens, False)
    case(args, "local_to_global_slots", f"T{T} K{K}", lambda: dt.get("local_to_global_slots")(*a),
         lambda: torch.ops.dsv4.local_to_global_slots(*a), 0, local.numel() * 8)
    pos = torch.randint(0, 8000, (T,), device=DEV)
    ind = torch.empty(T, W, dtype=I32, device=DEV)
    a2 = (pos, t2r, table, B, W, ind, lens)
    case(args, "swa_window_indices", f"T{T} W{W}", lambda: dt.get("swa_window_indices")(*a2),
         lambda: torch.ops.dsv4.swa_window_indices(*a2), 0, ind.numel() * 4)
    Rg, n = 4, sc(4096, 128)
    qsl = torch.arange(0, (Rg + 1) * n, n, dtype=I32, device=DEV)
    seq = torch.full((Rg,), n, dtype=I32, device=DEV)
    gl = torch.full((Rg,), n, dtype=I32, device=DEV)
    topk = torch.randint(-1, 1, (Rg * n, K), dtype=I32, device=DEV)
    out = torch.empty(Rg * n, K + W, dtype=I32, device=DEV)
    olen = torch.empty(Rg * n, dtype=I32, device=DEV)
    a3 = (topk, qsl, seq, gl, W, 1024, 1024 + n, 4, out, olen)
    case(args, "combine_topk_swa_indices", f"{Rg} x {n} tokens K{K} W{W}",
         lambda: dt.get("combine_topk_swa_indices")(*a3),
         lambda: torch.ops.dsv4.combine_topk_swa_indices(*a3), 0,
         topk.numel() * 4 + out.numel() * 4)


# ---------------------------------------------------------------- the layer
def bench_layer(args):
    cfg = dsv4attn.ModelConfig.builtin("v4-flash")
    R, chunk, ctx = 128, 128, 4096
    for layer in (0, 2, 3):
        for backend in ("triton", "native"):
            if backend == "native" and not dsv4attn.with_cuda:
                continue
            a = dsv4attn.Attention(cfg, layer, seed=1, device="cuda", backend=backend,
                                   cuda_graphs=False, swa_blocks=R * (ctx // 64 + 4) + 64,
                                   compressed_blocks=R * (ctx // 64 + 4) + 64,
                                   state_blocks=R * 8 + 64)
            ids = list(range(R))
            x = torch.randn(R * chunk, cfg.dim, device=DEV).bfloat16()
            step = dsv4attn.BatchDescription(ids, [0] * R, [chunk] * R)
            s, e = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            s.record()
            a.forward(step, x)
            e.record()
            torch.cuda.synchronize()
            pre = s.elapsed_time(e) * 1e3
            done = chunk
            while done < ctx - args.n - 4:
                n = min(1024, ctx - args.n - 4 - done)
                a.forward(dsv4attn.BatchDescription(ids, [done] * R, [n] * R),
                          torch.randn(R * n, cfg.dim, device=DEV).bfloat16())
                done += n
            xd = torch.randn(R, cfg.dim, device=DEV).bfloat16()
            times = []
            for _ in range(args.n):
                s, e = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
                s.record()
                a.forward(dsv4attn.BatchDescription(ids, [done] * R, [1] * R), xd)
                e.record()
                torch.cuda.synchronize()
                times.append(s.elapsed_time(e) * 1e3)
                done += 1
            kind = cfg.layer_kind(layer)
            for name, us in ((f"prefill {R}x{chunk} (first call, incl. compile)", pre),
                             (f"decode {R}x1 at ctx {ctx}", statistics.median(times))):
                _rows.append({"op": f"layer {kind}", "case": name, "backend": backend,
                              "us": round(us, 1)})
                print(f"{'layer ' + kind:28s} {name:44s} {backend:>8s} {us:10.1f}", flush=True)
            del a
            torch.cuda.empty_cache()


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--n", type=int, default=20)
    ap.add_argument("--only", default="", help="regex over 'op case'")
    ap.add_argument("--json", default="")
    ap.add_argument("--layer", action="store_true", help="also time whole layer steps")
    ap.add_argument("--scale", type=int, default=1,
                    help="divide batch / token counts (smoke runs; not for reporting)")
    args = ap.parse_args()
    global _SCALE
    _SCALE = args.scale
    if not torch.cuda.is_available():
        print("bench_triton.py: needs a GPU", file=sys.stderr)
        return 2
    props = torch.cuda.get_device_properties(DEV)
    print(f"# {props.name}, {props.multi_processor_count} SMs, torch {torch.__version__}, "
          f"triton {__import__('triton').__version__}, dsv4attn CUDA ops: {dsv4attn.with_cuda}")
    measure_ceilings()
    print(f"{'op':28s} {'case':44s} {'triton µs':>10s} {'native µs':>10s} {'TFLOP/s':>8s} "
          f"{'GB/s':>8s} {'of ceil':>8s}")
    torch.manual_seed(0)
    for part in (bench_decode, bench_prefill, bench_rows, bench_compressed, bench_indexing):
        part(args)
    if args.layer:
        bench_layer(args)
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"device": props.name, "ceilings": _CEIL, "rows": _rows}, f, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())

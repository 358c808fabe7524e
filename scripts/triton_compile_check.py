#!/usr/bin/env python3
"""Ahead-of-time compile check of the Triton backend (python/dsv4attn/triton), no GPU needed.

Runs every op of the backend on small CPU tensors with the launches intercepted: each kernel
launch (kernel + constexprs + argument types + num_warps) is compiled by Triton for real GPU
targets instead of being executed, so compile errors that the interpreter cannot see
(loop-carried type changes, unsupported layouts, register blow-ups) show up here. For CUDA
targets the report gives registers, local memory (spills) and shared memory per kernel.

    PYTHONPATH=build/python .venv/bin/python scripts/triton_compile_check.py [--targets ...]

Targets: cuda:90 (H100/H200), cuda:80 (A100), hip:gfx942 (MI300). Exit status 1 if any
launch fails to compile.
"""
from __future__ import annotations

import argparse
import os
import re
import subprocess
import sys
import tempfile

os.environ.pop("TRITON_INTERPRET", None)

import torch  # noqa: E402
import triton  # noqa: E402
from triton.backends.compiler import GPUTarget  # noqa: E402
from triton.runtime.jit import JITFunction  # noqa: E402

import dsv4attn  # noqa: E402
from dsv4attn.triton import _checks, _launch, sparse_decode, sparse_prefill  # noqa: E402

_TYPES = {torch.float32: "fp32", torch.bfloat16: "bf16", torch.float16: "fp16",
          torch.int32: "i32", torch.int64: "i64", torch.int16: "i16", torch.uint8: "u8",
          torch.int8: "i8", torch.bool: "i1"}
_seen: dict = {}
_failures: list = []
# Shared memory a block may use (bytes): H100 / A100 opt-in maxima, MI300 LDS.
_SMEM_LIMIT = {("cuda", 90): 232448, ("cuda", 80): 166912, ("hip", "gfx942"): 65536}


def _signature(fn: JITFunction, args, kwargs):
    bound = {}
    names = [p.name for p in fn.params]
    for name, value in zip(names, args):
        bound[name] = value
    for name in names[len(args):]:
        if name in kwargs:
            bound[name] = kwargs[name]
        else:
            bound[name] = fn.params[names.index(name)].default
    sig, consts = {}, {}
    for p in fn.params:
        v = bound[p.name]
        if p.is_constexpr or v is None:
            sig[p.name] = "constexpr"
            consts[p.name] = v
        elif isinstance(v, torch.Tensor):
            sig[p.name] = "*" + _TYPES[v.dtype]
        elif isinstance(v, bool):
            sig[p.name] = "i1"
        elif isinstance(v, int):
            sig[p.name] = "i32" if -2 ** 31 <= v < 2 ** 31 else "i64"
        elif isinstance(v, float):
            sig[p.name] = "fp32"
        else:
            raise TypeError(f"{fn.__name__}: argument {p.name}: {type(v).__name__}")
    return sig, consts


def _cuda_usage(compiled) -> str:
    """Registers and local memory (spills) of a compiled CUDA kernel."""
    tool = os.path.join(os.path.dirname(triton.__file__), "backends", "nvidia", "bin", "cuobjdump")
    with tempfile.TemporaryDirectory() as d:
        path = os.path.join(d, "k.cubin")
        with open(path, "wb") as f:
            f.write(compiled.asm["cubin"])
        r = subprocess.run([tool, "--dump-resource-usage", path], capture_output=True, text=True)
    regs = re.search(r"REG:(\d+)", r.stdout)
    local = re.search(r"LOCAL:(\d+)", r.stdout)
    return (f"regs {regs.group(1) if regs else '?'}, "
            f"local (spill) {local.group(1) if local else '?'} B")


def _targets(spec):
    out = []
    for s in spec:
        backend, arch = s.split(":")
        out.append(GPUTarget(backend, int(arch) if backend == "cuda" else arch,
                             32 if backend == "cuda" else 64))
    return out


def _intercept(targets, only):
    """Kernel launches compile for every target instead of running; run() returns, per target,
    whether the kernel fits its shared memory (None when skipped by --only)."""

    def run(self, *args, grid, warmup, **kwargs):
        if only and not re.search(only, self.__name__):
            return None
        opts = {k: kwargs.pop(k) for k in ("num_warps", "num_stages") if k in kwargs}
        sig, consts = _signature(self, args, kwargs)
        key = (self.__name__, tuple(sorted(sig.items())), tuple(sorted(
            (k, str(v)) for k, v in consts.items())), tuple(sorted(opts.items())))
        if key in _seen:
            return _seen[key]
        flags = ", ".join(f"{k}={v}" for k, v in consts.items() if v is not None and k.isupper())
        label = f"{self.__name__}[{flags}{', ' if flags else ''}warps={opts.get('num_warps', 4)}]"
        lines, fits = [], {}
        for target in targets:
            tkey = (target.backend, target.arch)
            try:
                src = triton.compiler.ASTSource(fn=self, signature=sig, constexprs=consts)
                c = triton.compile(src, target=target, options=opts)
                smem = c.metadata.shared
                info = _cuda_usage(c) + ", " if target.backend == "cuda" else ""
                fits[tkey] = smem <= _SMEM_LIMIT.get(tkey, 1 << 30)
                lines.append(f"{target.backend}:{target.arch} {'ok' if fits[tkey] else 'TOO BIG'} "
                             f"({info}smem {smem} B)")
            except Exception as e:  # noqa: BLE001 - report every failure, keep going
                msg = str(e).strip().splitlines()
                lines.append(f"{target.backend}:{target.arch} FAILED: "
                             f"{msg[-1] if msg else type(e).__name__}")
                _failures.append((label, target, str(e)))
                fits[tkey] = True  # counted as a failure already
        _seen[key] = fits
        print(f"{label}\n    " + "\n    ".join(lines), flush=True)
        return fits

    def launch_all(kernel, key, configs, grid, args, constexprs):
        """_launch.launch: compile every configuration; at least one must fit each target."""
        fit_any = {}
        for c in configs:
            fits = kernel[grid(c)](*args, **constexprs, BLOCK_H=c.block_h, BLOCK_N=c.block_n,
                                   num_warps=c.num_warps, num_stages=c.num_stages)
            for t, ok in (fits or {}).items():
                fit_any[t] = fit_any.get(t, False) or ok
        for t, ok in fit_any.items():
            if not ok:
                _failures.append((f"{kernel.__name__} {key}", GPUTarget(t[0], t[1], 0),
                                  "no configuration fits the shared memory"))

    JITFunction.run = run
    _launch.launch = launch_all
    for mod in (sparse_decode, sparse_prefill):
        mod.launch = launch_all
    # CPU tensors stand in for device ones here (the launch configs stay the GPU's: the
    # interpreter is off, so e.g. heads_per_program picks its GPU value).
    _checks.same_device = lambda op, named: next(t.device for _, t in named if t is not None)


def sweep():
    """Every op, with the constexpr variants the layer and the tests use."""
    from dsv4attn import triton as dt

    H, D, T = 64, 512, 4
    cs = dsv4attn.rope_cos_sin(64, 64)
    pos = torch.arange(T)
    i32 = torch.int32
    for layout, dim in (("model1_fp8", 512), ("v32_fp8", 576), ("bf16", 512),
                        ("fp8_per_tensor", 512)):
        B = 64
        nbytes = dsv4attn._runtime.kv_geometry(layout, B)["block_bytes"]
        cache = torch.zeros(2, nbytes, dtype=torch.uint8)
        q = torch.zeros(T, H, dim, dtype=torch.bfloat16)
        kv = torch.zeros(T, dim, dtype=torch.bfloat16)
        dt.get("qnorm_rope_kv_insert")(q, kv, pos, cs, 1e-6, cache, layout, B, 1.0, pos)
        ws = torch.zeros(2, 8, dim, dtype=torch.bfloat16)
        bt = torch.zeros(2, 2, dtype=i32)
        lens = torch.ones(2, dtype=i32)
        dt.get("dequantize_and_gather")(cache, layout, B, 1.0, bt, lens, lens, 0, ws)
        dt.get("dequantize_and_gather")(cache, layout, B, 1.0, bt, lens, None, 0, ws)
        for heads in (64, 128):
            qd = torch.zeros(T, 1, heads, dim, dtype=torch.bfloat16)
            idx = torch.zeros(T, 1, 128, dtype=i32)
            lens_t = torch.ones(T, dtype=i32)
            sink = torch.zeros(heads)
            out = torch.zeros(T, 1, heads, 512, dtype=torch.bfloat16)
            lse = torch.zeros(T, 1, heads)
            for splits, extra in ((1, False), (2, True), (1, True)):
                wsd = torch.zeros(4 * T * heads * splits * 513, dtype=torch.uint8)
                dt.get("sparse_decode")(
                    qd, cache, layout, B, idx, lens_t, cache if extra else None, layout, B,
                    idx if extra else None, lens_t if extra else None, sink, 0.0, 512, splits,
                    256, wsd.numel(), wsd, out, lse)
    for heads, dim in ((64, 512), (128, 576), (16, 512)):
        q = torch.zeros(T, heads, dim, dtype=torch.bfloat16)
        kv = torch.zeros(32, 1, dim, dtype=torch.bfloat16)
        idx = torch.zeros(T, 1, 128, dtype=i32)
        for sink, lens in ((torch.zeros(heads), torch.ones(T, dtype=i32)), (None, None)):
            dt.get("sparse_prefill")(q, kv, idx, lens, sink, 0.0, 512, torch.zeros(
                T, heads, 512, dtype=torch.bfloat16), torch.zeros(T, heads), torch.zeros(T, heads))
    x = torch.zeros(T, 1024)
    for xdt in (torch.bfloat16, torch.float32):
        dt.get("rms_norm")(x.to(xdt), torch.ones(1024, dtype=torch.bfloat16), 1e-6,
                           torch.zeros(T, 1024, dtype=torch.bfloat16))
    dt.get("fused_qkv_rms_norm")(x, torch.ones(1024, dtype=torch.bfloat16), torch.zeros(T, 512),
                                 torch.ones(512, dtype=torch.bfloat16), 1e-6,
                                 torch.zeros(T, 1024, dtype=torch.bfloat16),
                                 torch.zeros(T, 512, dtype=torch.bfloat16))
    o = torch.zeros(T, H, D, dtype=torch.bfloat16)
    dt.get("apply_rope")(o, pos, cs, True, o)
    xq = torch.zeros(T, H * D, dtype=torch.float8_e4m3fn)
    for sdt in (torch.float32, torch.float8_e8m0fnu):
        sc = torch.zeros(T, H * D // 128, dtype=sdt)
        for block in (128, 64):
            sc2 = torch.zeros(T, H * D // block, dtype=sdt)
            dt.get("inv_rope_fp8_quant")(o, pos, cs, block, xq, sc2,
                                         o_dequant=torch.zeros(T, H * D, dtype=torch.bfloat16))
        dt.get("quantize_act_fp8")(o.view(T, -1), 128, xq, sc)
        dt.get("dequantize_fp8_blocks")(xq, sc, 1, 128, torch.zeros(T, H * D,
                                                                    dtype=torch.bfloat16))
    from dsv4attn.triton.compressor import CompressorConfig
    cfg = dsv4attn.ModelConfig.builtin("v4-flash")
    for ccfg, layout in ((CompressorConfig.attention(cfg, 4), "model1_fp8"),
                         (CompressorConfig.attention(cfg, 128), "model1_fp8"),
                         (CompressorConfig.attention(cfg, 4), "bf16"),
                         (CompressorConfig.indexer(cfg), None)):
        w = ccfg.proj_width
        rows = torch.zeros(T, w)
        dt.get("compressor_project")(ccfg, torch.zeros(T, 64, dtype=torch.bfloat16),
                                     torch.zeros(w, 64, dtype=torch.bfloat16),
                                     torch.zeros(w, 64, dtype=torch.bfloat16),
                                     torch.zeros(ccfg.ratio, w), pos, rows, rows.clone())
        state = torch.zeros(ccfg.ring_rows, ccfg.state_width)
        table = torch.zeros(1, 1, dtype=i32)
        B = 64
        if layout is None:
            out = torch.zeros(2, B * 132, dtype=torch.uint8)
        else:
            out = torch.zeros(2, dsv4attn._runtime.kv_geometry(layout, B)["block_bytes"],
                              dtype=torch.uint8)
        dt.get("compressor_update_and_emit")(
            ccfg, rows, rows.clone(), pos, torch.zeros(T, dtype=i32), torch.zeros(1,
                                                                                  dtype=i32),
            torch.ones(ccfg.head_dim), cs, state, table, ccfg.ring_rows, out, table, B,
            layout or "model1_fp8", 1.0, torch.zeros(T, ccfg.head_dim))
    HI = 64
    q_fp8 = torch.zeros(T, HI, 128, dtype=torch.float8_e4m3fn)
    dt.get("indexer_query")(torch.zeros(T, 1024, dtype=torch.bfloat16),
                            torch.zeros(HI * 128, 1024, dtype=torch.bfloat16), None,
                            torch.zeros(T, 64, dtype=torch.bfloat16),
                            torch.zeros(HI, 64, dtype=torch.bfloat16), pos, cs, q_fp8,
                            torch.zeros(T, HI), torch.zeros(T, HI))
    keys = torch.zeros(2, 64 * 132, dtype=torch.uint8)
    scores = torch.zeros(T, 128)
    dt.get("indexer_scores")(q_fp8, torch.zeros(T, HI), torch.zeros(T, HI), pos,
                             torch.zeros(T, dtype=i32), keys, 64, torch.zeros(1, 2, dtype=i32), 4,
                             scores)
    dt.get("indexer_topk")(scores, pos, 4, torch.zeros(T, 512, dtype=i32),
                           torch.zeros(T, dtype=i32))
    dt.get("compressed_prefix_indices")(pos, 128, torch.zeros(T, 16, dtype=i32),
                                        torch.zeros(T, dtype=i32))
    tbl = torch.zeros(2, 4, dtype=i32)
    dt.get("local_to_global_slots")(torch.zeros(T, 512, dtype=i32), torch.zeros(T, dtype=i32),
                                    tbl, 64, torch.zeros(T, 512, dtype=i32),
                                    torch.zeros(T, dtype=i32))
    dt.get("swa_window_indices")(pos, torch.zeros(T, dtype=i32), tbl, 64, 128,
                                 torch.zeros(T, 128, dtype=i32), torch.zeros(T, dtype=i32))
    for k in (512, 0):
        dt.get("combine_topk_swa_indices")(
            torch.zeros(T, k, dtype=i32), torch.tensor([0, T], dtype=i32),
            torch.tensor([T], dtype=i32), torch.tensor([T], dtype=i32), 128, 16, 160, 4 if k
            else 0, torch.zeros(T, k + 128, dtype=i32), torch.zeros(T, dtype=i32))


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--targets", nargs="+", default=["cuda:90", "cuda:80", "hip:gfx942"])
    ap.add_argument("--only", default="", help="regex: compile only kernels whose name matches")
    a = ap.parse_args()
    _intercept(_targets(a.targets), a.only)
    sweep()
    print(f"\n{len(_seen)} kernel variants, {len(_failures)} failed compiles")
    for label, target, err in _failures:
        print(f"--- {label} on {target.backend}:{target.arch}\n{err[-3000:]}")
    return 1 if _failures else 0


if __name__ == "__main__":
    sys.exit(main())

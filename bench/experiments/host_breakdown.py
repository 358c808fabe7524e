"""Where the host time of dsv4attn.flash_mla's entry points goes, layer by layer (CUDA).

bench/scripts/host_overhead.py puts flash_mla_with_kvcache at ~3x FlashMLA's host time a call
(docs/notes/host_overhead.md). This times the same call from the outside in: the whole entry
point; the op's Python function with every argument prepared (ops.sparse_decode); the extension
call alone (_C.sparse_decode, the stream handle given); and the pieces around them (the stream
query, the device guard, one torch.empty on the GPU, the shape-only split plan). The prefill's
entry and its _C call likewise. Host µs a call as bench/scripts/host_timing.py measures it (calls
queued behind ~100 ms of GPU sleep, so no call waits for the GPU).

Run (device, after a build of the Python extension, e.g. `BUILD_TARGETS=_C bash
bench/scripts/device_session.sh`):
  PYTHONPATH=$PWD/build/python:$PWD/third_party/pylib python3 bench/experiments/host_breakdown.py
"""
from __future__ import annotations

import os
import sys

import torch

from dsv4attn import _C, ops
from dsv4attn._runtime import decode_schedule, device_guard, planner_sms, stream_handle
from dsv4attn.flash_mla import (_cache_bytes, alloc_kv_cache, flash_mla_sparse_fwd,
                                flash_mla_with_kvcache, get_mla_metadata)

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "scripts"))
from host_timing import host_us  # noqa: E402


def row(name: str, us: float) -> None:
    print(f"{name:58s} {us:8.1f}", flush=True)


def main() -> None:
    dev = torch.device("cuda", 0)
    print(f"{torch.cuda.get_device_name(0)}, torch {torch.__version__}; host µs a call")
    # V4-Flash CONFIG1: b 128, s_q 2, H 64, main scope 128 slots of 256-token blocks, extra
    # scope 512 slots of 64-token blocks. The cache contents do not matter here.
    b, s_q, h, d = 128, 2, 64, 512
    k0 = alloc_kv_cache(1024, 256, "model1_fp8", dev)
    k1 = alloc_kv_cache(4096, 64, "model1_fp8", dev)
    q = torch.randn(b, s_q, h, d, dtype=torch.bfloat16, device=dev)
    i0 = torch.randint(0, 1024 * 256, (b, s_q, 128), dtype=torch.int32, device=dev)
    i1 = torch.randint(0, 4096 * 64, (b, s_q, 512), dtype=torch.int32, device=dev)
    sink = torch.zeros(h, dtype=torch.float32, device=dev)
    meta = get_mla_metadata()[0]
    scale = d ** -0.5

    def entry():
        flash_mla_with_kvcache(q, k0, None, None, 512, meta, None, scale, False, True, i0, sink, k1, i1,
                               None, None)

    blocks0, layout, bs0 = _cache_bytes("k_cache", k0, True, d)
    blocks1, _, bs1 = _cache_bytes("extra_k_cache", k1, True, d)
    splits, split_len, ws_bytes = decode_schedule(b, s_q, h, 640, planner_sms(dev), 512)
    ws = torch.empty(max(ws_bytes, 16), dtype=torch.uint8, device=dev)
    out = torch.empty((b, s_q, h, 512), dtype=torch.bfloat16, device=dev)
    lse = torch.empty((b, s_q, h), dtype=torch.float32, device=dev)
    args = (q, blocks0, layout, bs0, i0, None, blocks1, layout, bs1, i1, None, sink, scale, 512, splits,
            split_len, ws_bytes, ws, out, lse)
    stream = stream_handle(q)

    row("flash_mla_with_kvcache (CONFIG1, b 128)", host_us(entry))
    row("  ops.sparse_decode (fast caller, arguments prepared)", host_us(lambda: ops.sparse_decode(*args)))
    row("  torch.ops.dsv4.sparse_decode (registered op)", host_us(lambda: torch.ops.dsv4.sparse_decode(*args)))
    row("  _C.sparse_decode (stream given)", host_us(lambda: _C.sparse_decode(*args, stream)))
    row("  stream_handle(q)", host_us(lambda: stream_handle(q)))

    def guard():
        with device_guard(q):
            pass

    row("  device_guard(q) entered and left", host_us(guard))
    row("  torch.empty((b, s_q, h), fp32, cuda)",
        host_us(lambda: torch.empty((b, s_q, h), dtype=torch.float32, device=dev)))
    row("  decode_schedule + planner_sms", host_us(lambda: decode_schedule(b, s_q, h, 640, planner_sms(dev), 512)))
    row("  _cache_bytes(k_cache)", host_us(lambda: _cache_bytes("k_cache", k0, True, d)))

    s_q_p, topk = 64, 512
    qp = torch.randn(s_q_p, h, d, dtype=torch.bfloat16, device=dev)
    kv = torch.randn(8192, 1, d, dtype=torch.bfloat16, device=dev)
    ip = torch.randint(0, 8192, (s_q_p, 1, topk), dtype=torch.int32, device=dev)
    op = torch.empty((s_q_p, h, 512), dtype=torch.bfloat16, device=dev)
    ml = torch.empty((s_q_p, h), dtype=torch.float32, device=dev)
    lp = torch.empty((s_q_p, h), dtype=torch.float32, device=dev)
    row("flash_mla_sparse_fwd (s_q 64, H 64, topk 512, sink)",
        host_us(lambda: flash_mla_sparse_fwd(qp, kv, ip, scale, attn_sink=sink)))
    row("  _C.sparse_prefill (stream given)",
        host_us(lambda: _C.sparse_prefill(qp, kv, ip, None, sink, scale, 512, op, ml, lp, None, stream)))
    row("  torch.empty x3 (the entry's outputs)", host_us(lambda: (
        torch.empty((s_q_p, h, 512), dtype=torch.bfloat16, device=dev),
        torch.empty((s_q_p, h), dtype=torch.float32, device=dev),
        torch.empty((s_q_p, h), dtype=torch.float32, device=dev))))


if __name__ == "__main__":
    main()

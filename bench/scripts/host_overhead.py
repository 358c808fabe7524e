"""Host time per call of FlashMLA's Python entry points and dsv4attn.flash_mla's, side by side.

A serving engine that calls an attention kernel outside a CUDA graph (prefill, eager decode) pays
the entry point's host time on every call, and when the host is what the GPU waits for, that
time is the step's time. This measures it for both implementations on FlashMLA's own inputs
(tests/lib.py's generators, as side_by_side.py uses them, under its default device; the timing
runs with none, as a serving engine's forward does: torch.set_default_device installs a torch
function mode that every torch call in Python then goes through): the mean host µs from the Python call
to its return, over batches of calls queued behind ~100 ms of GPU sleep, so no call waits for the
GPU and the kernels' own duration does not count. Median of 5 batches.

Cases: flash_mla_sparse_fwd (V4-Flash shape, 64 tokens so the queued GPU work stays small),
flash_mla_with_kvcache (V4-Flash CONFIG1 decode, b 128, FlashMLA's current interface, metadata
made once), get_mla_metadata. For dsv4attn also torch.ops.dsv4.sparse_prefill called directly
(the registered op's dispatch, which dsv4attn.flash_mla skips in eager mode: python/dsv4attn/ops.py).

Run on the device, with FlashMLA built (.peers/flashmla/build.sh /tmp/flashmla) and dsv4attn's
extension built for the device's python3:
  PYTHONPATH=/tmp/flashmla:/tmp/flashmla/tests:$PWD/.peers/flashmla:$PWD/build/python:$PWD/third_party/pylib \\
    python3 bench/scripts/host_overhead.py
"""
from __future__ import annotations

import torch

import flash_mla as fm_real
import lib
from lib import RawTestParamForDecode, TestParam

import dsv4attn.flash_mla as fm_d4  # also registers torch.ops.dsv4.*
from host_timing import host_us


def main() -> None:
    torch.set_default_dtype(torch.bfloat16)
    torch.set_default_device("cuda:0")
    torch.cuda.set_device(0)
    print(f"{torch.cuda.get_device_name(0)}, torch {torch.__version__}")
    print(f"{'entry point':44s} {'FlashMLA µs':>12s} {'dsv4attn µs':>12s}")

    p = TestParam(64, 8192, 512, h_q=64, d_qk=512, have_attn_sink=True, seed=1)
    t = lib.generate_testcase(p)

    def prefill(mod):
        return lambda: mod.flash_mla_sparse_fwd(t.q, t.kv, t.indices, sm_scale=t.sm_scale,
                                                attn_sink=t.attn_sink, topk_length=t.topk_length)

    out = torch.empty((p.s_q, p.h_q, 512), dtype=torch.bfloat16)
    ml = torch.empty((p.s_q, p.h_q), dtype=torch.float32)
    lse = torch.empty((p.s_q, p.h_q), dtype=torch.float32)
    registered = lambda: torch.ops.dsv4.sparse_prefill(t.q, t.kv, t.indices, t.topk_length, t.attn_sink,  # noqa: E731
                                                       t.sm_scale, 512, out, ml, lse)

    raw = RawTestParamForDecode(128, 64, 2, 1, 16384, True, topk=128, d_qk=512, extra_s_k=16384,
                                extra_topk=512, block_size=256, extra_block_size=64, seed=1)
    dp = raw.to_test_param()
    dt = lib.generate_testcase_for_decode(dp)
    k0 = dt.kv_scope.get_kvcache_for_flash_mla()
    k1 = dt.extra_kv_scope.get_kvcache_for_flash_mla()

    def decode(mod):
        meta, _ = mod.get_mla_metadata()
        return lambda: mod.flash_mla_with_kvcache(
            dt.q, k0, None, None, dp.d_v, meta, None, dt.sm_scale, False, True,
            dt.kv_scope.indices_in_kvcache, dt.attn_sink, k1, dt.extra_kv_scope.indices_in_kvcache,
            dt.kv_scope.topk_length, None)

    torch.set_default_device(None)  # the inputs are made; the calls run as in a serving engine
    row("flash_mla_sparse_fwd (s_q 64, H 64, topk 512)", host_us(prefill(fm_real)), host_us(prefill(fm_d4)))
    row("  torch.ops.dsv4.sparse_prefill (registered)", None, host_us(registered))
    row("flash_mla_with_kvcache (CONFIG1, b 128)", host_us(decode(fm_real)), host_us(decode(fm_d4)))
    row("get_mla_metadata()", host_us(lambda: fm_real.get_mla_metadata()),
        host_us(lambda: fm_d4.get_mla_metadata()))


def row(name: str, flashmla: float | None, ours: float) -> None:
    fm = f"{flashmla:12.1f}" if flashmla is not None else f"{'':12s}"
    print(f"{name:44s} {fm} {ours:12.1f}", flush=True)


if __name__ == "__main__":
    main()

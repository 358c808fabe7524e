#!/usr/bin/env python3
"""ncu_side_by_side.py CASE...: runs FlashMLA's decode performance cases once through FlashMLA and
once through dsv4attn.flash_mla, on FlashMLA's own inputs, so that Nsight Compute can profile both
decode kernels in one process (device_session.sh's `flashmla-ncu` step wraps it in ncu).

Needs what side_by_side.py needs (the measurement-only FlashMLA build, its tests/ helpers, and
.peers/flashmla on the path for side_by_side.with_impl). Cases, as FlashMLA's test parameters:
  peak64, peak128         topk 16384 over a 32k context, b 148, s_q 2, H 64 / 128, d 512
  flash128                V4-Flash: H 64, 128 (block 256) + 512 (block 64), b 128, s_q 2
  flash2                  the same at b 2 (four query rows: the split kernel and the combine
                          are latency-bound; add the combines to the step's kernel regex)
  pro128                  V4-Pro: H 128, 128 + 1024, b 128, s_q 2
  v32                     V3.2: H 128, topk 2048, d 576, b 128, s_q 2
and FlashMLA's prefill performance cases (s_q 4096, attn_sink, s_kv 8192), both prefill kernels:
  prefill_v32             H 128, topk 2048, d 576
  prefill_flash           V4-Flash: H 64, topk 512, d 512
  prefill_pro             V4-Pro: H 128, topk 1024, d 512
  prefill_v32_h64         V3.2's shape at H 64: one head group a token, so no two CTAs gather
                          the same rows (against prefill_v32 for the L2 sectors each reads)
  prefill_v32_64k, _128k  prefill_v32 at s_kv 65536 / 131072, whose kv (75 / 151 MB of bf16 rows)
                          exceeds the L2, so part of the rows come from DRAM
  prefill_pro_64k         prefill_pro at s_kv 65536 (64 MB of rows, beyond the L2 too)
"""
import os
import sys

import torch
import lib  # FlashMLA's tests/lib.py
import flash_mla
import dsv4attn.flash_mla as ours
from lib import RawTestParamForDecode as Raw
from lib import TestParam

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "..", ".peers", "flashmla"))
import side_by_side  # noqa: E402  (its with_impl points lib's calls at one implementation)

CASES = {
    "peak64": Raw(148, 64, 2, 1, 32768, True, topk=16384, d_qk=512),
    "peak128": Raw(148, 128, 2, 1, 32768, True, topk=16384, d_qk=512),
    "flash128": Raw(128, 64, 2, 1, 16384, True, topk=128, d_qk=512, extra_s_k=16384, extra_topk=512,
                    block_size=256, extra_block_size=64),
    "flash2": Raw(2, 64, 2, 1, 16384, True, topk=128, d_qk=512, extra_s_k=16384, extra_topk=512,
                  block_size=256, extra_block_size=64),
    "pro128": Raw(128, 128, 2, 1, 16384, True, topk=128, d_qk=512, extra_s_k=16384, extra_topk=1024,
                  block_size=256, extra_block_size=64),
    "v32": Raw(128, 128, 2, 1, 32768, True, topk=2048, d_qk=576),
}
PREFILL_CASES = {
    "prefill_v32": TestParam(4096, 8192, 2048, h_q=128, d_qk=576, have_attn_sink=True),
    "prefill_flash": TestParam(4096, 8192, 512, h_q=64, d_qk=512, have_attn_sink=True),
    "prefill_pro": TestParam(4096, 8192, 1024, h_q=128, d_qk=512, have_attn_sink=True),
    "prefill_v32_h64": TestParam(4096, 8192, 2048, h_q=64, d_qk=576, have_attn_sink=True),
    "prefill_v32_64k": TestParam(4096, 65536, 2048, h_q=128, d_qk=576, have_attn_sink=True),
    "prefill_v32_128k": TestParam(4096, 131072, 2048, h_q=128, d_qk=576, have_attn_sink=True),
    "prefill_pro_64k": TestParam(4096, 65536, 1024, h_q=128, d_qk=512, have_attn_sink=True),
}


def main():
    torch.set_default_dtype(torch.bfloat16)
    torch.set_default_device("cuda:0")
    for name in sys.argv[1:]:
        if name in PREFILL_CASES:
            p = PREFILL_CASES[name]
            p.seed = 1
            t = lib.generate_testcase(p)
            for mod in (flash_mla, ours):
                side_by_side.with_impl(mod, lambda: lib.run_flash_mla_sparse_fwd(p, t, False))
                torch.cuda.synchronize()
            print("ran", name, flush=True)
            continue
        p = CASES[name].to_test_param()
        p.seed = 1
        t = lib.generate_testcase_for_decode(p)
        for mod in (flash_mla, ours):
            meta, _ = mod.get_mla_metadata()
            side_by_side.with_impl(mod, lambda: lib.run_flash_mla_decode(p, t, meta, None))
            torch.cuda.synchronize()
        print("ran", name, flush=True)


if __name__ == "__main__":
    main()

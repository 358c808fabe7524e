"""CUDA-only behaviour (skipped without a GPU): ops run on torch's current stream of the tensors'
device and never synchronize the host (torch's sync debug mode turns a sync into an error)."""
import torch

from conftest import requires_cuda
from dsv4attn.flash_mla import (alloc_kv_cache, flash_mla_sparse_fwd, flash_mla_with_kvcache,
                                get_mla_metadata)


def _decode_inputs():
    # Random bytes below 0x78 are finite fp8 values and scale exponents <= 2^-8.
    cache = alloc_kv_cache(8, 64, device="cuda")
    cache.copy_(torch.randint(0, 0x78, cache.shape, dtype=torch.uint8, device="cuda"))
    q = torch.randn(4, 1, 64, 512, dtype=torch.bfloat16, device="cuda")
    idx = torch.randint(-1, 512, (4, 1, 128), dtype=torch.int32, device="cuda")
    return q, cache, idx


@requires_cuda
def test_no_host_sync_and_current_stream():
    q, cache, idx = _decode_inputs()
    kv = torch.randn(300, 1, 512, dtype=torch.bfloat16, device="cuda")
    pidx = torch.randint(-1, 300, (4, 1, 128), dtype=torch.int32, device="cuda")
    meta = get_mla_metadata()[0]
    want_dec = flash_mla_with_kvcache(q, cache, None, None, 512, meta,
                                      is_fp8_kvcache=True, indices=idx)
    want_pre = flash_mla_sparse_fwd(q[:, 0], kv, pidx, 0.05)
    torch.cuda.synchronize()
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    torch.cuda.set_sync_debug_mode("error")
    try:
        with torch.cuda.stream(side):
            got_dec = flash_mla_with_kvcache(q, cache, None, None, 512, meta,
                                             is_fp8_kvcache=True, indices=idx)
            got_pre = flash_mla_sparse_fwd(q[:, 0], kv, pidx, 0.05)
    finally:
        torch.cuda.set_sync_debug_mode("default")
    side.synchronize()
    assert torch.equal(got_dec[0], want_dec[0]) and torch.equal(got_dec[1], want_dec[1])
    assert all(torch.equal(a, b) for a, b in zip(got_pre, want_pre))


@requires_cuda
def test_cuda_matches_cpu():
    q, cache, idx = _decode_inputs()
    out, lse = flash_mla_with_kvcache(q, cache, None, None, 512, get_mla_metadata()[0],
                                      is_fp8_kvcache=True, indices=idx)
    cache_c = alloc_kv_cache(8, 64)  # same bytes, same padded block stride, on the host
    cache_c.copy_(cache.cpu())
    out_c, lse_c = flash_mla_with_kvcache(q.cpu(), cache_c, None, None, 512,
                                          get_mla_metadata()[0], is_fp8_kvcache=True,
                                          indices=idx.cpu())
    assert torch.allclose(out.cpu().float(), out_c.float(), atol=2e-2, rtol=2e-2)
    finite = torch.isfinite(lse_c)
    assert torch.allclose(lse.cpu()[finite], lse_c[finite], atol=1e-3)

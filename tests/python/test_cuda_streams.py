"""CUDA-only behaviour (skipped without a GPU): ops run on torch's current stream of the tensors'
device and never synchronize the host (torch's sync debug mode turns a sync into an error)."""
import torch

from conftest import requires_cuda
from dsv4attn.flash_mla import (alloc_kv_cache, flash_mla_sparse_fwd, flash_mla_with_kvcache,
                                get_mla_metadata, kv_cache_block_bytes)


def _flat(cache):
    # The [num_blocks, block_bytes] byte view under FlashMLA's padded [blocks, B, 1, 584] view.
    bb = kv_cache_block_bytes("model1_fp8", cache.shape[1])
    return cache.as_strided((cache.shape[0], bb), (bb, 1))


def _decode_inputs():
    # A cache of real tokens (N(0, 1) values encoded as MODEL1 on the host): random bytes would
    # make bf16 rope values up to 1e12, whose logits no two summation orders agree on.
    host = alloc_kv_cache(8, 64)
    torch.ops.dsv4.kv_quantize(_flat(host), "model1_fp8", 64, 1.0, torch.randn(512, 512),
                               torch.arange(512, dtype=torch.int64))
    cache = alloc_kv_cache(8, 64, device="cuda")
    _flat(cache).copy_(_flat(host))
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
    _flat(cache_c).copy_(_flat(cache).cpu())
    out_c, lse_c = flash_mla_with_kvcache(q.cpu(), cache_c, None, None, 512,
                                          get_mla_metadata()[0], is_fp8_kvcache=True,
                                          indices=idx.cpu())
    assert torch.allclose(out.cpu().float(), out_c.float(), atol=2e-2, rtol=2e-2)
    finite = torch.isfinite(lse_c)
    assert torch.allclose(lse.cpu()[finite], lse_c[finite], atol=1e-3)

"""dsv4attn.vllm_ops against float64 / pure-Python references of vLLM's semantics.

Tolerances: bf16 outputs 1e-2 relative to the row scale (one bf16 rounding of an fp32 result);
FP8 values by construction: the reference rounds the same float64 inputs with UE8M0 scales, so
the dequantized fp8 may differ only where the bf16/fp32 inputs round differently (<= one fp8 step,
2^-3 relative to the block scale · 448 / 2).
"""
import pytest
import torch

import dsv4attn
from dsv4attn import vllm_ops
from dsv4attn.flash_mla import kv_cache_block_bytes
import reference as ref
from conftest import requires_cuda


def model1_cache(num_blocks, block_size, device):
    return torch.zeros((num_blocks, kv_cache_block_bytes("model1_fp8", block_size)),
                       dtype=torch.uint8, device=device)


def test_fused_q_kv_rmsnorm(device):
    qr = torch.randn(5, 128, dtype=torch.bfloat16, device=device)
    kv = torch.randn(5, 512, dtype=torch.bfloat16, device=device) * 3
    wq = torch.rand(128, dtype=torch.bfloat16, device=device) + 0.5
    wkv = torch.rand(512, dtype=torch.bfloat16, device=device) + 0.5
    q_out, kv_out = vllm_ops.fused_q_kv_rmsnorm(qr, kv, wq, wkv, 1e-6)
    for got, x, w in ((q_out, qr, wq), (kv_out, kv, wkv)):
        want = ref.rms_norm(x.cpu(), w.cpu())
        assert got.dtype == torch.bfloat16
        assert torch.allclose(got.cpu().double(), want, rtol=1e-2, atol=1e-2)


@pytest.mark.parametrize("num_heads", [16, 64])
def test_qnorm_rope_kv_insert(device, num_heads):
    T, D, B = 6, 512, 16
    q = torch.randn(T, num_heads, D, dtype=torch.bfloat16, device=device)
    kv = torch.randn(T, D, dtype=torch.bfloat16, device=device)
    positions = torch.tensor([0, 1, 7, 300, 4095, 12], dtype=torch.int64, device=device)
    slots = torch.tensor([3, 17, -1, 40, 0, 63], dtype=torch.int64, device=device)
    cache = model1_cache(4, B, device)
    cos_sin = dsv4attn.rope_cos_sin(4096, device=device)
    q_in, kv_in = q.clone(), kv.clone()
    # vLLM passes kv_cache.view(num_blocks, -1) of its [num_blocks, B, 584] cache, whose blocks
    # are padded to a multiple of 576 bytes: [num_blocks, B * 584] with the padded row stride.
    vllm_view = cache.as_strided((4, B * 584), (cache.stride(0), 1))
    vllm_ops.fused_deepseek_v4_qnorm_rope_kv_rope_quant_insert(q, kv, vllm_view, slots, positions,
                                                               cos_sin, 1e-6, B)
    want_q = ref.rope(ref.rms_norm(q_in.cpu()), positions.cpu())
    assert torch.allclose(q.cpu().double(), want_q, rtol=1e-2, atol=2e-2)
    assert torch.equal(kv, kv_in), "vLLM's op leaves kv unchanged"
    want_kv = ref.rope(kv_in.cpu()[:, None, :], positions.cpu())[:, 0]
    written = [t for t in range(T) if slots[t] >= 0]
    got = ref.decode_model1(cache.cpu(), B, [int(slots[t]) for t in written])
    want_nope, _ = ref.quantize_blocks(want_kv[written, :448], 64)
    assert torch.allclose(got[:, :448], want_nope, rtol=0.07, atol=1e-3)
    assert torch.allclose(got[:, 448:], want_kv[written, 448:], rtol=1e-2, atol=1e-2)
    untouched = torch.ones(4 * B, dtype=torch.bool)
    untouched[[int(slots[t]) for t in written]] = False
    assert torch.all(ref.decode_model1(cache.cpu(), B, untouched.nonzero().view(-1).tolist()) == 0)


@pytest.mark.parametrize("with_gather_lens", [False, True])
def test_dequantize_and_gather_k_cache(device, with_gather_lens):
    B, nb, M, offset = 8, 10, 40, 5
    cache = model1_cache(nb, B, device)
    values = torch.randn(nb * B, 512)
    torch.ops.dsv4.kv_quantize(cache.cpu() if device.type != "cpu" else cache, "model1_fp8", B,
                               1.0, values, torch.arange(nb * B))
    block_table = torch.tensor([[3, 1, 7, -1], [0, 9, 2, 5]], dtype=torch.int32)
    seq_lens = torch.tensor([20, 29], dtype=torch.int32)
    gather_lens = torch.tensor([6, 29], dtype=torch.int32) if with_gather_lens else None
    out = torch.full((2, M, 512), float("nan"), dtype=torch.bfloat16, device=device)
    vllm_ops.dequantize_and_gather_k_cache(
        out, cache.view(nb, -1)[:, :].as_strided((nb, B, 584), (cache.stride(0), 584, 1)),
        seq_lens.to(device), gather_lens.to(device) if gather_lens is not None else None,
        block_table.to(device), B, offset)
    for r in range(2):
        g = int(gather_lens[r]) if with_gather_lens else int(seq_lens[r])
        entries = range(int(seq_lens[r]) - g, int(seq_lens[r]))
        slots = [int(block_table[r, e // B]) * B + e % B for e in entries]
        want = ref.decode_model1(cache.cpu(), B, slots)
        got = out[r, offset:offset + g].cpu().double()
        assert torch.allclose(got, want, rtol=1e-2, atol=1e-2)
        assert torch.all(torch.isnan(out[r, :offset].float()))
        assert torch.all(torch.isnan(out[r, offset + g:].float()))


def python_combine(topk_indices, qsl, seq_lens, gather_lens, W, topk, M, N):
    rows, lens = [], []
    T0 = qsl[0]
    for r in range(len(seq_lens)):
        for t in range(qsl[r], qsl[r + 1]):
            p = seq_lens[r] - (qsl[r + 1] - t)
            comp = [r * M + i for i in topk_indices[t - T0][:topk] if i >= 0]
            first = seq_lens[r] - gather_lens[r]
            window = [r * M + N + (pos - first) for pos in range(max(0, p - W + 1), p + 1)]
            row = comp + window
            lens.append(len(row))
            rows.append(row + [-1] * (topk + W - len(row)))
    return rows, lens


def combine_inputs(device):
    """Three prefill requests (the last shorter than the window) of a batch slice starting at
    token 10, each token's top-k a random causal pick, -1 padded."""
    W, ratio, N, topk = 4, 4, 8, 3
    seq_lens, gather_lens = [13, 7, 2], [6, 7, 2]
    qsl = [10, 13, 17, 19]  # a slice of a bigger batch: tokens 10.. (decodes before it)
    T = qsl[-1] - qsl[0]
    topk_indices = torch.full((T, 5), -1, dtype=torch.int32)
    for r in range(3):
        for t in range(qsl[r], qsl[r + 1]):
            p = seq_lens[r] - (qsl[r + 1] - t)
            picks = torch.randperm((p + 1) // ratio)[:topk]
            topk_indices[t - qsl[0], :len(picks)] = picks.to(torch.int32)
    i32 = torch.int32
    tensors = [topk_indices, torch.tensor(qsl, dtype=i32), torch.tensor(seq_lens, dtype=i32),
               torch.tensor(gather_lens, dtype=i32)]
    return [t.to(device) for t in tensors], (W, ratio, topk, N + W + 16, N)


def test_combine_topk_swa_indices(device):
    (topk_indices, qsl, seq_lens, gather_lens), (W, ratio, topk, M, N) = combine_inputs(device)
    got, got_lens = vllm_ops.combine_topk_swa_indices(topk_indices, qsl, seq_lens, gather_lens,
                                                      W, ratio, topk, M, N)
    assert got.device == device and got_lens.device == device
    want, want_lens = python_combine(topk_indices.tolist(), qsl.tolist(), seq_lens.tolist(),
                                     gather_lens.tolist(), W, topk, M, N)
    assert got.tolist() == want and got_lens.tolist() == want_lens


def global_inputs(device):
    """Random local entry numbers (some -1, some beyond the table or in unmapped blocks) of 6
    tokens over 3 requests' tables."""
    B, R, max_blocks, T, K = 4, 3, 5, 6, 7
    table = torch.randperm(40)[:R * max_blocks].view(R, max_blocks).to(torch.int32)
    table[0, 3] = -1
    local = torch.randint(-1, B * max_blocks + 6, (T, K), dtype=torch.int32)
    token_to_req = torch.randint(0, R, (T,), dtype=torch.int32)
    valid = torch.rand(T) < 0.7
    return [t.to(device) for t in (local, token_to_req, table, valid)], B


def test_compute_global_topk_indices_and_lens(device):
    (local, token_to_req, table, valid), B = global_inputs(device)
    got, lens = vllm_ops.compute_global_topk_indices_and_lens(local, token_to_req, table, B,
                                                              valid)
    assert got.device == device and lens.device == device
    tab = table.tolist()

    def g(r, i):
        if i < 0 or i // B >= len(tab[r]) or tab[r][i // B] < 0:
            return -1
        return tab[r][i // B] * B + i % B

    want = [[g(int(r), int(i)) if v else -1 for i in row]
            for row, r, v in zip(local.tolist(), token_to_req.tolist(), valid.tolist())]
    assert got.tolist() == want
    assert lens.tolist() == [sum(v >= 0 for v in row) for row in want]


@requires_cuda
def test_index_helpers_cuda_no_host_sync():
    """On CUDA tensors both helpers run the C++ CUDA kernels without synchronizing the host
    (torch raises on any synchronizing call in "error" mode) and give the CPU's results."""
    dev = torch.device("cuda")
    (topk_indices, qsl, seq_lens, gather_lens), scalars = combine_inputs(dev)
    (local, token_to_req, table, valid), B = global_inputs(dev)
    torch.cuda.synchronize()
    torch.cuda.set_sync_debug_mode("error")
    try:
        combined = vllm_ops.combine_topk_swa_indices(topk_indices, qsl, seq_lens, gather_lens,
                                                     *scalars)
        global_ = vllm_ops.compute_global_topk_indices_and_lens(local, token_to_req, table, B,
                                                                valid)
    finally:
        torch.cuda.set_sync_debug_mode("default")
    want_combined = vllm_ops.combine_topk_swa_indices(
        *(t.cpu() for t in (topk_indices, qsl, seq_lens, gather_lens)), *scalars)
    want_global = vllm_ops.compute_global_topk_indices_and_lens(
        *(t.cpu() for t in (local, token_to_req, table)), B, valid.cpu())
    for got, want in zip(combined + global_, want_combined + want_global):
        assert torch.equal(got.cpu(), want)


@requires_cuda
def test_combine_topk_swa_indices_cuda_drops_what_cpu_rejects():
    """Data the CPU rejects (a non-causal top-k entry) is an error there; the CUDA kernel, which
    reads no value on the host, leaves the entry out and keeps the row packed."""
    (topk_indices, qsl, seq_lens, gather_lens), (W, ratio, topk, M, N) = combine_inputs("cpu")
    bad = topk_indices.clone()
    bad[0, 0] = N - 1  # token 0 sits at position 10 of request 0: it sees entries 0 and 1 only
    with pytest.raises(dsv4attn.Error, match="combine_topk_swa_indices"):
        vllm_ops.combine_topk_swa_indices(bad, qsl, seq_lens, gather_lens, W, ratio, topk, M, N)
    got, lens = vllm_ops.combine_topk_swa_indices(
        *(t.cuda() for t in (bad, qsl, seq_lens, gather_lens)), W, ratio, topk, M, N)
    dropped = topk_indices.clone()
    dropped[0, :topk] = torch.cat([topk_indices[0, 1:topk], torch.tensor([-1], dtype=torch.int32)])
    want, want_lens = python_combine(dropped.tolist(), qsl.tolist(), seq_lens.tolist(),
                                     gather_lens.tolist(), W, topk, M, N)
    assert got.tolist() == want and lens.tolist() == want_lens


@pytest.mark.parametrize("n_groups,heads_per_group", [(4, 4), (8, 8)])
@pytest.mark.parametrize("tma_aligned_scales", [False, True])
def test_fused_inv_rope_fp8_quant(device, n_groups, heads_per_group, tma_aligned_scales):
    T, D = 5, 512
    H = n_groups * heads_per_group
    o = (torch.randn(T, H, D) * torch.rand(T, H, 1) * 4).to(torch.bfloat16).to(device)
    positions = torch.randint(0, 2048, (T,), device=device)
    cos_sin = dsv4attn.rope_cos_sin(2048, device=device)
    o_fp8, o_scale = vllm_ops.fused_inv_rope_fp8_quant(o, positions, cos_sin, n_groups,
                                                       heads_per_group,
                                                       tma_aligned_scales=tma_aligned_scales)
    d = heads_per_group * D
    assert o_fp8.shape == (T, n_groups, d) and o_fp8.dtype == torch.float8_e4m3fn
    # The op rounds the rotated o to bf16 (what a bf16 o holds after apply_rope) before FP8.
    want = ref.rope(o.cpu(), positions.cpu(), inverse=True).to(torch.bfloat16).reshape(T, n_groups, d)
    want_q, want_scale = ref.quantize_blocks(want, 128)
    if tma_aligned_scales:
        assert o_scale.dtype == torch.int32 and o_scale.shape == (T, n_groups, d // 128 // 4)
        exps = torch.stack([(o_scale.cpu() >> s) & 0xFF for s in (0, 8, 16, 24)], -1)
        scale = torch.pow(2.0, exps.reshape(T, n_groups, -1).double() - 127)
    else:
        assert o_scale.shape == (T, n_groups, d // 128) and o_scale.dtype == torch.float32
        scale = o_scale.cpu().double()
    assert torch.equal(scale, want_scale)
    got = o_fp8.cpu().double().view(T, n_groups, -1, 128) * scale[..., None]
    step = want_scale[..., None] * 32  # one e4m3 step at the top binade (2^-3 · 256)
    assert torch.all((got - want_q.view_as(got)).abs() <= step)


def test_o_projection_fp8_einsum(device):
    """inverse RoPE + FP8 quant + grouped FP8 einsum == float64 einsum of the dequantized
    operands. The products are exact; the CPU sums them in fp32 (1e-4), the GPU's FP8 tensor
    cores keep about 14 mantissa bits within each 128-deep slice, so there the bound is the CUDA
    FP8 GEMM tests' 2e-3 · Σ|o w| (tests/cuda/test_fp8_gemm_cpu_vs_cuda.cpp; measured on the
    H200: 2e-4 absolute here, against a bound of about 4e-2)."""
    T, G, hpg, D, L = 3, 4, 2, 512, 128
    o = torch.randn(T, G * hpg, D, dtype=torch.bfloat16, device=device)
    positions = torch.tensor([0, 9, 77], device=device)
    o_fp8, o_scale = vllm_ops.fused_inv_rope_fp8_quant(o, positions, dsv4attn.rope_cos_sin(128,
                                                       device=device), G, hpg)
    Dg = hpg * D
    w_real = torch.randn(G * L, Dg) / 30
    w_scale = ref.ue8m0_scale(w_real.view(G * L // 128, 128, Dg // 128, 128).abs()
                              .amax(dim=(1, 3)).double())
    w_fp8 = (w_real.double().view(G * L // 128, 128, Dg // 128, 128)
             / w_scale[:, None, :, None]).view(G * L, Dg).float().to(torch.float8_e4m3fn)
    z = torch.full((T, G, L), float("nan"), dtype=torch.float32, device=device)
    vllm_ops.deepseek_v4_fp8_einsum(o_fp8, o_scale, w_fp8.to(device), w_scale.float().to(device),
                                    z, "bhr,hdr->bhd", [1, 128, 128])
    o_deq = (o_fp8.cpu().double().view(T, G, -1, 128) * o_scale.cpu().double()[..., None])
    w_deq = (w_fp8.double().view(G * L // 128, 128, Dg // 128, 128)
             * w_scale[:, None, :, None]).view(G, L, Dg)
    want = torch.einsum("tgr,glr->tgl", o_deq.view(T, G, Dg), w_deq)
    if device.type == "cuda":
        abs_sum = torch.einsum("tgr,glr->tgl", o_deq.view(T, G, Dg).abs(), w_deq.abs())
        assert torch.all((z.cpu().double() - want).abs() <= 2e-3 * abs_sum + 1e-6)
    else:
        assert torch.allclose(z.cpu().double(), want, rtol=1e-4, atol=1e-4)


def test_vllm_ops_errors():
    o = torch.randn(2, 16, 512, dtype=torch.bfloat16)
    cos_sin = dsv4attn.rope_cos_sin(64)
    with pytest.raises(dsv4attn.Error, match="n_groups"):
        vllm_ops.fused_inv_rope_fp8_quant(o, torch.zeros(2, dtype=torch.int64), cos_sin, 3, 4)
    with pytest.raises(dsv4attn.Error, match="positions"):
        vllm_ops.fused_inv_rope_fp8_quant(o, torch.full((2,), 100, dtype=torch.int64), cos_sin,
                                          4, 4)
    cache = torch.zeros(2, 1000, dtype=torch.uint8)
    with pytest.raises(dsv4attn.Error, match="k_cache"):
        vllm_ops.dequantize_and_gather_k_cache(
            torch.zeros(1, 8, 512, dtype=torch.bfloat16), cache,
            torch.tensor([4], dtype=torch.int32), None, torch.zeros(1, 1, dtype=torch.int32), 16, 0)
    with pytest.raises(dsv4attn.Error, match="equation"):
        vllm_ops.deepseek_v4_fp8_einsum(torch.zeros(1, 1, 128), torch.zeros(1, 1, 1),
                                        torch.zeros(128, 128), torch.zeros(1, 1),
                                        torch.zeros(1, 1, 128), "bhd,hdr->bhr")

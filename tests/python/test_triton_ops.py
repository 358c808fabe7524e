"""The Triton backend's row ops against the CPU reference ops (torch.ops.dsv4 on CPU tensors):
number formats, the fused q-norm + RoPE + KV insert for every cache layout, the prefill gather,
norms, RoPE, FP8 activation quantization (plain and fused with the inverse RoPE), block
dequantization, and the torch GEMMs.

Tolerances. Encodings (fp8 codes, UE8M0 / fp32 scales, bf16 rope dims, cache bytes) follow the
same integer rules as dtype.h, so they are compared bit for bit whenever the values encoded are
the same. Values computed in fp32 before an encoding may differ by the order of a sum (RMSNorm
tree sums; on a GPU also fused multiply-adds in the RoPE rotation): <= 1 bf16 ulp per output,
and codes quantized from such values may move by one step in rare elements (stated per test).
"""
import math

import pytest
import torch

from triton_support import DEVICE, ON_GPU, bf16_ulps, fp8_codes, gpu_or, op, poisoned, to_dev

LAYOUTS = ["model1_fp8", "v32_fp8", "bf16", "fp8_per_tensor"]


def layout_dim(layout):
    return 576 if layout == "v32_fp8" else 512


def geometry(layout, block_size):
    return dsv4_geometry(layout, block_size)["block_bytes"]


def dsv4_geometry(layout, block_size):
    import dsv4attn
    return dsv4attn._runtime.kv_geometry(layout, block_size)


# ---------------------------------------------------------------- number formats
def test_fp8_decode_every_code():
    """Every e4m3fn byte decodes exactly as torch's float8_e4m3fn (NaN codes as NaN), read through
    an FP8_PER_TENSOR cache with scale 1."""
    cache = torch.zeros(1, 2 * 512, dtype=torch.uint8)
    cache[0, :256] = torch.arange(256, dtype=torch.uint8)
    cache[0, 512:768] = torch.arange(256, dtype=torch.uint8)
    out = poisoned((2, 512), torch.float32)
    op("kv_dequantize")(to_dev(cache), "fp8_per_tensor", 2, 1.0,
                        to_dev(torch.tensor([0, 1])), out)
    want = torch.arange(256, dtype=torch.uint8).view(torch.float8_e4m3fn).float()
    got = out.cpu()[:, :256]
    for row in got:
        assert torch.equal(row.isnan(), want.isnan())
        assert torch.equal(row.nan_to_num(0.0), want.nan_to_num(0.0))
        # Signs of the numbers only: GPU arithmetic may return the canonical NaN for a negative
        # NaN code (measured on the H100: 0xFF decoded with its sign bit clear), and no consumer
        # reads a NaN's sign.
        num = ~want.isnan()
        assert torch.equal(torch.signbit(row[num]), torch.signbit(want[num]))


def test_fp8_encode_edges_match_reference():
    """Codes and UE8M0 scales of quantize_act_fp8 equal the CPU op's, bit for bit, on the edge
    values of the encoder: zeros of both signs, fp8 subnormals and their ties, round-half-even
    ties between normals, the 448 saturation point, beyond it, inf, NaN, and tiny blocks (floor
    scale 1e-4)."""
    edges = [0.0, -0.0, 2.0 ** -9, 2.0 ** -10, 3 * 2.0 ** -10, 1.5 * 2.0 ** -9, 2.0 ** -6,
             1.0625, 1.1875, -1.0625, 448.0, 464.0, 480.0, -500.0, 1e30, float("inf"),
             float("-inf"), float("nan"), 1e-7, -3e-6]
    x = torch.randn(4, 128)
    x[0, :len(edges)] = torch.tensor(edges)
    x[1] *= 1e-6  # floor scale
    x[2, :len(edges)] = torch.tensor(edges) * 2.0 ** -9
    x[3] *= 1e4
    for scale_dtype in (torch.float32, torch.float8_e8m0fnu):
        q_ref = torch.empty(4, 128, dtype=torch.float8_e4m3fn)
        s_ref = torch.empty(4, 2, dtype=scale_dtype)
        torch.ops.dsv4.quantize_act_fp8(x, 64, q_ref, s_ref)
        q = poisoned((4, 128), torch.uint8).view(torch.float8_e4m3fn)
        s = poisoned((4, 2), torch.uint8).view(scale_dtype) if scale_dtype != torch.float32 \
            else poisoned((4, 2), torch.float32)
        op("quantize_act_fp8")(to_dev(x), 64, q, s)
        # Row 0's block holds inf and NaN, so its scale is NaN and 0 / NaN makes NaN codes whose
        # sign is the platform's (fp8_codes).
        assert torch.equal(fp8_codes(q), fp8_codes(q_ref))
        assert torch.equal(s.cpu().view(torch.uint8), s_ref.view(torch.uint8))


@pytest.mark.parametrize("block", [64, 128])
def test_quantize_act_fp8_random(block):
    x = torch.randn(gpu_or(5, 64), 1024, dtype=torch.float32) * 3
    x = x.bfloat16()
    q_ref = torch.empty(x.shape, dtype=torch.float8_e4m3fn)
    s_ref = torch.empty(x.shape[0], 1024 // block)
    torch.ops.dsv4.quantize_act_fp8(x, block, q_ref, s_ref)
    q = poisoned(x.shape, torch.uint8).view(torch.float8_e4m3fn)
    s = poisoned(s_ref.shape, torch.float32)
    op("quantize_act_fp8")(to_dev(x), block, q, s)
    assert torch.equal(q.cpu().view(torch.uint8), q_ref.view(torch.uint8))
    assert torch.equal(s.cpu(), s_ref)


@pytest.mark.parametrize("shape,blocks", [((2, 200, 300), (128, 128)), ((6, 1024), (1, 128))])
@pytest.mark.parametrize("out_dtype", [torch.bfloat16, torch.float32])
def test_dequantize_fp8_blocks(shape, blocks, out_dtype):
    """Exact (products of fp8 values and powers of two), as the CPU op."""
    x = (torch.randn(shape) * 50).to(torch.float8_e4m3fn)
    grid = list(shape[:-2]) + [math.ceil(shape[-2] / blocks[0]), math.ceil(shape[-1] / blocks[1])]
    scale = torch.exp2(torch.randint(-8, 8, grid).float())
    want = torch.empty(shape, dtype=out_dtype)
    torch.ops.dsv4.dequantize_fp8_blocks(x, scale, *blocks, want)
    got = poisoned(shape, out_dtype)
    op("dequantize_fp8_blocks")(to_dev(x), to_dev(scale), *blocks, got)
    assert torch.equal(got.cpu(), want)


# ---------------------------------------------------------------- norms and RoPE
def test_rms_norm_and_fused_qkv():
    """Within 1 bf16 ulp of the CPU op (fp32 tree sum vs the CPU's sequential sum)."""
    x = torch.randn(gpu_or(6, 64), 4, 512).bfloat16()
    w = (1 + 0.1 * torch.randn(512)).bfloat16()
    want = torch.empty_like(x)
    torch.ops.dsv4.rms_norm(x, w, 1e-6, want)
    got = poisoned(x.shape, torch.bfloat16)
    op("rms_norm")(to_dev(x), to_dev(w), 1e-6, got)
    assert bf16_ulps(got, want).max() <= 1
    inplace = to_dev(x.clone())
    op("rms_norm")(inplace, None, 1e-6, inplace)
    torch.ops.dsv4.rms_norm(x, None, 1e-6, want)
    assert bf16_ulps(inplace, want).max() <= 1

    T = gpu_or(5, 64)
    q, kv = torch.randn(T, 1024), torch.randn(T, 512) * 4
    wq, wkv = (1 + 0.1 * torch.randn(1024)).bfloat16(), (1 + 0.1 * torch.randn(512)).bfloat16()
    wants = [torch.empty(T, 1024).bfloat16(), torch.empty(T, 512).bfloat16()]
    torch.ops.dsv4.fused_qkv_rms_norm(q, wq, kv, wkv, 1e-6, *wants)
    gots = [poisoned((T, 1024), torch.bfloat16), poisoned((T, 512), torch.bfloat16)]
    op("fused_qkv_rms_norm")(*to_dev(q, wq, kv, wkv), 1e-6, *gots)
    for g, w_ in zip(gots, wants):
        assert bf16_ulps(g, w_).max() <= 1


@pytest.mark.parametrize("inverse", [False, True])
def test_apply_rope(inverse):
    """YaRN table, [T, H, D] and [T, D] forms, in place too: within 1 bf16 ulp (fp32 on the CPU:
    exact in the interpreter, an FMA apart on a GPU)."""
    import dsv4attn
    cs = dsv4attn.rope_cos_sin(4096, 64, 160000.0, True, 16.0, 65536)
    T = gpu_or(5, 64)
    pos = torch.randint(0, 4096, (T,))
    for x in (torch.randn(T, 4, 512).bfloat16(), torch.randn(T, 512).bfloat16()):
        want = torch.empty_like(x)
        torch.ops.dsv4.apply_rope(x, pos, cs, inverse, want)
        got = to_dev(x.clone())
        op("apply_rope")(got, *to_dev(pos, cs), inverse, got)
        assert bf16_ulps(got, want).max() <= 1


@pytest.mark.parametrize("block", [128, 64])
def test_inv_rope_fp8_quant_matches_rope_then_quant(block):
    """The fused output-path op equals apply_rope(inverse) then quantize_act_fp8 (1 x block) of
    the CPU ops: bit-exact codes and scales when the rotation rounds alike (always in the
    interpreter); on a GPU an FMA may move a rotated value by one bf16 ulp and so a code by one
    step: at most 0.5% of the codes may differ, each by one code, with equal scales. The scale
    may be strided (the CUDA GEMMs' transposed layout); a token whose position is outside the
    table is left unwritten."""
    import dsv4attn
    cs = dsv4attn.rope_cos_sin(1024, 64)
    T, H = gpu_or(4, 32), gpu_or(4, 64)
    o = torch.randn(T, H, 512).bfloat16()
    pos = torch.randint(0, 1024, (T,))
    rot = torch.empty_like(o)
    torch.ops.dsv4.apply_rope(o, pos, cs, True, rot)
    nb = H * 512 // block
    q_ref = torch.empty(T, H * 512, dtype=torch.float8_e4m3fn)
    s_ref = torch.empty(T, nb)
    torch.ops.dsv4.quantize_act_fp8(rot.view(T, -1), block, q_ref, s_ref)
    pos[-1] = 1024  # outside the table
    q = poisoned((T, H * 512), torch.uint8).view(torch.float8_e4m3fn)
    s = poisoned((nb, T), torch.float32).t()  # [T, nb] with strides (1, T)
    dq = poisoned((T, H * 512), torch.bfloat16)
    op("inv_rope_fp8_quant")(*to_dev(o, pos, cs), block, q, s, o_dequant=dq)
    codes, codes_ref = q.cpu().view(torch.uint8).int(), q_ref.view(torch.uint8).int()
    assert (fp8_codes(q)[-1] == 0x7F).all() and s[-1].isnan().all() and dq[-1].isnan().all()
    codes, codes_ref = codes[:-1], codes_ref[:-1]
    diff = (codes != codes_ref)
    if ON_GPU:
        assert diff.float().mean() <= 5e-3 and (codes - codes_ref).abs().max() <= 1
    else:
        assert not diff.any()
    assert torch.equal(s.cpu()[:-1], s_ref[:-1])
    want_dq = q.cpu().float() * s.cpu().repeat_interleave(block, 1)
    assert torch.equal(dq.cpu().float()[:-1], want_dq[:-1])


# ---------------------------------------------------------------- fused KV insert + gather
def make_insert_case(layout, T, H, block_size=16, num_blocks=6):
    D = layout_dim(layout)
    q = (torch.randn(T, H, D) * 2).bfloat16()
    kv = (torch.randn(T, D) * 3).bfloat16()
    nslots = num_blocks * block_size
    slots = torch.randperm(nslots)[:T]
    slots[1] = -1  # not stored: kv still holds the cached value
    pos = torch.randint(0, 4000, (T,))
    cache = torch.randint(0, 256, (num_blocks, geometry(layout, block_size)), dtype=torch.uint8)
    return q, kv, pos, slots, cache


@pytest.mark.parametrize("layout", LAYOUTS)
def test_qnorm_rope_kv_insert_matches_reference(layout):
    """The cache bytes (every block, including bytes of untouched slots) and kv (the cached
    values) equal the CPU op's bit for bit; q within 1 bf16 ulp (the head-norm's sum order)."""
    import dsv4attn
    cs = dsv4attn.rope_cos_sin(4096, 64, 160000.0, True, 16.0, 65536)
    T, H = gpu_or(6, 40), gpu_or(5, 64)
    q, kv, pos, slots, cache = make_insert_case(layout, T, H)
    ts = 0.37 if layout == "fp8_per_tensor" else 1.0
    want = [q.clone(), kv.clone(), cache.clone()]
    torch.ops.dsv4.qnorm_rope_kv_insert(want[0], want[1], pos, cs, 1e-6, want[2], layout, 16, ts,
                                        slots)
    got = list(to_dev(q, kv, cache))
    op("qnorm_rope_kv_insert")(got[0], got[1], *to_dev(pos, cs), 1e-6, got[2], layout, 16, ts,
                               to_dev(slots))
    assert bf16_ulps(got[0], want[0]).max() <= 1
    if ON_GPU:
        # A GPU may fuse the kv rotation's multiply-adds: the rope dims then differ by <= 1 ulp
        # and an fp8 code quantized from them by one step.
        assert bf16_ulps(got[1], want[1]).max() <= 16  # one fp8 step of a nope value
        assert (got[2].cpu() != want[2]).float().mean() < 2e-3
    else:
        assert torch.equal(got[1].cpu(), want[1])
        assert torch.equal(got[2].cpu(), want[2])


def test_qnorm_rope_kv_insert_skips_bad_positions_and_slots():
    """CUDA semantics for data the CPU rejects: a position outside the table leaves q, kv and
    the cache untouched; a slot outside the cache is not stored."""
    import dsv4attn
    cs = dsv4attn.rope_cos_sin(64, 64)
    q, kv, pos, slots, cache = make_insert_case("model1_fp8", 3, 2)
    pos[:] = torch.tensor([5, 64, 7])       # token 1: outside the table
    slots[:] = torch.tensor([3, 4, 6 * 16])  # token 2: outside the cache
    got = list(to_dev(q, kv, cache))
    op("qnorm_rope_kv_insert")(got[0], got[1], *to_dev(pos, cs), 1e-6, got[2], "model1_fp8", 16,
                               1.0, to_dev(slots))
    assert torch.equal(got[0][1].cpu(), q[1]) and torch.equal(got[1][1].cpu(), kv[1])
    assert not torch.equal(got[1][2].cpu(), kv[2])  # rotated and quantized, not stored
    blk, off = divmod(3, 16)
    changed = (got[2].cpu() != cache).nonzero()[:, 0].unique().tolist()
    assert changed == [blk]  # only token 0's block was written
    del off


@pytest.mark.parametrize("layout", LAYOUTS)
def test_dequantize_and_gather_matches_reference(layout):
    """Bit-exact bf16 rows (dequantization is exact in fp32, then one bf16 rounding); rows not
    gathered keep their contents."""
    D, B = layout_dim(layout), 16
    nb = 8
    cache = torch.zeros(nb, geometry(layout, B), dtype=torch.uint8)
    ts = 0.37 if layout == "fp8_per_tensor" else 1.0
    torch.ops.dsv4.kv_quantize(cache, layout, B, ts, torch.randn(nb * B, D) * 3,
                               torch.arange(nb * B))
    table = torch.tensor([[5, 1, 7, -1], [2, 0, 3, 4]], dtype=torch.int32)
    seq = torch.tensor([40, 60], dtype=torch.int32)
    glen = torch.tensor([20, 33], dtype=torch.int32)
    for gl, offset in ((glen, 5), (None, 0)):
        if gl is None:
            seq = torch.tensor([30, 60], dtype=torch.int32)
        want = torch.full((2, 64, D), 7.0).bfloat16()
        torch.ops.dsv4.dequantize_and_gather(cache, layout, B, ts, table, seq, gl, offset, want)
        got = to_dev(torch.full((2, 64, D), 7.0).bfloat16())
        op("dequantize_and_gather")(to_dev(cache), layout, B, ts, *to_dev(table, seq),
                                    to_dev(gl) if gl is not None else None, offset, got)
        assert torch.equal(got.cpu(), want)


def test_v32_scales_are_read_as_bf16():
    """V3.2's fp32 block scales are read as bf16, rounded to nearest even, as FlashMLA reads them
    (docs/spec.md §7). kv_quantize writes UE8M0 scales (exact either way), so the scales are
    rescaled here by gains that are not powers of two, as another writer's might be: the Triton
    gather and the CPU op agree bit for bit, both equal the float64 reference's values (which
    read the scale as bf16) rounded once to bf16, and many elements differ from what reading the
    fp32 scale would give, so the test can tell the two readings apart."""
    import reference as ref
    D, B, nb = 576, 16, 2
    cache = torch.zeros(nb, geometry("v32_fp8", B), dtype=torch.uint8)
    torch.ops.dsv4.kv_quantize(cache, "v32_fp8", B, 1.0, torch.randn(nb * B, D),
                               torch.arange(nb * B))
    codes, scales = [], []
    for blk in range(nb):  # each block's tokens: B rows of 656 bytes from its start
        tokens = cache[blk, :B * 656].view(B, 656)
        s = tokens[:, 512:528].clone().view(torch.float32)
        s *= torch.empty_like(s).uniform_(1.05, 1.95)
        tokens[:, 512:528] = s.view(torch.uint8)
        codes.append(tokens[:, :512].clone())
        scales.append(s)
    table = torch.tensor([[0, 1]], dtype=torch.int32)
    seq = torch.tensor([nb * B], dtype=torch.int32)
    want = torch.full((1, nb * B, D), float("nan"), dtype=torch.bfloat16)
    torch.ops.dsv4.dequantize_and_gather(cache, "v32_fp8", B, 1.0, table, seq, None, 0, want)
    got = poisoned((1, nb * B, D), torch.bfloat16)
    op("dequantize_and_gather")(to_dev(cache), "v32_fp8", B, 1.0, *to_dev(table, seq), None, 0, got)
    assert torch.equal(got.cpu(), want)
    reference = ref.decode_v32(cache, B, range(nb * B))  # float64, scales read as bf16
    assert torch.equal(want[0], reference.to(torch.bfloat16))
    fp32_read = torch.cat(codes).view(torch.float8_e4m3fn).double() * \
        torch.cat(scales).double().repeat_interleave(128, dim=1)
    differs = (want[0, :, :512] != fp32_read.to(torch.bfloat16)).sum().item()
    assert differs > nb * B * 512 // 20


# ---------------------------------------------------------------- GEMMs (torch)
def test_linear_and_grouped_wo_a():
    """The same products as the CPU op up to the order of the fp32 sums (bf16 operands on a GPU,
    exact products, fp32 accumulation): within 2^-20 of sum_k |x_k w_k| per output."""
    x = torch.randn(gpu_or(7, 64), 256).bfloat16()
    w = (torch.randn(256, 256) * 8).to(torch.float8_e4m3fn)
    ws = torch.exp2(torch.randint(-6, -2, (2, 2)).float())
    want = torch.empty(x.shape[0], 256)
    torch.ops.dsv4.linear(x, None, w, ws, want)
    got = poisoned(want.shape, torch.float32)
    op("linear")(to_dev(x), None, *to_dev(w, ws), got)
    w_real = w.double() * ws.double().repeat_interleave(128, 0).repeat_interleave(128, 1)
    mag = x.double().abs() @ w_real.abs().T
    assert ((got.cpu().double() - want.double()).abs() <= 2.0 ** -20 * mag).all()

    o = torch.randn(x.shape[0], 2048).bfloat16()
    wo_a = torch.randn(4, 64, 512).bfloat16()
    want = torch.empty(x.shape[0], 256)
    torch.ops.dsv4.grouped_wo_a(o, None, wo_a, None, want)
    got = poisoned(want.shape, torch.float32)
    op("grouped_wo_a")(to_dev(o), None, to_dev(wo_a), None, got)
    mag = torch.einsum("tgk,glk->tgl", o.double().abs().view(-1, 4, 512),
                       wo_a.double().abs()).reshape(x.shape[0], 256)
    assert ((got.cpu().double() - want.double()).abs() <= 2.0 ** -20 * mag).all()


# ---------------------------------------------------------------- argument checks
def test_bad_arguments_raise_before_writing():
    import dsv4attn
    out = poisoned((2, 4, 512), torch.bfloat16)
    with pytest.raises(dsv4attn.Error, match=r"sparse_prefill: q.shape\[2\] \(d_qk\): expected "
                                             r"512 or 576, got 256"):
        op("sparse_prefill")(to_dev(torch.zeros(2, 4, 256).bfloat16()),
                             to_dev(torch.zeros(8, 1, 256).bfloat16()),
                             to_dev(torch.zeros(2, 1, 4, dtype=torch.int32)), None, None, 0.0, 512,
                             out, poisoned((2, 4), torch.float32), poisoned((2, 4), torch.float32))
    assert out.isnan().all()
    with pytest.raises(dsv4attn.Error, match="quantize_act_fp8: block: expected 64 or 128"):
        op("quantize_act_fp8")(to_dev(torch.zeros(2, 256)), 32, None, None)
    with pytest.raises(dsv4attn.Error, match="layout: expected one of model1_fp8"):
        op("kv_dequantize")(to_dev(torch.zeros(1, 576, dtype=torch.uint8)), "fp4", 1, 1.0,
                            to_dev(torch.zeros(1, dtype=torch.int32)), poisoned((1, 512),
                                                                               torch.float32))
    with pytest.raises(dsv4attn.Error, match="op: expected one of"):
        op("no_such_op")


def test_registry_lists_every_op():
    from dsv4attn.triton import registry
    names = [r.name for r in registry.rows()]
    for name in ("sparse_prefill", "sparse_decode", "sparse_attention_combine",
                 "qnorm_rope_kv_insert", "dequantize_and_gather", "inv_rope_fp8_quant",
                 "quantize_act_fp8", "compressor_project", "compressor_update_and_emit",
                 "indexer_query", "indexer_scores", "indexer_topk", "compressed_prefix_indices",
                 "local_to_global_slots", "swa_window_indices", "combine_topk_swa_indices",
                 "linear", "grouped_wo_a", "rms_norm", "fused_qkv_rms_norm", "apply_rope"):
        assert name in names
    # Ops that exist in torch.ops.dsv4 keep its argument names (a caller dispatches by name),
    # except trailing options of the C++ backends that the Triton backend does not offer:
    # indexer_topk's sorted (sorted=False, column order, exists on CPU and CUDA only).
    import inspect
    cxx_only = {"indexer_topk": {"sorted"}}
    for r in registry.rows():
        torch_op = getattr(torch.ops.dsv4, r.name, None)
        if torch_op is None:
            continue
        want = [a.name for a in torch_op.default._schema.arguments
                if a.name not in cxx_only.get(r.name, set())]
        got = list(inspect.signature(r.fn).parameters)[:len(want)]
        assert got == want, r.name

"""torch.ops.dsv4.*: registration, fake kernels (opcheck), dense ops vs float64 references, and
wrong inputs surfacing as dsv4attn.Error (never a crash), with outputs left untouched.

Tolerances: bf16 outputs 1e-2 relative (one bf16 rounding of an fp32 accumulation); fp32
outputs 1e-4 relative (fp32 accumulation over <= 512 terms).
"""
import math

import pytest
import torch

import dsv4attn
import reference as ref
from conftest import poisoned

EXPECTED_OPS = {
    "linear", "quantize_act_fp8", "rms_norm", "fused_qkv_rms_norm", "apply_rope", "grouped_wo_a",
    "qnorm_rope_kv_insert", "kv_quantize", "kv_dequantize", "dequantize_and_gather",
    "sparse_decode", "sparse_attention_combine", "sparse_prefill", "local_to_global_slots",
    "swa_window_indices", "combine_topk_swa_indices", "dequantize_fp8_blocks", "inv_rope_fp8_quant",
}


def test_every_op_is_registered_under_dsv4():
    for name in EXPECTED_OPS:
        assert hasattr(torch.ops.dsv4, name), name


def test_error_is_value_and_runtime_error():
    assert issubclass(dsv4attn.Error, ValueError) and issubclass(dsv4attn.Error, RuntimeError)


@pytest.mark.parametrize("out_dtype", [torch.bfloat16, torch.float32])
def test_linear(device, out_dtype):
    x = torch.randn(7, 96, dtype=torch.bfloat16, device=device)
    w = torch.randn(40, 96, dtype=torch.bfloat16, device=device) / 10
    y = poisoned((7, 40), out_dtype, device)
    torch.ops.dsv4.linear(x, None, w, None, y)
    want = x.cpu().double() @ w.cpu().double().T
    rtol = 1e-2 if out_dtype == torch.bfloat16 else 1e-4
    assert torch.allclose(y.cpu().double(), want, rtol=rtol, atol=rtol)


def test_linear_fp8_block_scaled_weight(device):
    T = 4  # CUDA FP8 GEMMs take multiples of 4 rows (cuBLASLt's activation-scale rule)
    x = torch.randn(T, 256, dtype=torch.bfloat16, device=device)
    w_real = torch.randn(128, 256) / 16
    # One UE8M0 scale per 128x128 block of w (a 1 x 2 grid), fp8 values w / scale.
    blocks = w_real.view(1, 128, 2, 128)
    scale = ref.ue8m0_scale(blocks.abs().amax(dim=(1, 3)).double())  # [1, 2]
    w_fp8 = (w_real.double().view(1, 128, 2, 128) / scale[:, None, :, None]).view(128, 256)
    w_fp8 = w_fp8.to(torch.float32).to(torch.float8_e4m3fn)
    w_deq = (w_fp8.double().view(1, 128, 2, 128) * scale[:, None, :, None]).view(128, 256)
    w_dev, scale_dev = w_fp8.to(device), scale.float().to(device)
    y = poisoned((T, 128), torch.float32, device)
    if device.type == "cpu":  # the CPU GEMM also takes a bf16 x with an FP8 weight
        torch.ops.dsv4.linear(x, None, w_dev, scale_dev, y)
        want = x.cpu().double() @ w_deq.T
        assert torch.allclose(y.cpu().double(), want, rtol=1e-4, atol=1e-4)
    else:  # FP8 tensor cores multiply FP8 by FP8 only
        with pytest.raises(dsv4attn.Error, match="quantize_act_fp8"):
            torch.ops.dsv4.linear(x, None, w_dev, scale_dev, y)
    # The production path on both: x quantized per 1 x 128 (fp32 scales as the transpose of a
    # [K/128, T] buffer, the CUDA GEMMs' layout), the weight scales' rows padded to 4.
    xq = torch.empty(T, 256, dtype=torch.float8_e4m3fn, device=device)
    xs = torch.empty(2, T, dtype=torch.float32, device=device).t()
    torch.ops.dsv4.quantize_act_fp8(x, 128, xq, xs)
    ws = torch.ones(1, 4, dtype=torch.float32, device=device)
    ws[:, :2] = scale_dev
    torch.ops.dsv4.linear(xq, xs, w_dev, ws[:, :2], y)
    x_deq = (xq.cpu().double().view(T, 2, 128) * xs.cpu().double()[..., None]).view(T, 256)
    want = x_deq @ w_deq.T
    # FP8 tensor cores accumulate 128-deep slices with a short accumulator (up to ~2e-3 of Σ|x w|,
    # tests/cuda/test_fp8_gemm_cpu_vs_cuda.cpp): bound each element by that.
    bound = 2e-3 * (x_deq.abs() @ w_deq.abs().T) + 1e-6
    assert ((y.cpu().double() - want).abs() <= bound).all()
    if device.type == "cuda":  # 3 rows: refused, nothing written
        y3 = poisoned((3, 128), torch.float32, device)
        xq3 = torch.empty(3, 256, dtype=torch.float8_e4m3fn, device=device)
        xs3 = torch.empty(2, 3, dtype=torch.float32, device=device).t()
        torch.ops.dsv4.quantize_act_fp8(x[:3], 128, xq3, xs3)
        with pytest.raises(dsv4attn.Error, match="multiple of 4"):
            torch.ops.dsv4.linear(xq3, xs3, w_dev, ws[:, :2], y3)
        assert y3.isnan().all()


def test_inv_rope_fp8_quant(device):
    """Inverse RoPE + FP8 per 1 x 128 in one pass == apply_rope(inverse) into bf16, then
    quantize_act_fp8 (bit for bit), and close to the float64 formula."""
    T, H, D = 4, 3, 512
    o = (torch.randn(T, H, D) * 3).to(torch.bfloat16).to(device)
    positions = torch.tensor([0, 5, 100, 1000], device=device)
    cos_sin = dsv4attn.rope_cos_sin(1024, device=device)
    q = torch.empty(T, H * D, dtype=torch.float8_e4m3fn, device=device)
    s = poisoned((H * D // 128, T), torch.float32, device).t()
    torch.ops.dsv4.inv_rope_fp8_quant(o, positions, cos_sin, 128, q, s)
    rot = poisoned((T, H, D), torch.bfloat16, device)
    torch.ops.dsv4.apply_rope(o, positions, cos_sin, True, rot)
    q2 = torch.empty(T, H * D, dtype=torch.float8_e4m3fn, device=device)
    s2 = poisoned((T, H * D // 128), torch.float32, device)
    torch.ops.dsv4.quantize_act_fp8(rot.view(T, H * D), 128, q2, s2)
    assert torch.equal(q.view(torch.uint8).cpu(), q2.view(torch.uint8).cpu())
    assert torch.equal(s.cpu(), s2.cpu())
    want = ref.rope(o.cpu(), positions.cpu(), inverse=True).to(torch.bfloat16).reshape(T, H * D)
    want_q, want_scale = ref.quantize_blocks(want, 128)
    got = q.cpu().double().view(T, -1, 128) * s.cpu().double()[..., None]
    step = want_scale[..., None] * 32  # one e4m3 step at the top binade (2^-3 · 256)
    assert torch.all((got - want_q.view_as(got)).abs() <= step)


def test_rms_norm_and_rope(device):
    x = torch.randn(4, 3, 512, dtype=torch.bfloat16, device=device)
    y = poisoned(x.shape, torch.float32, device)
    torch.ops.dsv4.rms_norm(x, None, 1e-6, y)
    assert torch.allclose(y.cpu().double(), ref.rms_norm(x.cpu()), rtol=1e-4, atol=1e-4)
    positions = torch.tensor([0, 5, 100, 1000], device=device)
    cos_sin = dsv4attn.rope_cos_sin(1024, device=device)
    for inverse in (False, True):
        r = poisoned(x.shape, torch.float32, device)
        torch.ops.dsv4.apply_rope(x, positions, cos_sin, inverse, r)
        want = ref.rope(x.cpu(), positions.cpu(), inverse=inverse)
        assert torch.allclose(r.cpu().double(), want, rtol=1e-4, atol=1e-4)


def test_quantize_act_fp8(device):
    x = torch.randn(3, 512, device=device) * torch.logspace(-3, 2, 512, device=device)
    xq = torch.empty(3, 512, dtype=torch.float8_e4m3fn, device=device)
    scale = poisoned((3, 4), torch.float32, device)
    torch.ops.dsv4.quantize_act_fp8(x, 128, xq, scale)
    want, want_scale = ref.quantize_blocks(x.cpu(), 128)
    assert torch.equal(scale.cpu().double(), want_scale)
    got = (xq.cpu().double().view(3, 4, 128) * want_scale[..., None]).view(3, 512)
    assert torch.equal(got, want)


def test_grouped_wo_a(device):
    T, G, L, K = 3, 4, 32, 128
    o = torch.randn(T, G * K, dtype=torch.bfloat16, device=device)
    wo_a = torch.randn(G, L, K, dtype=torch.bfloat16, device=device) / 10
    z = poisoned((T, G * L), torch.float32, device)
    torch.ops.dsv4.grouped_wo_a(o, None, wo_a, None, z)
    want = torch.einsum("tgk,glk->tgl", o.cpu().double().view(T, G, K), wo_a.cpu().double())
    assert torch.allclose(z.cpu().double(), want.reshape(T, G * L), rtol=1e-4, atol=1e-4)


def test_opcheck_fake_kernels():
    """torch.library.opcheck: schema, fake tensor (meta) and AOT dispatch for a few ops."""
    q = torch.randn(2, 16, 512, dtype=torch.bfloat16)
    kv = torch.randn(30, 1, 512, dtype=torch.bfloat16)
    idx = torch.randint(-1, 30, (2, 1, 8), dtype=torch.int32)
    out = torch.empty(2, 16, 512, dtype=torch.bfloat16)
    m, l = torch.empty(2, 16), torch.empty(2, 16)
    torch.library.opcheck(torch.ops.dsv4.sparse_prefill.default,
                          (q, kv, idx, None, None, 0.05, 512, out, m, l),
                          test_utils=("test_schema", "test_faketensor",
                                      "test_aot_dispatch_dynamic"))
    x = torch.randn(4, 64)
    torch.library.opcheck(torch.ops.dsv4.rms_norm.default, (x, None, 1e-6, torch.empty(4, 64)),
                          test_utils=("test_schema", "test_faketensor"))
    # In-place ops on several arguments, a paged cache among them.
    B = 16
    cache = torch.zeros(2, dsv4attn.flash_mla.kv_cache_block_bytes("model1_fp8", B),
                        dtype=torch.uint8)
    qh = torch.randn(3, 4, 512, dtype=torch.bfloat16)
    kvh = torch.randn(3, 512, dtype=torch.bfloat16)
    torch.library.opcheck(torch.ops.dsv4.qnorm_rope_kv_insert.default,
                          (qh, kvh, torch.tensor([0, 1, 2]), dsv4attn.rope_cos_sin(8), 1e-6,
                           cache, "model1_fp8", B, 1.0, torch.tensor([0, 5, 17])),
                          test_utils=("test_schema", "test_faketensor",
                                      "test_aot_dispatch_dynamic"))
    splits, split_len, ws = dsv4attn._C.decode_schedule(1, 1, 4, 64, 132, 512)
    torch.library.opcheck(torch.ops.dsv4.sparse_decode.default,
                          (qh[:1, None], cache, "model1_fp8", B,
                           torch.randint(-1, 32, (1, 1, 64), dtype=torch.int32), None, None,
                           "model1_fp8", B, None, None, None, 0.05, 512, splits, split_len, ws,
                           torch.empty(ws, dtype=torch.uint8),
                           torch.empty(1, 1, 4, 512, dtype=torch.bfloat16),
                           torch.empty(1, 1, 4)),
                          test_utils=("test_schema", "test_faketensor",
                                      "test_aot_dispatch_dynamic"))


def test_ops_trace_under_fake_tensors():
    from torch._subclasses.fake_tensor import FakeTensorMode
    with FakeTensorMode():
        x = torch.randn(4, 64)
        y = torch.empty(4, 64)
        torch.ops.dsv4.rms_norm(x, None, 1e-6, y)  # fake kernel: no C++ call on fake data


@pytest.mark.parametrize("case", ["shape", "dtype", "mixed_device_or_stride", "eps"])
def test_bad_input_raises_and_writes_nothing(case):
    x = torch.randn(4, 64, dtype=torch.bfloat16)
    y = poisoned((4, 64), torch.bfloat16, "cpu")
    eps = 1e-6
    if case == "shape":
        y = poisoned((4, 63), torch.bfloat16, "cpu")
    elif case == "dtype":
        x = x.to(torch.int32)
    elif case == "mixed_device_or_stride":
        x = torch.randn(64, 4, dtype=torch.bfloat16).T  # last dim not contiguous
    elif case == "eps":
        eps = -1.0
    with pytest.raises(dsv4attn.Error, match="rms_norm"):
        torch.ops.dsv4.rms_norm(x, None, eps, y)
    assert torch.all(torch.isnan(y.float()))


def test_unsupported_dtype_is_an_error_not_a_crash():
    x = torch.randn(4, 64, dtype=torch.float64)
    with pytest.raises(dsv4attn.Error, match="dtype"):
        torch.ops.dsv4.rms_norm(x, None, 1e-6, torch.empty(4, 64))


def test_index_utilities_validate_ranges():
    local = torch.tensor([[0, 100]], dtype=torch.int32)
    table = torch.tensor([[2, 3]], dtype=torch.int32)
    out = torch.full((1, 2), 7, dtype=torch.int32)
    with pytest.raises(dsv4attn.Error, match="local_to_global_slots"):
        torch.ops.dsv4.local_to_global_slots(local, torch.zeros(1, dtype=torch.int32), table, 4,
                                             out, None, True)
    assert torch.all(out == 7)


# ---------------------------------------------------------------- the RoPE table of a layer
def _rope_table_f64(max_pos, R, theta, yarn, factor, L0, beta_fast, beta_slow):
    """docs/spec.md §3 in float64: [cos(p f_i) | sin(p f_i)], YaRN-blended frequencies when asked."""
    i = torch.arange(R // 2, dtype=torch.float64)
    f = theta ** (-2 * i / R)
    if yarn:
        def corr(n):
            return R * math.log(L0 / (n * 2 * math.pi)) / (2 * math.log(theta))
        low = max(math.floor(corr(beta_fast)), 0)
        high = min(math.ceil(corr(beta_slow)), R - 1)
        ramp = ((i - low) / max(high - low, 1e-3)).clamp(0, 1)
        f = f / factor * ramp + f * (1 - ramp)
    ang = torch.arange(max_pos, dtype=torch.float64)[:, None] * f[None, :]
    return torch.cat([ang.cos(), ang.sin()], dim=1)


def test_rope_cos_sin_for_follows_the_layer_kind():
    cfg = dsv4attn.ModelConfig.builtin("v4-flash")
    ratios = cfg.compress_ratios
    swa, compressed = ratios.index(0), next(i for i, r in enumerate(ratios) if r > 0)
    for layer in (swa, compressed):
        got = dsv4attn.rope_cos_sin_for(cfg, layer, max_pos=3000)
        r = cfg.rope_for_layer(layer)
        assert r["yarn"] == (ratios[layer] > 0)
        assert got.shape == (3000, r["rope_dims"]) and got.dtype == torch.float32
        want = _rope_table_f64(3000, r["rope_dims"], r["theta"], r["yarn"], r["factor"],
                               r["original_seq_len"], r["beta_fast"], r["beta_slow"])
        # fp32 table from float64 angles: |error| ≤ a few fp32 ulps of 1 (angles up to 3000 rad
        # are reduced in double before rounding).
        torch.testing.assert_close(got.double(), want, rtol=0, atol=2e-6)
    # The two kinds use different frequencies (compress theta + YaRN vs rope theta).
    assert not torch.equal(dsv4attn.rope_cos_sin_for(cfg, swa, max_pos=64),
                           dsv4attn.rope_cos_sin_for(cfg, compressed, max_pos=64))


# ---------------------------------------------------------------- the host path's shortcuts
# A torch.Tensor is read from its attributes (tensor_args.cpp, torch_view) and this package's
# entry points call an op's Python function directly when nothing traces or intercepts it
# (ops.needs_registered_op). Both must see exactly what DLPack and the registered op see.

class _DlpackOnly:
    """Exposes a tensor through the DLPack protocol only, forcing the extension's DLPack path."""

    def __init__(self, t):
        self.t = t

    def __dlpack__(self, *args, **kwargs):
        return self.t.__dlpack__(*args, **kwargs)

    def __dlpack_device__(self):
        return self.t.__dlpack_device__()


def _rms_norm_both_ways(x, weight):
    eps = 1e-6
    direct = poisoned(x.shape, torch.float32, x.device)
    through_dlpack = poisoned(x.shape, torch.float32, x.device)
    dsv4attn._C.rms_norm(x, weight, eps, direct, 0)
    dsv4attn._C.rms_norm(_DlpackOnly(x), _DlpackOnly(weight), eps, _DlpackOnly(through_dlpack), 0)
    return direct, through_dlpack


def test_torch_tensors_read_as_dlpack_reads_them():
    # A view with a storage offset, a padded row stride and a transposed batch dim, of each
    # dtype rms_norm takes: data pointer, shape, strides and dtype must all agree.
    for dtype in (torch.bfloat16, torch.float32):
        base = torch.randn(5, 3, 80, dtype=torch.float32).to(dtype)
        x = base.transpose(0, 1)[1:, :, 8:72]  # [2, 5, 64], strides (80, 240, 1), offset 88
        weight = torch.randn(64, dtype=torch.float32)
        direct, through_dlpack = _rms_norm_both_ways(x, weight)
        assert not direct.isnan().any()
        assert torch.equal(direct, through_dlpack)
        want = x.double() * torch.rsqrt(x.double().pow(2).mean(-1, keepdim=True) + 1e-6) * weight.double()
        assert torch.allclose(direct.double(), want, rtol=1e-2 if dtype != torch.float32 else 1e-5, atol=1e-2)


def test_negated_views_are_refused_and_grad_tensors_read():
    # A negated view's memory holds the values without their sign (DLPack exports it as it is),
    # so it is refused, naming the argument, with y untouched. A tensor that requires grad is
    # read like any other (these ops do not differentiate; FlashMLA takes such tensors too).
    x = torch.randn(4, 64)
    y = poisoned((4, 64), torch.float32, "cpu")
    with pytest.raises(dsv4attn.Error, match=r"rms_norm: x: .*negated"):
        dsv4attn._C.rms_norm(torch._neg_view(x), None, 1e-6, y, 0)
    assert y.isnan().all()
    dsv4attn._C.rms_norm(x.clone().requires_grad_(True), None, 1e-6, y, 0)
    want = x.double() * torch.rsqrt(x.double().pow(2).mean(-1, keepdim=True) + 1e-6)
    assert torch.allclose(y.double(), want, rtol=1e-5, atol=1e-6)


def test_tensor_subclass_goes_through_dlpack():
    class Marked(torch.Tensor):
        pass

    x = torch.randn(4, 64).as_subclass(Marked)
    y = poisoned((4, 64), torch.float32, "cpu")
    dsv4attn._C.rms_norm(x, None, 1e-6, y, 0)
    want = torch.Tensor(x).double()
    want = want * torch.rsqrt(want.pow(2).mean(-1, keepdim=True) + 1e-6)
    assert torch.allclose(y.double(), want, rtol=1e-5, atol=1e-6)


def test_entry_points_call_directly_only_when_nothing_intercepts():
    from torch._subclasses.fake_tensor import FakeTensorMode
    from torch.utils._python_dispatch import TorchDispatchMode

    x = torch.randn(4, 64)
    assert not dsv4attn.ops.needs_registered_op((x, None, 1e-6, x))
    assert not dsv4attn.ops.needs_registered_op((1, "a"))  # no tensor: the function's own errors

    class Marked(torch.Tensor):
        pass

    assert dsv4attn.ops.needs_registered_op((x.as_subclass(Marked), x))

    seen = []

    class Log(TorchDispatchMode):
        def __torch_dispatch__(self, func, types, args=(), kwargs=None):
            seen.append(str(func))
            return func(*args, **(kwargs or {}))

    y = poisoned((4, 64), torch.float32, "cpu")
    with Log():
        assert dsv4attn.ops.needs_registered_op((x,))
        dsv4attn.ops.rms_norm(x, None, 1e-6, y)  # the mode sees the op, as with torch.ops.dsv4
    assert any("dsv4.rms_norm" in f for f in seen), seen
    assert not y.isnan().any()

    with FakeTensorMode():
        fx, fy = torch.randn(4, 64), torch.empty(4, 64)
        assert dsv4attn.ops.needs_registered_op((fx, fy))
        dsv4attn.ops.rms_norm(fx, None, 1e-6, fy)  # the fake kernel: no C++ call on fake data



def test_sparse_prefill_work_counter(device):
    """The extension's optional work counter (ops.h SparsePrefillArgs::work_counter; the torch op
    passes one on CUDA) changes which CTA runs which item, never the result: out, lse and
    max_logits are bit-identical with and without it. On CUDA the items past the round-robin
    ones (all rounds but the last eighth: src/cuda/attention/sparse_prefill.h) are claimed once
    each and every CTA's last claim falls past the end, so the counter ends at items - round-robin
    items + CTAs whatever it held (a launch of under eight rounds, and the CPU, leave it alone)."""
    from dsv4attn import _C
    from dsv4attn._runtime import stream_handle
    # CUDA: 1200 items, 10 rounds on 132 SMs, the last from the counter; the CPU a small case.
    s_q, h, d, s_kv, topk = (600, 128, 576, 500, 64) if device.type == "cuda" else (20, 128, 576, 100, 64)
    q = torch.randn(s_q, h, d, dtype=torch.bfloat16, device=device)
    kv = torch.randn(s_kv, 1, d, dtype=torch.bfloat16, device=device)
    idx = torch.randint(-1, s_kv, (s_q, 1, topk), dtype=torch.int32, device=device)
    length = torch.randint(0, topk + 1, (s_q,), dtype=torch.int32, device=device)
    counter = torch.full((1,), -7, dtype=torch.int32, device=device)
    runs = []
    for work_counter in (None, counter):
        out = poisoned((s_q, h, 512), torch.bfloat16, device)
        m, lse = poisoned((s_q, h), torch.float32, device), poisoned((s_q, h), torch.float32, device)
        _C.sparse_prefill(q, kv, idx, length, None, 0.0, 512, out, m, lse, work_counter,
                          stream_handle(q))
        runs.append((out, m, lse))
    want = -7
    if device.type == "cuda":
        items = s_q * ((h + 63) // 64)
        ctas = min(items, torch.cuda.get_device_properties(device).multi_processor_count)
        rounds = -(-items // ctas)
        round_robin = min(items, (rounds - rounds // 8) * ctas)
        if round_robin < items:  # else a launch of under eight rounds: the counter left alone
            want = items - round_robin + ctas
    assert counter.item() == want
    for a, b in zip(*runs):
        assert torch.equal(a.view(torch.int16 if a.dtype == torch.bfloat16 else torch.int32),
                           b.view(torch.int16 if b.dtype == torch.bfloat16 else torch.int32))
    # Through the torch op (its own counter on CUDA), the same bits again.
    out = poisoned((s_q, h, 512), torch.bfloat16, device)
    m, lse = poisoned((s_q, h), torch.float32, device), poisoned((s_q, h), torch.float32, device)
    torch.ops.dsv4.sparse_prefill(q, kv, idx, length, None, 0.0, 512, out, m, lse)
    assert torch.equal(out.view(torch.int16), runs[0][0].view(torch.int16))

"""Regressions of issue 21 ("hostile inputs") as the hostile user wrote them, through the Python
entry points: torch.ops.dsv4.*, vllm_ops, flash_mla, the layer and the extension itself.

Every rejected call must raise dsv4attn.Error naming the argument (not a crash, a TypeError,
AttributeError, MemoryError or torch RuntimeError) and write nothing: each test compares every
buffer the call could write with a copy taken before it. Items reproducible in C++ (the CLI, the
config reader, the ops' own checks) are also covered by tests/cpu/test_hostile_inputs.cpp.
"""
import re

import pytest
import torch

import dsv4attn
from dsv4attn import _C, vllm_ops
from dsv4attn.flash_mla import (alloc_kv_cache, flash_mla_sparse_fwd, flash_mla_with_kvcache,
                                get_mla_metadata)

ops = torch.ops.dsv4
L = "model1_fp8"


def _bytes(t):
    return t.detach().contiguous().view(-1).view(torch.uint8)


def rejected(match, *written):
    """Context: the body must raise dsv4attn.Error matching `match` (a literal) and leave every
    tensor in `written` unchanged, byte for byte."""
    class _Ctx:
        def __enter__(self):
            self.before = [_bytes(w).clone() for w in written]
            self.raises = pytest.raises(dsv4attn.Error, match=re.escape(match))
            return self.raises.__enter__()

        def __exit__(self, *exc):
            handled = self.raises.__exit__(*exc)
            for w, b in zip(written, self.before):
                assert torch.equal(_bytes(w), b), "a rejected call wrote a buffer"
            return handled
    return _Ctx()


def one_token_cache():
    cache = torch.zeros(1, 1152, dtype=torch.uint8)  # MODEL1_FP8, block_size 1
    ops.kv_quantize(cache, L, 1, 1.0, torch.full((1, 512), 3.), torch.tensor([0]))
    return cache


# ---- 1. kv_dequantize with slots inside out (was SIGSEGV) -------------------------------------
def test_item01_kv_dequantize_slots_inside_out():
    cache = one_token_cache()
    out = torch.zeros(64, 512)
    slots = out.view(torch.int32)[0, :64]
    with rejected("kv_dequantize: out: expected memory disjoint from slots", out, cache):
        ops.kv_dequantize(cache, L, 1, 1.0, slots, out)


# ---- 2. kv_quantize with slots inside the cache (was SIGSEGV) ----------------------------------
def test_item02_kv_quantize_slots_inside_cache():
    cache = torch.zeros(2, 1152, dtype=torch.uint8)
    s = cache.view(-1)[1152:1664].view(torch.int64)
    s.fill_(-1)
    s[0] = 1
    with rejected("kv_quantize: cache.data: expected memory disjoint from slots", cache):
        ops.kv_quantize(cache, L, 1, 1.0, torch.full((64, 512), 3.), s)


# ---- 3. the insert (op and vllm wrapper) with slot_mapping inside the cache / positions in q --
def insert_args(T=64):
    q = torch.zeros(T, 1, 512, dtype=torch.bfloat16)
    kv = torch.zeros(T, 512, dtype=torch.bfloat16)
    positions = torch.zeros(T, dtype=torch.int64)
    cos_sin = dsv4attn.rope_cos_sin(T, 64)
    cache = torch.zeros(16, 1152, dtype=torch.uint8)
    slots = torch.full((T,), -1, dtype=torch.int64)
    slots[:16] = torch.arange(16)
    return q, kv, positions, cos_sin, cache, slots


def test_item03_insert_slot_mapping_inside_cache():
    q, kv, positions, cos_sin, cache, _ = insert_args()
    s = cache.view(-1)[1152:1664].view(torch.int64)
    s.fill_(-1)
    s[0] = 1
    msg = "qnorm_rope_kv_insert: cache.data: expected memory disjoint from slot_mapping"
    with rejected(msg, q, kv, cache):
        ops.qnorm_rope_kv_insert(q, kv, positions, cos_sin, 1e-6, cache, L, 1, 1.0, s)
    with rejected(msg, q, kv, cache):
        vllm_ops.fused_deepseek_v4_qnorm_rope_kv_rope_quant_insert(q, kv, cache, s, positions,
                                                                    cos_sin, 1e-6, 1)


def test_item03_insert_positions_inside_q():
    q, kv, _, cos_sin, cache, slots = insert_args()
    p = q.view(torch.int64).view(-1)[:64]
    msg = "qnorm_rope_kv_insert: q: expected memory disjoint from positions"
    with rejected(msg, q, kv, cache):
        ops.qnorm_rope_kv_insert(q, kv, p, cos_sin, 1e-6, cache, L, 1, 1.0, slots)
    with rejected(msg, q, kv, cache):
        vllm_ops.fused_deepseek_v4_qnorm_rope_kv_rope_quant_insert(q, kv, cache, slots, p, cos_sin,
                                                                    1e-6, 1)


# ---- 4. apply_rope with positions inside y (was SIGSEGV) ---------------------------------------
def test_item04_apply_rope_positions_inside_y():
    x = torch.full((64, 512), 3.)
    y = torch.zeros(64, 512)
    p = y.view(torch.int64)[0, :64]
    with rejected("apply_rope: y: expected memory disjoint from positions", y):
        ops.apply_rope(x, p, dsv4attn.rope_cos_sin(1, 64), False, y)


# ---- 6. Attention.forward checks x against the batch before planning / allocating --------------
@pytest.mark.parametrize("num_new", [2**26, 2**31, 2**40])
def test_item06_forward_checks_x_before_planning(num_new):
    layer = dsv4attn.Attention("tiny", 0)
    x = torch.randn(1, 256)
    with pytest.raises(dsv4attn.Error, match=re.escape(f"x.shape: expected [{num_new}, 256]")):
        layer.forward(dsv4attn.BatchDescription([1], [0], [num_new]), x)
    # The extension's own entry (what the wrapper calls) checks first as well; a step of more
    # tokens than int32 offsets hold is refused as such.
    y = torch.full((1, 256), float("nan"))
    message = (f"Attention.forward: x.shape: expected [{num_new}, 256], got [1, 256]"
               if num_new < 2**31 else "BatchPlan: tokens of one step: expected <= 2147483647")
    with rejected(message, y):
        layer._layer.forward([1], [0], [num_new], x, y)
    # The layer is unchanged: request 1 is still new.
    assert layer.forward(dsv4attn.BatchDescription([1], [0], [1]), x).shape == (1, 256)


# ---- 7. combine_topk_swa_indices: R * M overflowed, every request got row 0 --------------------
def combine_args():
    topk = torch.full((4, 1), -1, dtype=torch.int32)
    qsl = torch.arange(5, dtype=torch.int32)
    ones = torch.ones(4, dtype=torch.int32)
    return topk, qsl, ones, ones.clone()


@pytest.mark.parametrize("M", [2**62, 2**63 - 1, 2**30])
def test_item07_combine_topk_swa_rows_overflow(M):
    topk, qsl, seq, gather = combine_args()
    with pytest.raises(dsv4attn.Error, match="M: 4 requests x"):
        vllm_ops.combine_topk_swa_indices(topk, qsl, seq, gather, 1, 4, 1, M, 0)
    out = torch.full((4, 2), 7, dtype=torch.int32)
    lens = torch.full((4,), 7, dtype=torch.int32)
    with rejected("combine_topk_swa_indices: rows_per_request", out, lens):
        ops.combine_topk_swa_indices(topk, qsl, seq, gather, 1, 0, M, 4, out, lens)
    m = (2**31 - 1) // 4  # the largest M whose row indices fit int32: accepted
    ok, ok_lens = vllm_ops.combine_topk_swa_indices(topk, qsl, seq, gather, 1, 4, 1, m, 0)
    assert ok[:, 0].tolist() == [r * m for r in range(4)] and ok_lens.tolist() == [1] * 4


# ---- 8. vllm_ops cache wrappers and non-contiguous cache views --------------------------------
def test_item08_vllm_cache_wrappers_refuse_strided_views():
    big = torch.zeros(1, 2304, dtype=torch.uint8)
    cache = big[:, ::2]  # 1152 bytes every other byte of big
    q = torch.zeros(1, 1, 512, dtype=torch.bfloat16)
    kv = torch.randn(1, 512).bfloat16()
    with rejected("k_cache.stride(1): expected 1", big, q):
        vllm_ops.fused_deepseek_v4_qnorm_rope_kv_rope_quant_insert(
            q, kv, cache, torch.tensor([0]), torch.tensor([0]), dsv4attn.rope_cos_sin(1, 64),
            1e-6, 1)
    out = torch.zeros(1, 4, 512, dtype=torch.bfloat16)
    with rejected("k_cache.stride(1): expected 1", big, out):
        vllm_ops.dequantize_and_gather_k_cache(out, cache, torch.tensor([1], dtype=torch.int32),
                                               None, torch.zeros(1, 1, dtype=torch.int32), 1, 0)
    # A [num_blocks, block_size, 584] view whose tokens are not packed is refused too.
    tokens = torch.zeros(1, 2, 1168, dtype=torch.uint8)[:, :, :584]
    with rejected("k_cache.stride(1): expected 584", out):
        vllm_ops.dequantize_and_gather_k_cache(out, tokens, torch.tensor([1], dtype=torch.int32),
                                               None, torch.zeros(1, 1, dtype=torch.int32), 2, 0)
    # The raw op refuses the same view.
    with rejected("cache.data.stride(-1): expected 1", big):
        ops.kv_quantize(cache, L, 1, 1.0, torch.zeros(1, 512), torch.tensor([0]))


# ---- 9. ModelConfig JSON integers are exact ------------------------------------------------------
BASE = ('{"dim": 256, "n_heads": 16, "n_layers": 4, "q_lora_rank": 128, "o_groups": 4, '
        '"o_lora_rank": 64, "window_size": 16, "compress_ratios": [0, 4, 128, 4], '
        '"index_n_heads": 4, "index_topk": 16}')


@pytest.mark.parametrize("key,value", [("dim", "4294967552"), ("dim", "true"),
                                       ("index_topk", "1.5"),
                                       ("compress_ratios", "[0, 4, 4294967300, 4]")])
def test_item09_config_json_integers_exact(key, value):
    assert dsv4attn.ModelConfig.from_json_string(BASE).dim == 256
    text = re.sub(rf'"{key}": (\[[^]]*\]|[^,}}]+)', f'"{key}": {value}', BASE)
    with pytest.raises(dsv4attn.Error, match=re.escape(f"key '{key}")):
        dsv4attn.ModelConfig.from_json_string(text)


# ---- 11. decode_schedule overflow -------------------------------------------------------------
def test_item11_decode_schedule_split_len_fits_int():
    num_splits, split_len, workspace = _C.decode_schedule(1, 1, 1, 2**31 - 1, 1, 576)
    assert split_len > 0 and split_len % 64 == 0
    assert num_splits * split_len >= 2**31 - 1 and workspace > 0
    with pytest.raises(dsv4attn.Error, match="workspace bytes"):
        _C.decode_schedule(2**31 - 1, 2**31 - 1, 2**31 - 1, 64, 132, 2**31 - 1)


# ---- 12. aliasing where the output depended on write order -------------------------------------
def test_item12_kv_dequantize_output_aliasing():
    cache = torch.zeros(4, 1152, dtype=torch.uint8)
    ops.kv_quantize(cache, L, 1, 1.0, torch.randn(4, 512), torch.arange(4))
    row = torch.zeros(1, 512)
    with rejected("kv_dequantize: out: expected an output whose elements do not overlap", row):
        ops.kv_dequantize(cache, L, 1, 1.0, torch.arange(4), row.expand(4, 512))
    flat = torch.zeros(1024)
    rows = flat.as_strided((2, 512), (256, 1))
    with rejected("kv_dequantize: out: expected an output whose elements do not overlap", flat):
        ops.kv_dequantize(cache, L, 1, 1.0, torch.arange(2), rows)
    inside = cache.view(-1)[2304:3328].view(torch.bfloat16).view(1, 512)
    with rejected("kv_dequantize: out: expected memory disjoint from cache.data", cache):
        ops.kv_dequantize(cache, L, 1, 1.0, torch.tensor([0]), inside)


def test_item12_kv_quantize_values_inside_cache():
    cache = torch.zeros(4, 1152, dtype=torch.uint8)
    values = cache.view(-1)[2304:3328].view(torch.bfloat16).view(1, 512)
    with rejected("kv_quantize: cache.data: expected memory disjoint from values", cache):
        ops.kv_quantize(cache, L, 1, 1.0, values, torch.tensor([0]))


def test_item12_insert_cos_sin_inside_cache():
    q, kv, positions, cos_sin, cache, slots = insert_args()
    table = cache.view(-1)[:cos_sin.numel() * 4].view(torch.float32).view(cos_sin.shape)
    table.copy_(cos_sin)
    with rejected("qnorm_rope_kv_insert: cache.data: expected memory disjoint from cos_sin",
                  q, kv, cache):
        ops.qnorm_rope_kv_insert(q, kv, positions, table, 1e-6, cache, L, 1, 1.0, slots)


def test_item12_apply_rope_cos_sin_inside_y():
    x = torch.full((4, 512), 3.)
    y = torch.zeros(4, 512)
    table = y[3, :64].view(1, 64)
    table.copy_(dsv4attn.rope_cos_sin(1, 64))
    with rejected("apply_rope: y: expected memory disjoint from cos_sin", y):
        ops.apply_rope(x, torch.zeros(4, dtype=torch.int64), table, False, y)


# ---- 13. FlashMLASchedMeta is filled only by an accepted call -----------------------------------
def test_item13_rejected_call_leaves_sched_meta_unfilled():
    cache = alloc_kv_cache(2, 64)
    q = torch.randn(1, 1, 16, 512, dtype=torch.bfloat16)
    meta = get_mla_metadata()[0]
    small = torch.zeros(600, dtype=torch.uint8).as_strided((1, 1, 1, 600), (600, 600, 600, 1))
    with pytest.raises(dsv4attn.Error, match="bytes per token"):
        flash_mla_with_kvcache(q, small, None, None, 512, meta, is_fp8_kvcache=True,
                               indices=torch.zeros(1, 1, 16, dtype=torch.int32))
    # Rejected by the op itself (int64 indices): the metadata is still unfilled.
    with pytest.raises(dsv4attn.Error, match="indices.dtype"):
        flash_mla_with_kvcache(q, cache, None, None, 512, meta, is_fp8_kvcache=True,
                               indices=torch.zeros(1, 1, 16, dtype=torch.int64))
    assert not meta.have_initialized and meta.config is None and meta.num_splits is None
    out, lse = flash_mla_with_kvcache(q, cache, None, None, 512, meta, is_fp8_kvcache=True,
                                      indices=torch.zeros(1, 1, 8, dtype=torch.int32))
    assert meta.have_initialized and meta.config.topk == 8 and meta.num_splits is not None
    assert torch.isfinite(out.float()).all()


# ---- 14. dsv4attn.Error (naming the argument) for every bad argument ----------------------------
def test_item14_out_of_range_integers():
    cache = torch.zeros(1, 1152, dtype=torch.uint8)
    with rejected("kv_quantize: block_size: expected an integer in [-2147483648, 2147483647], "
                  "got 1099511627776", cache):
        ops.kv_quantize(cache, L, 2**40, 1.0, torch.zeros(1, 512), torch.tensor([0]))
    q = torch.randn(2, 16, 512, dtype=torch.bfloat16)
    kv = torch.randn(4, 1, 512, dtype=torch.bfloat16)
    idx = torch.zeros(2, 1, 8, dtype=torch.int32)
    with pytest.raises(dsv4attn.Error, match=re.escape("flash_mla_sparse_fwd: d_v")):
        flash_mla_sparse_fwd(q, kv, idx, 0.1, d_v=2**31)
    out = torch.zeros(2, 16, 512, dtype=torch.bfloat16)
    with rejected("sparse_prefill: d_v: expected an integer", out):
        ops.sparse_prefill(q, kv, idx, None, None, 0.1, 2**31, out, torch.zeros(2, 16),
                           torch.zeros(2, 16))
    with pytest.raises(dsv4attn.Error, match=re.escape("BatchDescription: request_ids[0]")):
        dsv4attn.BatchDescription([2**64], [0], [1])
    with pytest.raises(dsv4attn.Error, match=re.escape("plan_order: req_ids[0]")):
        _C.plan_order([2**64], [0], [1])
    with pytest.raises(dsv4attn.Error, match=re.escape("make_decode_schedule: b")):
        _C.decode_schedule(2**70, 1, 1, 1, 1, 1)
    with pytest.raises(dsv4attn.Error, match=re.escape("BatchDescription: num_new[0]")):
        dsv4attn.BatchDescription([1], [0], [1.5])
    with pytest.raises(dsv4attn.Error, match="rope_cos_sin: max_pos"):
        dsv4attn.rope_cos_sin(-1)  # (was torch's RuntimeError from allocating the table)
    # (torch.ops turn a bool into an int before the op sees it; the extension refuses it.)
    xq = torch.zeros(1, 128, dtype=torch.float8_e4m3fn)
    scale = torch.zeros(1, 1)
    with rejected("quantize_act_fp8: block: expected an integer in [-2147483648, 2147483647], "
                  "got bool", scale):
        _C.quantize_act_fp8(torch.zeros(1, 128), True, xq, scale)


def test_item14_none_for_a_required_tensor():
    cache = one_token_cache()
    out = torch.zeros(1, 512)
    with rejected("kv_dequantize: slots: expected a tensor, got None", out):
        ops.kv_dequantize(cache, L, 1, 1.0, None, out)
    with rejected("kv_dequantize: out: expected a tensor, got None", cache):
        ops.kv_dequantize(cache, L, 1, 1.0, torch.tensor([0]), None)
    with pytest.raises(dsv4attn.Error, match="apply_rope: x: expected a tensor, got None"):
        ops.apply_rope(None, torch.zeros(1, dtype=torch.int64), dsv4attn.rope_cos_sin(1, 64),
                       False, out)
    with pytest.raises(dsv4attn.Error, match="expected a tensor, got list"):
        _C.linear([1, 2], None, torch.zeros(1, 1), None, torch.zeros(1, 1))
    with pytest.raises(dsv4attn.Error, match="linear: x: expected a dense tensor DLPack can"):
        _C.linear(torch.zeros(1, 1).to_sparse(), None, torch.zeros(1, 1), None, torch.zeros(1, 1))
    with pytest.raises(dsv4attn.Error, match="fused_q_kv_rmsnorm: qr: expected a tensor, got None"):
        vllm_ops.fused_q_kv_rmsnorm(None, torch.zeros(1, 4), torch.ones(4), torch.ones(4), 1e-6)
    with pytest.raises(dsv4attn.Error, match="k_cache: expected a tensor, got None"):
        vllm_ops.dequantize_and_gather_k_cache(torch.zeros(1, 1, 512, dtype=torch.bfloat16), None,
                                               torch.ones(1, dtype=torch.int32), None,
                                               torch.zeros(1, 1, dtype=torch.int32), 64, 0)
    with pytest.raises(dsv4attn.Error, match="flash_mla_with_kvcache: q: expected a tensor"):
        flash_mla_with_kvcache(None, alloc_kv_cache(1, 64), None, None, 512,
                               get_mla_metadata()[0], is_fp8_kvcache=True,
                               indices=torch.zeros(1, 1, 8, dtype=torch.int32))
    with pytest.raises(dsv4attn.Error, match="flash_mla_sparse_fwd: kv"):
        flash_mla_sparse_fwd(torch.zeros(1, 16, 512, dtype=torch.bfloat16), None,
                             torch.zeros(1, 1, 8, dtype=torch.int32), 0.1)
    with pytest.raises(dsv4attn.Error, match="Attention.forward: x: expected a tensor, got None"):
        dsv4attn.Attention("tiny", 0).forward(dsv4attn.BatchDescription([1], [0], [1]), None)


def test_item14_combine_window_out_of_range():
    topk, qsl, seq, gather = combine_args()
    with pytest.raises(dsv4attn.Error, match="combine_topk_swa_indices: window_size"):
        vllm_ops.combine_topk_swa_indices(topk, qsl, seq, gather, -2**63, 4, 1, 8, 0)
    out = torch.full((4, 2), 7, dtype=torch.int32)
    lens = torch.full((4,), 7, dtype=torch.int32)
    with rejected("combine_topk_swa_indices: window: expected an integer", out, lens):
        ops.combine_topk_swa_indices(topk, qsl, seq, gather, -2**63, 0, 8, 4, out, lens)


# ---- 15. a config file read is bounded ---------------------------------------------------------
def test_item15_config_read_is_bounded():
    with pytest.raises(dsv4attn.Error, match="expected a file of at most 1048576 bytes"):
        dsv4attn.ModelConfig.from_json_file("/dev/zero")

"""`torch.ops.dsv4.*`: the C++ ops registered with torch.library.

Each op mirrors one function of include/dsv4/ops.h (or kv_layout.h, indexing.h, compressor.h,
indexer.h): the caller allocates the outputs, which the op writes in place (declared in
`mutates_args`, so torch.compile functionalizes them), and nothing is returned. Every op has a
fake kernel, so `torch.compile` traces through it. CUDA tensors run on torch's current stream of
their device; no op synchronizes the host.

Paged caches are passed as their byte tensor (uint8 [num_blocks, block_bytes], bytes dense within
a block, any block stride >= block_bytes that is a multiple of 16) plus `layout`
("model1_fp8", "v32_fp8", "bf16", "fp8_per_tensor") and `block_size`. The sparse attention ops'
q, kv, indices, out, lse and max_logits may have any strides whose last dim is contiguous, with
the 16-byte row rules of include/dsv4/ops.h on CUDA.

Bad arguments raise dsv4attn.Error (a ValueError) naming the op, the argument, what was expected
and what was found, before any output is written — None or a non-tensor where a tensor is
required and an integer outside the C++ parameter's range included. (torch itself turns a bool
into an int and refuses an int beyond int64 before the op runs.)
"""
from __future__ import annotations

from typing import Optional

import torch

from . import _C
from ._runtime import device_guard, stream_handle

Tensor = torch.Tensor
_registered = []


def _op(name: str, mutates: tuple[str, ...]):
    """Registers `fn` as torch.ops.dsv4.<name>, mutating `mutates`, with a no-output fake, and
    returns its fast caller (`_fast_caller`) for this package's own entry points."""

    def wrap(fn):
        op = torch.library.custom_op(f"dsv4::{name}", mutates_args=mutates)(fn)

        @op.register_fake
        def _fake(*args, **kwargs):  # outputs are caller-allocated: nothing to produce
            return None

        _registered.append(op)
        return _fast_caller(fn, op)

    return wrap


_c = torch._C  # noqa: SLF001 (torch's own mode stacks: nothing public reads them as cheaply)
_INFRA_MODES = tuple(_c._TorchDispatchModeKey.__members__.values())  # fake, proxy, functional


def needs_registered_op(args) -> bool:
    """Whether a call with positional `args` must go through the registered op rather than its
    Python function: while torch.compile traces, when the first tensor argument is not a plain
    torch.Tensor (a fake, proxy or other subclass), or while a torch dispatch or function mode is
    active (the op is what such a mode sees and handles)."""
    # (Plain loops, not generator expressions: this runs on every call of every entry point,
    # and each generator cost ~0.3 µs of host time.)
    if torch.compiler.is_compiling():
        return True
    for a in args:
        if isinstance(a, torch.Tensor):
            if type(a) is not torch.Tensor:
                return True
            break
    if _c._len_torch_dispatch_stack() > 0 or _c._is_torch_function_mode_enabled():
        return True
    for mode in _INFRA_MODES:
        if _c._get_dispatch_mode(mode) is not None:
            return True
    return False


def _fast_caller(fn, op):
    """`fn` itself unless `needs_registered_op`, else the registered op.

    The registered op's eager path (torch.library's dispatch into this Python function) costs
    ~25 µs of host time a call, more than the extension's own argument conversion and checks
    (docs/notes/host_overhead.md); FlashMLA's and vLLM's callers would pay it on every eager
    call. Outputs, errors and streams are the same either way: both run `fn`."""

    def call(*args, **kwargs):
        if needs_registered_op(args):
            return op(*args, **kwargs)
        return fn(*args, **kwargs)

    call.__name__, call.__qualname__, call.__doc__ = fn.__name__, fn.__qualname__, fn.__doc__
    call.op = op
    return call


# ---------------------------------------------------------------- dense projections and norms
@_op("linear", ("y",))
def linear(x: Tensor, x_scale: Optional[Tensor], w: Tensor, w_scale: Optional[Tensor],
           y: Tensor) -> None:
    """y [T, N] = x [T, K] · wᵀ with optional FP8 block scales (ops.h `linear`; on CUDA FP8 x and
    w run on FP8 tensor cores with fp32 scales in cuBLASLt's layouts)."""
    with device_guard(x):
        _C.linear(x, x_scale, w, w_scale, y, stream_handle(x))


@_op("quantize_act_fp8", ("xq", "scale"))
def quantize_act_fp8(x: Tensor, block: int, xq: Tensor, scale: Tensor) -> None:
    """Per-row, per-`block` FP8 e4m3 quantization with UE8M0 (power-of-two) scales."""
    with device_guard(x):
        _C.quantize_act_fp8(x, block, xq, scale, stream_handle(x))


@_op("dequantize_fp8_blocks", ("y",))
def dequantize_fp8_blocks(x: Tensor, scale: Tensor, block_rows: int, block_cols: int,
                          y: Tensor) -> None:
    """y = fp8(x) · the scale of its block_rows × block_cols block (ops.h `dequantize_fp8_blocks`):
    FP8 weights / activations → bf16 or fp32 (exact with UE8M0 scales)."""
    with device_guard(x):
        _C.dequantize_fp8_blocks(x, scale, block_rows, block_cols, y, stream_handle(x))


@_op("rms_norm", ("y",))
def rms_norm(x: Tensor, weight: Optional[Tensor], eps: float, y: Tensor) -> None:
    """y = x · rsqrt(mean(x²) + eps) · weight over the last dim (no weight: None)."""
    with device_guard(x):
        _C.rms_norm(x, weight, eps, y, stream_handle(x))


@_op("fused_qkv_rms_norm", ("q_out", "kv_out"))
def fused_qkv_rms_norm(q_in: Tensor, wq: Tensor, kv_in: Tensor, wkv: Tensor, eps: float,
                       q_out: Tensor, kv_out: Tensor) -> None:
    """q_out = RMSNorm(q_in; wq), kv_out = RMSNorm(kv_in; wkv)."""
    with device_guard(q_in):
        _C.fused_qkv_rms_norm(q_in, wq, kv_in, wkv, eps, q_out, kv_out, stream_handle(q_in))


@_op("apply_rope", ("y",))
def apply_rope(x: Tensor, positions: Tensor, cos_sin: Tensor, inverse: bool, y: Tensor) -> None:
    """GPT-J interleaved RoPE (inverse: conjugate) on the last R dims of each head."""
    with device_guard(x):
        _C.apply_rope(x, positions, cos_sin, inverse, y, stream_handle(x))


@_op("inv_rope_fp8_quant", ("o_fp8", "o_scale"))
def inv_rope_fp8_quant(o: Tensor, positions: Tensor, cos_sin: Tensor, block: int, o_fp8: Tensor,
                       o_scale: Tensor) -> None:
    """Inverse RoPE on o [T, H, D] bf16, rounded to bf16, then FP8 per 1 × block into o_fp8
    [T, H·D] and o_scale [T, H·D/block] (any strides; the CUDA FP8 GEMMs take the transpose of a
    contiguous [H·D/block, T] buffer) in one pass (ops.h `inv_rope_fp8_quant`)."""
    with device_guard(o):
        _C.inv_rope_fp8_quant(o, positions, cos_sin, block, o_fp8, o_scale, stream_handle(o))


@_op("grouped_wo_a", ("z",))
def grouped_wo_a(o: Tensor, o_scale: Optional[Tensor], wo_a: Tensor, wo_a_scale: Optional[Tensor],
                 z: Tensor) -> None:
    """Grouped low-rank output projection z[:, g] = o_g · wo_a_gᵀ (ops.h `grouped_wo_a`)."""
    with device_guard(o):
        _C.grouped_wo_a(o, o_scale, wo_a, wo_a_scale, z, stream_handle(o))


# ---------------------------------------------------------------- KV cache
@_op("qnorm_rope_kv_insert", ("q", "kv", "cache"))
def qnorm_rope_kv_insert(q: Tensor, kv: Tensor, positions: Tensor, cos_sin: Tensor, eps: float,
                         cache: Tensor, layout: str, block_size: int, tensor_scale: float,
                         slot_mapping: Tensor) -> None:
    """q head-norm + RoPE (in place), kv RoPE + quantized paged insert; kv ← the cached values."""
    with device_guard(q):
        _C.qnorm_rope_kv_insert(q, kv, positions, cos_sin, eps, cache, layout, block_size,
                                tensor_scale, slot_mapping, stream_handle(q))


@_op("kv_quantize", ("cache",))
def kv_quantize(cache: Tensor, layout: str, block_size: int, tensor_scale: float, values: Tensor,
                slots: Tensor) -> None:
    """Writes values [n, dim] to `cache` at global slots [n] (-1 = skip). CPU only."""
    _C.kv_quantize(cache, layout, block_size, tensor_scale, values, slots)


@_op("kv_dequantize", ("out",))
def kv_dequantize(cache: Tensor, layout: str, block_size: int, tensor_scale: float, slots: Tensor,
                  out: Tensor) -> None:
    """Reads the tokens at slots [n] into out [n, dim] (-1 → zeros). CPU only."""
    _C.kv_dequantize(cache, layout, block_size, tensor_scale, slots, out)


@_op("dequantize_and_gather", ("workspace",))
def dequantize_and_gather(cache: Tensor, layout: str, block_size: int, tensor_scale: float,
                          block_table: Tensor, seq_lens: Tensor, gather_lens: Optional[Tensor],
                          offset: int, workspace: Tensor) -> None:
    """Dequantizes each request's last gather_lens[r] entries into workspace[r, offset:]."""
    with device_guard(cache):
        _C.dequantize_and_gather(cache, layout, block_size, tensor_scale, block_table, seq_lens,
                                 gather_lens, offset, workspace, stream_handle(cache))


# ---------------------------------------------------------------- sparse attention
@_op("sparse_decode", ("workspace", "out", "lse"))
def sparse_decode(q: Tensor, k_cache: Tensor, k_layout: str, k_block_size: int, indices: Tensor,
                  topk_length: Optional[Tensor], extra_k_cache: Optional[Tensor],
                  extra_layout: str, extra_block_size: int, extra_indices: Optional[Tensor],
                  extra_topk_length: Optional[Tensor], attn_sink: Optional[Tensor],
                  softmax_scale: float, d_v: int, num_splits: int, split_len: int,
                  workspace_bytes: int, workspace: Tensor, out: Tensor, lse: Tensor) -> None:
    """Split-KV sparse decode over one or two paged-cache scopes; lse natural-log [b, s_q, H]."""
    with device_guard(q):
        _C.sparse_decode(q, k_cache, k_layout, k_block_size, indices, topk_length, extra_k_cache,
                         extra_layout, extra_block_size, extra_indices, extra_topk_length,
                         attn_sink, softmax_scale, d_v, num_splits, split_len, workspace_bytes,
                         workspace, out, lse, stream_handle(q))


@_op("sparse_attention_combine", ("out", "lse"))
def sparse_attention_combine(partial_o: Tensor, partial_lse: Tensor, attn_sink: Optional[Tensor],
                             out: Tensor, lse: Tensor) -> None:
    """Merges per-split partial (o, lse) into out/lse, applying the sink."""
    with device_guard(partial_o):
        _C.sparse_attention_combine(partial_o, partial_lse, attn_sink, out, lse,
                                    stream_handle(partial_o))


@_op("sparse_prefill", ("out", "max_logits", "lse"))
def sparse_prefill(q: Tensor, kv: Tensor, indices: Tensor, topk_length: Optional[Tensor],
                   attn_sink: Optional[Tensor], softmax_scale: float, d_v: int, out: Tensor,
                   max_logits: Tensor, lse: Tensor) -> None:
    """Sparse prefill over a bf16 kv [s_kv, 1, d_qk]; max_logits/lse in natural units. On CUDA
    the kernel's work counter (ops.h SparsePrefillArgs::work_counter) comes from torch's caching
    allocator, a stream-ordered 4 bytes per call, so calls in flight on several streams (or
    several captured graphs) never share one."""
    counter = torch.empty((1,), dtype=torch.int32, device=q.device) if q.is_cuda else None
    with device_guard(q):
        _C.sparse_prefill(q, kv, indices, topk_length, attn_sink, softmax_scale, d_v, out,
                          max_logits, lse, counter, stream_handle(q))


# ---------------------------------------------------------------- compressor (compressor.h)
# The CompressorConfig travels as its fields: head_dim (512 for target "kv_cache", 128 for
# "indexer_keys"), ratio (4 or 128), rope_dims, eps.
@_op("compressor_project", ("kv_rows", "score_rows"))
def compressor_project(head_dim: int, ratio: int, rope_dims: int, eps: float, target: str,
                       x: Tensor, wkv: Tensor, wgate: Tensor, ape: Tensor, positions: Tensor,
                       kv_rows: Tensor, score_rows: Tensor) -> None:
    """kv_rows = x·wkvᵀ, score_rows = x·wgateᵀ + ape[p mod ratio], fp32 [T, coff·head_dim]."""
    with device_guard(x):
        _C.compressor_project(head_dim, ratio, rope_dims, eps, target, x, wkv, wgate, ape,
                              positions, kv_rows, score_rows, stream_handle(x))


@_op("compressor_update_and_emit", ("state_rows", "out_cache", "entries"))
def compressor_update_and_emit(head_dim: int, ratio: int, rope_dims: int, eps: float,
                               target: str, kv_rows: Tensor, score_rows: Tensor,
                               positions: Tensor, token_to_req: Tensor, context_lens: Tensor,
                               norm_weight: Tensor, cos_sin: Tensor, state_rows: Tensor,
                               state_table: Tensor, state_block_size: int, out_cache: Tensor,
                               out_block_table: Tensor, out_block_size: int, out_layout: str,
                               out_tensor_scale: float, entries: Optional[Tensor]) -> None:
    """Emits the entries the batch completes into out_cache (a KV cache of out_layout, or the
    indexer key cache uint8 [blocks, out_block_size·132] for target "indexer_keys"), then saves
    the ring rows (state_rows fp32 [slots, 2·coff·head_dim] through state_table)."""
    with device_guard(kv_rows):
        _C.compressor_update_and_emit(head_dim, ratio, rope_dims, eps, target, kv_rows,
                                      score_rows, positions, token_to_req, context_lens,
                                      norm_weight, cos_sin, state_rows, state_table,
                                      state_block_size, out_cache, out_block_table,
                                      out_block_size, out_layout, out_tensor_scale, entries,
                                      stream_handle(kv_rows))


# ---------------------------------------------------------------- indexer (indexer.h)
@_op("indexer_query", ("q_fp8", "q_scale", "weights", "workspace"))
def indexer_query(qr: Tensor, wq_b: Tensor, wq_b_scale: Optional[Tensor], x: Tensor,
                  weights_proj: Tensor, positions: Tensor, cos_sin: Tensor, q_fp8: Tensor,
                  q_scale: Tensor, weights: Tensor, workspace: Optional[Tensor],
                  qr_scale: Optional[Tensor]) -> None:
    """Indexer queries: q_fp8 [T, H_I, 128] (RoPE, Hadamard, FP8 per head row), q_scale [T, H_I],
    weights [T, H_I]; workspace uint8 [>= _C.indexer_query_workspace_bytes(T, H_I)] on CUDA (None
    on CPU); qr_scale: the 1 x 128 block scales of an FP8 qr (None for bf16 / fp32 qr)."""
    with device_guard(qr):
        _C.indexer_query(qr, wq_b, wq_b_scale, x, weights_proj, positions, cos_sin, q_fp8,
                         q_scale, weights, workspace, qr_scale, stream_handle(qr))


@_op("indexer_scores", ("scores",))
def indexer_scores(q_fp8: Tensor, q_scale: Tensor, weights: Tensor, positions: Tensor,
                   token_to_req: Tensor, keys: Tensor, key_block_size: int,
                   key_block_table: Tensor, ratio: int, scores: Tensor) -> None:
    """scores [T, N] fp32 of every visible entry of the indexer key cache, −inf beyond."""
    with device_guard(q_fp8):
        _C.indexer_scores(q_fp8, q_scale, weights, positions, token_to_req, keys, key_block_size,
                          key_block_table, ratio, scores, stream_handle(q_fp8))


@_op("indexer_topk", ("indices", "lens"))
def indexer_topk(scores: Tensor, positions: Tensor, ratio: int, indices: Tensor,
                 lens: Optional[Tensor], sorted: bool = True) -> None:
    """indices [T, K] int32: the best min(K, visible) request-local entries (ties: lowest
    entries), −1 padded; lens [T] their count. sorted=True: descending score; sorted=False: the
    same entries in ascending entry order (TopkOrder::column: no sort on CUDA)."""
    with device_guard(scores):
        _C.indexer_topk(scores, positions, ratio, indices, lens, sorted, stream_handle(scores))


@_op("compressed_prefix_indices", ("indices", "lens"))
def compressed_prefix_indices(positions: Tensor, ratio: int, indices: Tensor,
                              lens: Optional[Tensor]) -> None:
    """C128A plan: indices [T, K] = 0 .. (p+1) div ratio − 1, then −1; lens [T] the count."""
    with device_guard(positions):
        _C.compressed_prefix_indices(positions, ratio, indices, lens, stream_handle(positions))


# ---------------------------------------------------------------- index planning
@_op("local_to_global_slots", ("global_", "lens"))
def local_to_global_slots(local: Tensor, token_to_req: Tensor, block_table: Tensor,
                          block_size: int, global_: Tensor, lens: Optional[Tensor],
                          checked: bool) -> None:
    """global = block_table[req][i // B] * B + i % B (-1 stays -1; checked: bad i is an error)."""
    with device_guard(local):
        _C.local_to_global_slots(local, token_to_req, block_table, block_size, global_, lens,
                                 checked, stream_handle(local))


@_op("swa_window_indices", ("indices", "lens"))
def swa_window_indices(positions: Tensor, token_to_req: Tensor, block_table: Tensor,
                       block_size: int, window: int, indices: Tensor, lens: Tensor) -> None:
    """Each token's SWA window (last min(W, p+1) positions) as global slots, -1 padded."""
    with device_guard(positions):
        _C.swa_window_indices(positions, token_to_req, block_table, block_size, window, indices,
                              lens, stream_handle(positions))


@_op("combine_topk_swa_indices", ("out", "out_lens"))
def combine_topk_swa_indices(topk: Tensor, query_start_loc: Tensor, seq_lens: Tensor,
                             gather_lens: Tensor, window: int, compressed_region: int,
                             rows_per_request: int, ratio: int, out: Tensor,
                             out_lens: Tensor) -> None:
    """Prefill gather-workspace indices: top-k compressed rows then the SWA window, packed."""
    with device_guard(query_start_loc):
        _C.combine_topk_swa_indices(topk, query_start_loc, seq_lens, gather_lens, window,
                                    compressed_region, rows_per_request, ratio, out, out_lens,
                                    stream_handle(query_start_loc))


def registered_ops() -> list:
    """The torch.ops.dsv4 ops this module registered (for tests and introspection)."""
    return list(_registered)

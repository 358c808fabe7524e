"""FlashMLA-compatible sparse attention: `from dsv4attn.flash_mla import ...` in place of
`from flash_mla import ...`.

Same function names, argument names, shapes, return values and conventions as FlashMLA's
`flash_mla_interface.py` (the version with attn_sink / topk_length / extra_k_cache, i.e. the
DeepSeek-V4 "MODEL1" kernels), on CPU and CUDA tensors:

- `get_mla_metadata() -> (FlashMLASchedMeta, None)`: an empty schedule, filled on the first
  `flash_mla_with_kvcache` call and checked for consistency on later ones (the current interface).
- `get_mla_metadata(cache_seqlens, num_q_tokens_per_head_k, num_heads_k, num_heads_q=,
  is_fp8_kvcache=, topk=) -> (tile_scheduler_metadata, num_splits)`: FlashMLA's older interface
  (the one vLLM's V3.2 FlashMLASparse backend calls), two int32 tensors on cache_seqlens' device
  (see "The older interface" below).
- `flash_mla_with_kvcache(...)` (sparse mode) -> (out [b, s_q, h_q, d_v] bf16,
  softmax_lse [b, h_q, s_q] fp32, a transposed view of a [b, s_q, h_q] buffer), with either
  interface's metadata.
- `flash_mla_sparse_fwd(...)` -> (out [s_q, h_q, d_v] bf16, max_logits [s_q, h_q] fp32,
  lse [s_q, h_q] fp32) (+ lse_indexer when indexer_topk > 0).

Conventions (as FlashMLA's kernels and tests/ref.py): lse and max_logits are natural-log /
natural units (max_logits = max_i sm_scale·q·k_i). FlashMLA's 2025-09 (V3.2) README described a
base-2 lse for the sparse prefill; the current kernels store `log(L) + m·ln2` (natural) and the
current tests/ref.py checks natural-log values, which is what this module returns. The sink
does not enter lse. A query with no valid key gets out = 0, lse = +inf (and max_logits = -inf).
Invalid indices are -1 (decode) or -1 / >= s_kv (prefill); slots past topk_length are ignored.

Strides (FlashMLA's rules, no copy is made): q, kv, indices (and out / lse buffers) may have any
strides whose last dim is contiguous — q [b, s_q, h_q, d] whose [b, s_q] dims don't merge, a
transposed or sliced indices view, q with padded heads. On CUDA, rows move in 16-byte pieces
(cp.async, vector stores, TMA descriptors), so the strides of q's and out's leading dims (those of
size > 1) and kv's row stride must be multiples of 8 elements, with 16-byte aligned data
pointers; a violation raises dsv4attn.Error naming the stride.

Caches (`k_cache`, `extra_k_cache`): FlashMLA's [num_blocks, page_block_size, 1, bytes_per_token]
view of the paged byte cache (uint8, int8 or float8_e4m3fn). bytes_per_token picks the layout:
584 → MODEL1_FP8 (d_qk 512: 448 fp8 + 64 bf16 + 8 scale bytes, blocks padded to 576 B),
656 → V32_FP8 (d_qk 576). Tokens are dense within a block (k_cache.stride(1) == bytes_per_token);
the block stride (k_cache.stride(0) bytes) may be any multiple of 16 >= the layout's block size
in bytes (`kv_cache_block_bytes`), e.g. V3.2 blocks of 64 x 656 B padded to 42640 B
(`alloc_kv_cache` makes one whose block stride is the layout's block size).
Extension: `is_fp8_kvcache=False` with indices reads a BF16 cache [num_blocks, B, 1, 512] bf16
(on CUDA through the sparse prefill kernel; a padded block stride must there be whole tokens).

Padded heads: q may carry more heads than the model has (vLLM pads h_q to 64 or 128 with
uninitialized rows); every head is computed independently, so the pad rows' outputs are garbage
the caller ignores and never affect the real heads.

The older interface: `get_mla_metadata(cache_seqlens=, num_q_tokens_per_head_k=, topk=,
num_heads_q=, num_heads_k=1, is_fp8_kvcache=True)` plans the split-KV decode for
b = cache_seqlens.numel(), s_q = num_q_tokens_per_head_k · num_heads_k / num_heads_q, h_q and
topk, and returns
  tile_scheduler_metadata int32 [1, 8] = [SCHEDULE_TAG, num_splits, split_len, b, s_q, h_q, topk,
                                          num_sms]
  num_splits int32 [b + 1] = [0, n, 2n, ..., b·n] (n splits per query row, cumulative per batch
                              as FlashMLA's)
on cache_seqlens' device, without a host sync (pinned staging, non-blocking copy). The plan is a
pure function of those shapes and the SM count, so `flash_mla_with_kvcache` given these tensors
(or copies of them in persistent buffers, as the seed keeps for CUDA graphs) re-derives the same
plan from its own arguments' shapes on the host and never reads the tensors' contents: no host
read or sync inside the call, and a captured graph stays valid on replay whatever the buffers
hold. The tensors are checked for dtype, shape and device only. With an extra scope the call
plans for topk + extra_topk (the older FlashMLA had no extra scope).

Extensions over FlashMLA: `out=` (and `lse=`) buffers to write into (as vLLM's fork has), the
extra scope / topk_length / attn_sink with the older interface too, and dsv4attn.Error (a
ValueError) instead of AssertionError for inconsistent arguments.
"""
from __future__ import annotations

import dataclasses
from typing import Optional, Tuple, Union

import torch

from . import Error
from ._args import float_arg, int_arg, optional_tensor_arg, tensor_arg
from ._runtime import decode_schedule, kv_geometry, planner_sms
from . import ops  # the torch.ops.dsv4.* ops, called through their fast callers (ops._fast_caller)

__all__ = [
    "FlashMLASchedMeta", "SCHEDULE_TAG", "alloc_kv_cache", "flash_mla_sparse_fwd",
    "flash_mla_with_kvcache", "get_mla_metadata", "kv_cache_block_bytes",
]

_FP8_LAYOUT_BY_TOKEN_BYTES = {584: "model1_fp8", 656: "v32_fp8"}
_TOKEN_BYTES_BY_LAYOUT = {"model1_fp8": 584, "v32_fp8": 656}
_BYTE_DTYPES = (torch.uint8, torch.int8, torch.float8_e4m3fn)
# First word of an older-interface tile_scheduler_metadata row ("DSV4" in ASCII): marks the row
# as dsv4attn's shape-derived schedule (see the module docstring).
SCHEDULE_TAG = 0x34565344
_SCHEDULE_WORDS = 8  # FlashMLA's TileSchedulerMetaDataSize: the seed's buffers are [parts, 8]


@dataclasses.dataclass
class FlashMLASchedMeta:
    """Scheduler metadata, filled on the first flash_mla_with_kvcache call (as FlashMLA's).

    Reuse it across calls (e.g. every layer of one decode step) only while the shapes are the
    same; `num_splits` / `split_len` / `workspace_bytes` are dsv4attn's split-KV plan, which
    depends only on shapes (so reusing it under CUDA graphs is safe).
    """

    @dataclasses.dataclass
    class Config:
        b: int
        s_q: int
        h_q: int
        page_block_size: int
        h_k: int
        causal: bool
        is_fp8_kvcache: bool
        topk: Optional[int]
        extra_page_block_size: Optional[int]
        extra_topk: Optional[int]

    have_initialized: bool = False
    config: Optional[Config] = None
    num_splits: Optional[int] = None
    split_len: Optional[int] = None
    workspace_bytes: Optional[int] = None


def get_mla_metadata(*args, **kwargs) -> Union[Tuple[FlashMLASchedMeta, None],
                                                Tuple[torch.Tensor, torch.Tensor]]:
    """Scheduler metadata of either FlashMLA interface.

    Without arguments (the current interface): (an empty FlashMLASchedMeta, None), filled by the
    first flash_mla_with_kvcache call. With the older interface's arguments
    `(cache_seqlens, num_q_tokens_per_head_k, num_heads_k, num_heads_q=None,
    is_fp8_kvcache=False, topk=None)`: (tile_scheduler_metadata int32 [1, 8], num_splits int32
    [b + 1]) on cache_seqlens' device, the shape-derived plan described in the module docstring.
    """
    if not args and not kwargs:
        return FlashMLASchedMeta(), None
    return _legacy_metadata(*args, **kwargs)


def _legacy_metadata(cache_seqlens: torch.Tensor, num_q_tokens_per_head_k: int,
                     num_heads_k: int, num_heads_q: Optional[int] = None,
                     is_fp8_kvcache: bool = False,
                     topk: Optional[int] = None) -> Tuple[torch.Tensor, torch.Tensor]:
    where = "get_mla_metadata"
    if not isinstance(cache_seqlens, torch.Tensor):
        raise Error(f"{where}: cache_seqlens: expected an int32 tensor [b], "
                    f"got {type(cache_seqlens).__name__}")
    if cache_seqlens.dim() != 1:
        raise Error(f"{where}: cache_seqlens.ndim: expected 1 ([b]), got {cache_seqlens.dim()}")
    if topk is None:
        raise Error(f"{where}: topk: expected the sparse top-k (an int >= 1); dense (non-sparse) "
                    "MLA decode is not implemented by dsv4attn")
    if num_heads_k != 1:
        raise Error(f"{where}: num_heads_k: expected 1, got {num_heads_k}")
    if num_heads_q is None or int(num_heads_q) < 1:
        raise Error(f"{where}: num_heads_q: expected an int >= 1 with topk, got {num_heads_q}")
    h_q, nq = int(num_heads_q), int(num_q_tokens_per_head_k)
    if nq < 1 or nq * num_heads_k % h_q != 0:
        raise Error(f"{where}: num_q_tokens_per_head_k: expected s_q · num_heads_q / num_heads_k "
                    f"(a positive multiple of num_heads_q = {h_q}), got {nq}")
    if int(topk) < 1:
        raise Error(f"{where}: topk: expected >= 1, got {topk}")
    b, s_q = cache_seqlens.shape[0], nq * num_heads_k // h_q
    sms = planner_sms(cache_seqlens.device)
    splits, split_len, _ = decode_schedule(b, s_q, h_q, int(topk), sms, 512)
    words = [SCHEDULE_TAG, splits, split_len, b, s_q, h_q, int(topk), sms]
    metadata = torch.tensor(words, dtype=torch.int32).view(1, _SCHEDULE_WORDS)
    num_splits = torch.arange(b + 1, dtype=torch.int32) * splits
    return _to_device(metadata, cache_seqlens.device), _to_device(num_splits, cache_seqlens.device)


def _to_device(t: torch.Tensor, device: torch.device) -> torch.Tensor:
    """A copy of host tensor `t` on `device`, staged through pinned memory so the host never
    waits for the device (the caching host allocator keeps the staging buffer until the copy is
    done)."""
    if device.type != "cuda":
        return t.to(device)
    return t.pin_memory().to(device, non_blocking=True)


# The block bytes of each (layout, page_block_size) met so far: the extension builds the whole
# geometry per query (~1 µs), and every decode call (and vllm_ops' cache views) asks for one or two.
_BLOCK_BYTES: dict = {}


def kv_cache_block_bytes(layout: str, page_block_size: int) -> int:
    """Bytes per cache block of `layout` ("model1_fp8", "v32_fp8", "bf16"), padding included."""
    if torch.compiler.is_compiling():  # (a constant for the trace: kv_geometry)
        return int(kv_geometry(layout, page_block_size)["block_bytes"])
    block_bytes = _BLOCK_BYTES.get((layout, page_block_size))
    if block_bytes is None:  # (an invalid pair raises here every time: nothing cached)
        block_bytes = int(kv_geometry(layout, page_block_size)["block_bytes"])
        _BLOCK_BYTES[(layout, page_block_size)] = block_bytes
    return block_bytes


def alloc_kv_cache(num_blocks: int, page_block_size: int, layout: str = "model1_fp8",
                   device: Union[torch.device, str] = "cpu") -> torch.Tensor:
    """A zeroed paged cache in FlashMLA's view [num_blocks, page_block_size, 1, token_bytes]
    (uint8; bf16 [..., 512] for "bf16") whose block stride is the layout's padded block size."""
    geo = kv_geometry(layout, page_block_size)
    storage = torch.zeros((num_blocks, geo["block_bytes"]), dtype=torch.uint8, device=device)
    if layout == "bf16":
        return storage.view(torch.bfloat16).as_strided(
            (num_blocks, page_block_size, 1, 512), (geo["block_bytes"] // 2, 512, 512, 1))
    tb = geo["token_bytes"]
    return storage.as_strided((num_blocks, page_block_size, 1, tb),
                              (geo["block_bytes"], tb, tb, 1))


def _cache_bytes(name: str, k_cache: torch.Tensor, is_fp8: bool, d_qk: int):
    """(uint8 [num_blocks, block_bytes] view with the cache's block stride, layout,
    page_block_size) of a FlashMLA cache view."""
    if k_cache.dim() != 4:
        raise Error(f"flash_mla_with_kvcache: {name}.ndim: expected 4 "
                    f"([num_blocks, page_block_size, 1, bytes_per_token]), got {k_cache.dim()}")
    num_blocks, block_size, h_k, last = k_cache.shape
    if h_k != 1:
        raise Error(f"flash_mla_with_kvcache: {name}.shape[2] (num_heads_k): expected 1, got {h_k}")
    if is_fp8:
        if k_cache.dtype not in _BYTE_DTYPES:
            raise Error(f"flash_mla_with_kvcache: {name}.dtype: expected uint8, int8 or "
                        f"float8_e4m3fn for an FP8 cache, got {k_cache.dtype}")
        layout = _FP8_LAYOUT_BY_TOKEN_BYTES.get(last)
        if layout is None:
            raise Error(f"flash_mla_with_kvcache: {name}.shape[3] (bytes per token): expected "
                        f"584 (MODEL1_FP8) or 656 (V32_FP8), got {last}")
        byte_view = k_cache if k_cache.dtype == torch.uint8 else k_cache.view(torch.uint8)
        elem = 1
    else:
        if k_cache.dtype != torch.bfloat16 or last != 512:
            raise Error(f"flash_mla_with_kvcache: {name}: expected a bf16 [.., .., 1, 512] cache "
                        f"when is_fp8_kvcache is False, got {k_cache.dtype} {list(k_cache.shape)}")
        layout, byte_view, elem = "bf16", k_cache, 2
    dim = 576 if layout == "v32_fp8" else 512
    if d_qk != dim:
        raise Error(f"flash_mla_with_kvcache: q.shape[-1]: expected {dim} for a "
                    f"{layout.upper()} {name}, got {d_qk}")
    block_bytes = kv_cache_block_bytes(layout, block_size)
    token_bytes = last * elem
    strides = k_cache.stride()  # (one call: each stride(i) is a call of its own)
    if strides[3] != 1 or (block_size > 1 and strides[1] * elem != token_bytes):
        raise Error(f"flash_mla_with_kvcache: {name}: expected tokens dense within a block "
                    f"(stride(1) = {last}, the bytes per token, and stride(3) = 1), got strides "
                    f"{strides}")
    block_stride = strides[0] * elem if num_blocks > 1 else block_bytes
    if block_stride < block_bytes or block_stride % 16 != 0:
        raise Error(f"flash_mla_with_kvcache: {name}.stride(0): expected a block stride of at "
                    f"least {block_bytes // elem} elements ({block_bytes} bytes, the "
                    f"{layout.upper()} block at page_block_size {block_size}) and a multiple of "
                    f"16 bytes, got {k_cache.stride(0)}")
    flat = byte_view.view(torch.uint8) if elem != 1 else byte_view
    return block_bytes_view(f"flash_mla_with_kvcache: {name}", flat, num_blocks, block_bytes,
                            block_stride), layout, block_size


def block_bytes_view(where: str, flat: torch.Tensor, num_blocks: int, block_bytes: int,
                     block_stride: Optional[int] = None) -> torch.Tensor:
    """The uint8 [num_blocks, block_bytes] view (the C++ ops' cache argument) of a cache whose
    blocks start every `block_stride` bytes (default block_bytes) from `flat`'s first byte."""
    stride = block_bytes if block_stride is None else block_stride
    if not torch.compiler.is_compiling():  # (as_strided bounds-checks the traced graph)
        need = (num_blocks - 1) * stride + block_bytes if num_blocks > 0 else 0
        available = flat.untyped_storage().nbytes() - flat.storage_offset()
        if available < need:
            raise Error(f"{where}: storage: expected >= {need} bytes ({num_blocks} blocks of "
                        f"{block_bytes}, {stride} apart), got {available}")
    return flat.as_strided((num_blocks, block_bytes), (stride, 1))  # same storage offset


def _check_legacy_metadata(metadata: torch.Tensor, num_splits: Optional[torch.Tensor], b: int,
                           device: torch.device) -> None:
    """The older interface's tensors: dtype, shape and device (their contents are not read)."""
    where = "flash_mla_with_kvcache"
    if (metadata.dtype != torch.int32 or metadata.dim() != 2 or metadata.shape[0] < 1
            or metadata.shape[1] != _SCHEDULE_WORDS):
        raise Error(f"{where}: tile_scheduler_metadata: expected an int32 [num_sm_parts >= 1, "
                    f"{_SCHEDULE_WORDS}] tensor of get_mla_metadata(cache_seqlens, ...), got "
                    f"{metadata.dtype} {list(metadata.shape)}")
    if metadata.device != device:
        raise Error(f"{where}: tile_scheduler_metadata.device: expected {device} (q's), "
                    f"got {metadata.device}")
    if num_splits is None:
        return
    if not isinstance(num_splits, torch.Tensor):
        raise Error(f"{where}: num_splits: expected the int32 [b + 1] tensor of "
                    f"get_mla_metadata(cache_seqlens, ...) or None, got {num_splits!r}")
    if num_splits.dtype != torch.int32 or num_splits.dim() != 1 or num_splits.shape[0] != b + 1:
        raise Error(f"{where}: num_splits: expected an int32 [{b + 1}] tensor (b + 1, b = "
                    f"q.shape[0]), got {num_splits.dtype} {list(num_splits.shape)}")
    if num_splits.device != device:
        raise Error(f"{where}: num_splits.device: expected {device} (q's), "
                    f"got {num_splits.device}")


def _check_sched(meta: FlashMLASchedMeta, cfg: FlashMLASchedMeta.Config) -> None:
    """Checks a call's config against the metadata's (set by its first successful call); writes
    nothing, so a rejected call leaves the metadata as it was (see _fill_sched)."""
    if not isinstance(meta, FlashMLASchedMeta):
        raise Error("flash_mla_with_kvcache: tile_scheduler_metadata: expected the "
                    "FlashMLASchedMeta of get_mla_metadata() or the int32 tensor of "
                    f"get_mla_metadata(cache_seqlens, ...), got {type(meta).__name__}")
    if not meta.have_initialized or meta.config == cfg:  # (one tuple comparison when it matches)
        return
    for field in dataclasses.fields(cfg):
        want, got = getattr(meta.config, field.name), getattr(cfg, field.name)
        if want != got:
            raise Error(f"flash_mla_with_kvcache: sched_meta.config.{field.name}: expected "
                        f"{want} (the value of the first call with this metadata), got {got}. "
                        "Your input arguments are inconsistent with sched_meta.")


def _fill_sched(meta: FlashMLASchedMeta, cfg: FlashMLASchedMeta.Config,
                schedule: Optional[tuple]) -> None:
    """Records the first accepted call's config (and split plan) in the metadata."""
    if not meta.have_initialized:
        meta.have_initialized, meta.config = True, cfg
    if schedule is not None and meta.num_splits is None:
        meta.num_splits, meta.split_len, meta.workspace_bytes = schedule


def flash_mla_with_kvcache(
    q: torch.Tensor,
    k_cache: torch.Tensor,
    block_table: Optional[torch.Tensor],
    cache_seqlens: Optional[torch.Tensor],
    head_dim_v: int,
    tile_scheduler_metadata: Union[FlashMLASchedMeta, torch.Tensor],
    num_splits: Optional[torch.Tensor] = None,
    softmax_scale: Optional[float] = None,
    causal: bool = False,
    is_fp8_kvcache: bool = False,
    indices: Optional[torch.Tensor] = None,
    attn_sink: Optional[torch.Tensor] = None,
    extra_k_cache: Optional[torch.Tensor] = None,
    extra_indices_in_kvcache: Optional[torch.Tensor] = None,
    topk_length: Optional[torch.Tensor] = None,
    extra_topk_length: Optional[torch.Tensor] = None,
    out: Optional[torch.Tensor] = None,
    lse: Optional[torch.Tensor] = None,
) -> Tuple[torch.Tensor, torch.Tensor]:
    """Sparse decode over a paged cache (and an optional extra cache), FlashMLA's contract.

    q [b, s_q, h_q, d_qk] bf16; indices [b, s_q, topk] int32 global slots
    (block * page_block_size + offset, -1 invalid); topk_length [b] int32; attn_sink [h_q] fp32
    (out *= exp(lse) / (exp(lse) + exp(sink))); extra_k_cache / extra_indices_in_kvcache /
    extra_topk_length: a second scope joined into the same softmax. block_table and
    cache_seqlens are unused in sparse mode. Returns (out [b, s_q, h_q, head_dim_v] bf16,
    softmax_lse [b, h_q, s_q] fp32 natural log, +inf for a query with no valid key).
    `out` / `lse` (extension): buffers [b, s_q, h_q, d_v] / [b, s_q, h_q] to write into.

    Metadata: the FlashMLASchedMeta of `get_mla_metadata()` with num_splits None (the current
    interface), or the (tile_scheduler_metadata, num_splits) int32 tensors of the older
    `get_mla_metadata(cache_seqlens, ...)`, or persistent copies of them; their contents are never
    read (the plan is re-derived from the shapes, see the module docstring). A FlashMLASchedMeta
    is filled only by a call that is accepted: a rejected call (dsv4attn.Error) leaves it, like
    every output, unchanged.
    """
    where = "flash_mla_with_kvcache"
    q, k_cache = tensor_arg(where, "q", q), tensor_arg(where, "k_cache", k_cache)
    indices = optional_tensor_arg(where, "indices", indices)
    extra_k_cache = optional_tensor_arg(where, "extra_k_cache", extra_k_cache)
    extra_indices_in_kvcache = optional_tensor_arg(where, "extra_indices_in_kvcache",
                                                   extra_indices_in_kvcache)
    legacy = isinstance(tile_scheduler_metadata, torch.Tensor)
    if not legacy and num_splits is not None:
        raise Error("flash_mla_with_kvcache: num_splits: expected None with a FlashMLASchedMeta "
                    "(the current interface; the older one passes both tensors of "
                    f"get_mla_metadata(cache_seqlens, ...)), got {num_splits!r}")
    if indices is None:
        raise Error("flash_mla_with_kvcache: indices: expected a tensor; dense (non-sparse) "
                    "MLA decode is not implemented by dsv4attn")
    if causal:
        raise Error("flash_mla_with_kvcache: causal: expected False when sparse attention is "
                    "enabled (indices given), got True")
    if extra_k_cache is None and (extra_indices_in_kvcache is not None
                                  or extra_topk_length is not None):
        raise Error("flash_mla_with_kvcache: extra_indices_in_kvcache / extra_topk_length must "
                    "not be provided when extra_k_cache is not provided")
    if extra_k_cache is not None and extra_indices_in_kvcache is None:
        raise Error("flash_mla_with_kvcache: extra_indices_in_kvcache must be provided when "
                    "extra_k_cache is provided")
    if q.dim() != 4:
        raise Error(f"flash_mla_with_kvcache: q.ndim: expected 4 ([b, s_q, h_q, d_qk]), "
                    f"got {q.dim()}")
    if q.dtype != torch.bfloat16:
        # FlashMLA's sparse decode takes a bf16 q; dsv4attn's op would also take an FP8 one
        # (SparseDecodeArgs::q_scale), which this interface has no argument for.
        raise Error(f"flash_mla_with_kvcache: q.dtype: expected torch.bfloat16, got {q.dtype}")
    b, s_q, h_q, d_qk = q.shape
    head_dim_v = int_arg(where, "head_dim_v", head_dim_v, 1, d_qk)
    cfg = None
    if legacy:
        _check_legacy_metadata(tile_scheduler_metadata, num_splits, b, q.device)
    else:
        cfg = FlashMLASchedMeta.Config(
            b, s_q, h_q, k_cache.shape[1] if k_cache.dim() > 1 else -1,
            k_cache.shape[2] if k_cache.dim() > 2 else -1, causal, is_fp8_kvcache,
            indices.shape[-1],
            extra_k_cache.shape[1] if extra_k_cache is not None else None,
            extra_indices_in_kvcache.shape[-1] if extra_indices_in_kvcache is not None else None)
        _check_sched(tile_scheduler_metadata, cfg)

    blocks, layout, block_size = _cache_bytes("k_cache", k_cache, is_fp8_kvcache, d_qk)
    extra_blocks, extra_layout, extra_block_size = None, layout, block_size
    if extra_k_cache is not None:
        extra_blocks, extra_layout, extra_block_size = _cache_bytes(
            "extra_k_cache", extra_k_cache, is_fp8_kvcache, d_qk)
    softmax_scale = (d_qk ** (-0.5) if softmax_scale is None
                     else float_arg(where, "softmax_scale", softmax_scale))

    meta = None if legacy else tile_scheduler_metadata
    if q.device.type == "cuda" and layout == "bf16":
        result = _bf16_cache_decode_cuda(q, blocks, block_size, indices, topk_length, attn_sink,
                                         extra_k_cache, softmax_scale, head_dim_v, out, lse)
        if meta is not None:
            _fill_sched(meta, cfg, None)
        return result

    if meta is not None and meta.num_splits is not None:
        schedule = (meta.num_splits, meta.split_len, meta.workspace_bytes)
    else:  # the older interface's tensors encode this same shape-only plan
        topk_total = indices.shape[-1] + (extra_indices_in_kvcache.shape[-1]
                                          if extra_indices_in_kvcache is not None else 0)
        schedule = decode_schedule(b, s_q, h_q, topk_total, planner_sms(q.device), head_dim_v)
    splits, split_len, workspace_bytes = schedule
    workspace = torch.empty(max(workspace_bytes, 16), dtype=torch.uint8, device=q.device)
    if out is None:
        out = torch.empty((b, s_q, h_q, head_dim_v), dtype=torch.bfloat16, device=q.device)
    if lse is None:
        lse = torch.empty((b, s_q, h_q), dtype=torch.float32, device=q.device)
    ops.sparse_decode(
        q, blocks, layout, block_size, indices, topk_length, extra_blocks, extra_layout,
        extra_block_size, extra_indices_in_kvcache, extra_topk_length, attn_sink,
        softmax_scale, head_dim_v, splits, split_len, workspace_bytes, workspace, out, lse)
    if meta is not None:
        _fill_sched(meta, cfg, schedule)  # validated (the op raised nothing): now it is the plan
    return out, lse.transpose(1, 2)


def _bf16_cache_decode_cuda(q, blocks, block_size, indices, topk_length, attn_sink, extra_k_cache,
                            softmax_scale, head_dim_v, out, lse):
    """A bf16 cache on CUDA: the decode kernels read FP8 caches, but a bf16 paged cache is a bf16
    [slots, 1, 512] array, so the sparse prefill kernel (same contract: masked -1 / out-of-range
    slots, topk_length, sink, natural-log lse, +inf with no valid key) serves every query row.
    Views only, except that a padded block stride needs the slots renumbered (a small index
    tensor) and per-row lengths are expanded when s_q > 1."""
    if extra_k_cache is not None:
        raise Error("flash_mla_with_kvcache: extra_k_cache: a bf16 cache with an extra scope runs "
                    "on the CPU only (the CUDA decode kernels read MODEL1_FP8 / V32_FP8 caches)")
    b, s_q, h_q, d_qk = q.shape
    token_bytes = 2 * d_qk
    block_stride = blocks.stride(0) if blocks.shape[0] > 1 else blocks.shape[1]
    if block_stride % token_bytes != 0:
        raise Error(f"flash_mla_with_kvcache: k_cache.stride(0): a bf16 cache on CUDA needs a "
                    f"block stride that is a multiple of {token_bytes // 2} elements (whole "
                    f"tokens), got {block_stride // 2}")
    rows_per_block = block_stride // token_bytes
    kv_rows = (blocks.shape[0] - 1) * rows_per_block + block_size if blocks.shape[0] else 0
    kv = blocks.view(torch.bfloat16).as_strided((kv_rows, 1, d_qk), (d_qk, d_qk, 1))
    if rows_per_block != block_size:  # padded blocks: slot (block, offset) is kv row
        indices = torch.where(indices >= 0,  # block · rows_per_block + offset; -1 stays
                              indices // block_size * rows_per_block + indices % block_size,
                              indices)
    if out is None:
        out = torch.empty((b, s_q, h_q, head_dim_v), dtype=torch.bfloat16, device=q.device)
    if lse is None:
        lse = torch.empty((b, s_q, h_q), dtype=torch.float32, device=q.device)
    rows = b * s_q
    row_len = topk_length if topk_length is None or s_q == 1 else \
        topk_length.repeat_interleave(s_q)
    max_logits = torch.empty((rows, h_q), dtype=torch.float32, device=q.device)
    merged = [_merge_rows(t) for t in (q, indices, out, lse)]
    if all(m is not None for m in merged):  # one launch over all b · s_q query rows
        q_rows, idx_rows, out_rows, lse_rows = merged
        ops.sparse_prefill(q_rows, kv, idx_rows.unsqueeze(1), row_len, attn_sink,
                           softmax_scale, head_dim_v, out_rows, max_logits, lse_rows)
    else:  # [b, s_q] of some view do not merge: one launch per batch entry, still no copy
        for bi in range(b):
            rl = row_len[bi * s_q:(bi + 1) * s_q] if row_len is not None else None
            ops.sparse_prefill(q[bi], kv, indices[bi].unsqueeze(1), rl, attn_sink,
                               softmax_scale, head_dim_v, out[bi],
                               max_logits[bi * s_q:(bi + 1) * s_q], lse[bi])
    return out, lse.transpose(1, 2)


def _merge_rows(t: torch.Tensor) -> Optional[torch.Tensor]:
    """The [b · s_q, ...] view of a [b, s_q, ...] tensor, or None when those dims don't merge."""
    b, s_q = t.shape[0], t.shape[1]
    if b == 1 or s_q == 1 or t.stride(0) == s_q * t.stride(1):
        return t.reshape(b * s_q, *t.shape[2:])  # a view: reshape copies only unmergeable dims
    return None


def flash_mla_sparse_fwd(
    q: torch.Tensor,
    kv: torch.Tensor,
    indices: torch.Tensor,
    sm_scale: float,
    d_v: int = 512,
    attn_sink: Optional[torch.Tensor] = None,
    topk_length: Optional[torch.Tensor] = None,
    indexer_topk: int = 0,
    out: Optional[torch.Tensor] = None,
) -> Union[Tuple[torch.Tensor, torch.Tensor, torch.Tensor],
           Tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]]:
    """Sparse prefill, FlashMLA's contract.

    q [s_q, h_q, d_qk] bf16, kv [s_kv, 1, d_qk] bf16, indices [s_q, 1, topk] int32 (-1 or
    >= s_kv: invalid), topk_length [s_q] int32, attn_sink [h_q] fp32 (no effect on lse and
    max_logits). Returns (out [s_q, h_q, d_v] bf16, max_logits [s_q, h_q] fp32,
    lse [s_q, h_q] fp32), natural units; with indexer_topk > 0 also lse_indexer [s_q, h_q], the
    lse over the first indexer_topk slots of indices only.
    """
    where = "flash_mla_sparse_fwd"
    q, kv = tensor_arg(where, "q", q), tensor_arg(where, "kv", kv)
    indices = tensor_arg(where, "indices", indices)
    if q.dim() != 3:
        raise Error(f"flash_mla_sparse_fwd: q.ndim: expected 3 ([s_q, h_q, d_qk]), got {q.dim()}")
    if indices.dim() < 1:
        raise Error(f"{where}: indices.ndim: expected 3 ([s_q, 1, topk]), got {indices.dim()}")
    indexer_topk = int_arg(where, "indexer_topk", indexer_topk, 0, indices.shape[-1])
    s_q, h_q, d_qk = q.shape
    d_v = int_arg(where, "d_v", d_v, 1, d_qk)  # (before it sizes out)
    sm_scale = float_arg(where, "sm_scale", sm_scale)
    if out is None:
        out = torch.empty((s_q, h_q, d_v), dtype=torch.bfloat16, device=q.device)
    max_logits = torch.empty((s_q, h_q), dtype=torch.float32, device=q.device)
    lse = torch.empty((s_q, h_q), dtype=torch.float32, device=q.device)
    ops.sparse_prefill(q, kv, indices, topk_length, attn_sink, sm_scale, d_v, out,
                       max_logits, lse)
    if not indexer_topk:
        return out, max_logits, lse
    # lse over the indexer's slots only: the same attention restricted to the first
    # indexer_topk slots (a second pass; FlashMLA fuses it into the first).
    sub_len = (torch.clamp(topk_length, max=indexer_topk) if topk_length is not None
               else None)
    scratch = torch.empty_like(out)
    scratch_max = torch.empty_like(max_logits)
    lse_indexer = torch.empty_like(lse)
    head = indices[..., :indexer_topk]  # a strided view: indices need only a dense last dim
    ops.sparse_prefill(q, kv, head, sub_len, None, float(sm_scale), int(d_v), scratch,
                       scratch_max, lse_indexer)
    return out, max_logits, lse, lse_indexer

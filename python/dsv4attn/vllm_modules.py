"""vLLM's DeepSeek-V4 `DeepseekCompressor` and `Indexer` modules on dsv4attn's torch ops.

In vLLM the V4 attention wrapper calls them as separate modules (seeds/001):

    compressor(hidden_states, positions, rotary_emb)          -> writes the compressed KV cache
    indexer(hidden_states, qr, positions, indexer_rotary_emb) -> fills topk_indices_buffer

reading the caches and the per-step metadata from vLLM's forward context. Here the engine
passes them: the caches are its own tensors (paged, any block stride), the metadata a
`CompressorMetadata`; `rotary_emb` is its cos/sin table (`cos_sin_cache`, [max_pos, rope_dim]
cos || sin, as vLLM's rotary embedding holds it). The weights carry the checkpoint's names
(`compressor.{wkv,wgate,norm}.weight`, `compressor.ape`; `indexer.{wq_b,weights_proj}.weight`,
`indexer.compressor.*`), so `load_state_dict` takes the checkpoint's tensors.

Both run on CPU tensors (the float64-checked C++ reference) or CUDA tensors (the CUDA kernels,
on torch's current stream, with no host synchronization: nothing here reads a tensor's values
on the host, and scratch comes from torch's caching allocator, so a step is CUDA-graph
capturable). The math is include/dsv4/compressor.h and indexer.h; so are the contracts (each
request's tokens one contiguous run of consecutive positions continuing where its state
stopped), which the CPU checks and CUDA trusts (see those headers for what CUDA skips instead).
"""
from __future__ import annotations

import dataclasses
from typing import Optional

import torch

from . import Error
from . import ops  # the torch.ops.dsv4.* ops, called through their fast callers (ops._fast_caller)
from . import _C
from ._args import INT32_MAX, float_arg, int_arg, optional_tensor_arg, tensor_arg
from .flash_mla import block_bytes_view

__all__ = ["CompressorMetadata", "DeepseekCompressor", "Indexer"]

_INDEXER_KEY_DIM = 128
_INDEXER_KEY_BYTES = _INDEXER_KEY_DIM + 4  # fp8 codes + one fp32 scale per entry


@dataclasses.dataclass
class CompressorMetadata:
    """One step's metadata for a compressor (and the indexer's compressor), all int32 on the
    tensors' device except context_lens (int32/int64).

    token_to_req [T]: the request (row of the block tables) of each token; a request's tokens
        form one contiguous run with consecutive positions.
    context_lens [R]: positions of each request the state has consumed before this step (vLLM:
        seq_lens - query_lens).
    state_block_table [R, >= ceil(ring_rows / state_block_size)]: each request's ring blocks in
        the state cache (ring_rows = 8 for ratio 4, 128 for ratio 128).
    block_table [R, max_blocks]: each request's blocks of the compressed cache written (the
        attention KV cache, or the indexer key cache): entry j at block_table[r][j // B]·B + j % B.
    """
    token_to_req: torch.Tensor
    context_lens: torch.Tensor
    state_block_table: torch.Tensor
    block_table: torch.Tensor

    @classmethod
    def from_query_start_loc(cls, query_start_loc: torch.Tensor, seq_lens: torch.Tensor,
                             state_block_table: torch.Tensor, block_table: torch.Tensor,
                             num_tokens: int) -> "CompressorMetadata":
        """From vLLM's attention metadata: query_start_loc [R + 1] (tokens of request r are
        rows query_start_loc[r] - query_start_loc[0] .. of this step), seq_lens [R] (positions
        after the step). Device-side torch ops only (no host synchronization); tokens outside
        every request get request -1, which the ops skip (CUDA) or reject (CPU)."""
        where = "CompressorMetadata.from_query_start_loc"
        qsl = tensor_arg(where, "query_start_loc", query_start_loc)
        seq_lens = tensor_arg(where, "seq_lens", seq_lens)
        num_tokens = int_arg(where, "num_tokens", num_tokens, 0, INT32_MAX)
        if qsl.dim() != 1 or qsl.shape[0] < 1 or list(seq_lens.shape) != [qsl.shape[0] - 1]:
            raise Error(f"{where}: query_start_loc / seq_lens: expected [R + 1] / [R], got "
                        f"{list(qsl.shape)} / {list(seq_lens.shape)}")
        q = qsl.to(torch.int64)
        token = q[0] + torch.arange(num_tokens, device=qsl.device)
        req = torch.searchsorted(q[1:], token, right=True)
        req = torch.where(req < q.shape[0] - 1, req, -1).to(torch.int32)
        context_lens = (seq_lens.to(torch.int64) - (q[1:] - q[:-1])).to(torch.int32)
        return cls(req, context_lens, state_block_table, block_table)


def _weight(shape, dtype, device) -> torch.nn.Module:
    """A holder module with one frozen `weight` (vLLM's linear / norm layers expose `.weight`)."""
    holder = torch.nn.Module()
    holder.weight = torch.nn.Parameter(torch.empty(shape, dtype=dtype, device=device),
                                       requires_grad=False)
    return holder


def _rows_view(where: str, name: str, cache: torch.Tensor, width: int,
               dtype: torch.dtype) -> torch.Tensor:
    """`cache` ([num_slots, width] or [num_blocks, block_size, width]) as [slots, width] rows."""
    cache = tensor_arg(where, name, cache)
    if cache.dtype != dtype or cache.dim() not in (2, 3) or cache.shape[-1] != width:
        raise Error(f"{where}: {name}: expected {dtype} [num_slots, {width}] or "
                    f"[num_blocks, block_size, {width}], got {cache.dtype} {list(cache.shape)}")
    if cache.dim() == 3:
        if (cache.stride(2) != 1 or (cache.shape[1] > 1 and cache.stride(1) != width) or
                (cache.shape[0] > 1 and cache.stride(0) != cache.shape[1] * width)):
            raise Error(f"{where}: {name}.stride(): expected dense blocks of {width}-wide rows "
                        f"(the ring is addressed as rows), got {tuple(cache.stride())}")
        cache = cache.view(-1, width)
    return cache


def _metadata_arg(where: str, metadata) -> CompressorMetadata:
    if not isinstance(metadata, CompressorMetadata):
        raise Error(f"{where}: metadata: expected a CompressorMetadata, "
                    f"got {type(metadata).__name__}")
    return metadata


def _key_blocks(where: str, k_cache: torch.Tensor, block_size: int) -> torch.Tensor:
    """The indexer key cache as uint8 [num_blocks, block_size·132]: given 2-d (that, or any row
    stride) or as vLLM's [num_blocks, block_size, 132] with dense blocks and any block stride."""
    k_cache = tensor_arg(where, "k_cache", k_cache)
    block_bytes = block_size * _INDEXER_KEY_BYTES
    if k_cache.dim() not in (2, 3):
        raise Error(f"{where}: k_cache.ndim: expected 2 or 3, got {k_cache.dim()}")
    if k_cache.dtype not in (torch.uint8, torch.int8, torch.float8_e4m3fn):
        raise Error(f"{where}: k_cache.dtype: expected uint8 (indexer key bytes), "
                    f"got {k_cache.dtype}")
    shape = list(k_cache.shape)
    if shape not in ([shape[0], block_bytes], [shape[0], block_size, _INDEXER_KEY_BYTES]) or \
            k_cache.stride(-1) != 1 or \
            (k_cache.dim() == 3 and block_size > 1 and k_cache.stride(1) != _INDEXER_KEY_BYTES):
        raise Error(f"{where}: k_cache: expected [num_blocks, {block_bytes}] or "
                    f"[num_blocks, {block_size}, {_INDEXER_KEY_BYTES}] with dense blocks, got "
                    f"shape {shape}, strides {tuple(k_cache.stride())}")
    stride = k_cache.stride(0) if shape[0] > 1 else block_bytes
    return block_bytes_view(where, k_cache.view(torch.uint8), shape[0], block_bytes, stride)


class DeepseekCompressor(torch.nn.Module):
    """vLLM's DeepseekCompressor: per token kv = x·wkvᵀ, score = x·wgateᵀ + ape[p mod r]; each
    completed window of `compress_ratio` positions (overlapping pairs for ratio 4) is
    softmax-pooled, RMS-normed, RoPE'd at its first position and written to the compressed cache
    (`target` "kv_cache": the attention's MODEL1_FP8 cache, head_dim 512; "indexer_keys": the
    indexer key cache after a Hadamard rotation, head_dim 128). Partial windows persist in the
    caller's fp32 state cache (ring_rows rows of state_width fp32 per request)."""

    def __init__(self, compress_ratio: int, hidden_size: int, head_dim: int = 512,
                 rope_dim: int = 64, eps: float = 1e-6, target: str = "kv_cache",
                 dtype: torch.dtype = torch.bfloat16, device=None):
        super().__init__()
        where = "DeepseekCompressor"
        self.compress_ratio = int_arg(where, "compress_ratio", compress_ratio, 4, 128)
        if self.compress_ratio not in (4, 128):
            raise Error(f"{where}: compress_ratio: expected 4 or 128, got {compress_ratio}")
        self.hidden_size = int_arg(where, "hidden_size", hidden_size, 1)
        self.head_dim = int_arg(where, "head_dim", head_dim, 1)
        self.rope_dim = int_arg(where, "rope_dim", rope_dim, 1, self.head_dim)
        self.eps = float_arg(where, "eps", eps, positive=True)
        if target not in ("kv_cache", "indexer_keys"):
            raise Error(f"{where}: target: expected 'kv_cache' or 'indexer_keys', got {target!r}")
        self.target = target
        self.coff = 2 if self.compress_ratio == 4 else 1
        width = self.coff * self.head_dim
        self.wkv = _weight((width, hidden_size), dtype, device)
        self.wgate = _weight((width, hidden_size), dtype, device)
        self.ape = torch.nn.Parameter(
            torch.empty((self.compress_ratio, width), dtype=torch.float32, device=device),
            requires_grad=False)
        self.norm = _weight((self.head_dim,), dtype, device)

    @property
    def state_width(self) -> int:
        """fp32 values per ring row: [kv | score], each coff·head_dim."""
        return 2 * self.coff * self.head_dim

    @property
    def ring_rows(self) -> int:
        """State rows each request needs (its ring)."""
        return self.coff * self.compress_ratio

    def forward(self, hidden_states: torch.Tensor, positions: torch.Tensor,
                cos_sin_cache: torch.Tensor, state_cache: torch.Tensor, k_cache: torch.Tensor,
                metadata: CompressorMetadata, state_block_size: int, block_size: int,
                entries: Optional[torch.Tensor] = None) -> None:
        """Compresses this step's tokens into `k_cache` (entries a request completes) and
        `state_cache` (its ring).

        hidden_states [T, hidden_size] (the weights' dtype); positions [T] int32/int64;
        cos_sin_cache [max_pos, rope_dim] (fp32, else converted); state_cache fp32
        [num_slots, state_width] or [num_blocks, state_block_size, state_width];
        k_cache: MODEL1_FP8 bytes as vLLM holds them (target kv_cache: [num_blocks, B·584] or
        [num_blocks, B, 584], any block stride) or the indexer key cache (target indexer_keys:
        [num_blocks, B·132] or [num_blocks, B, 132]) with B = block_size;
        entries (optional) fp32 [T, head_dim]: row t receives token t's emitted entry before
        quantization (other rows untouched)."""
        where = "DeepseekCompressor"
        x = tensor_arg(where, "hidden_states", hidden_states)
        positions = tensor_arg(where, "positions", positions)
        cos_sin = tensor_arg(where, "cos_sin_cache", cos_sin_cache)
        metadata = _metadata_arg(where, metadata)
        state_block_size = int_arg(where, "state_block_size", state_block_size, 1, INT32_MAX)
        block_size = int_arg(where, "block_size", block_size, 1, INT32_MAX)
        entries = optional_tensor_arg(where, "entries", entries)
        if x.dim() != 2:
            raise Error(f"{where}: hidden_states.ndim: expected 2 ([T, hidden_size]), "
                        f"got {x.dim()}")
        if cos_sin.dtype != torch.float32:
            cos_sin = cos_sin.float()
        state_rows = _rows_view(where, "state_cache", state_cache, self.state_width,
                                torch.float32)
        if self.target == "kv_cache":
            from .vllm_ops import _model1_blocks  # (vllm_ops re-exports this module's classes)
            out_cache = _model1_blocks(where, k_cache, block_size)
        else:
            out_cache = _key_blocks(where, k_cache, block_size)
        width = self.coff * self.head_dim
        kv_rows = torch.empty((x.shape[0], width), dtype=torch.float32, device=x.device)
        score_rows = torch.empty_like(kv_rows)
        cfg = (self.head_dim, self.compress_ratio, self.rope_dim, self.eps, self.target)
        ops.compressor_project(*cfg, x, self.wkv.weight, self.wgate.weight, self.ape,
                               positions, kv_rows, score_rows)
        ops.compressor_update_and_emit(
            *cfg, kv_rows, score_rows, positions, metadata.token_to_req, metadata.context_lens,
            self.norm.weight, cos_sin, state_rows, metadata.state_block_table, state_block_size,
            out_cache, metadata.block_table, block_size, "model1_fp8", 1.0, entries)


class Indexer(torch.nn.Module):
    """vLLM's DeepSeek-V4 (C4A) lightning indexer: its compressor writes the step's keys into
    the indexer key cache, then each token scores every visible key entry,
    score_j = Σ_h w_h · ReLU(q̂_h · k̂_j) (q̂: wq_b·qr, RoPE, Hadamard, FP8 per head;
    w = x·weights_projᵀ · (128·H_I)^-0.5), and its top-`topk` request-local entry numbers
    (descending, ties to the lowest, −1 padded) go to `topk_indices_buffer`. Weights bf16 or
    fp32 (an FP8 wq_b with FP8 queries: torch.ops.dsv4.indexer_query with qr_scale)."""

    def __init__(self, hidden_size: int, q_lora_rank: int, n_heads: int, topk: int,
                 head_dim: int = 128, rope_dim: int = 64, eps: float = 1e-6,
                 dtype: torch.dtype = torch.bfloat16, device=None):
        super().__init__()
        where = "Indexer"
        self.n_heads = int_arg(where, "n_heads", n_heads, 1, 256)
        self.topk = int_arg(where, "topk", topk, 1, 4096)
        if head_dim != _INDEXER_KEY_DIM:
            raise Error(f"{where}: head_dim: expected {_INDEXER_KEY_DIM}, got {head_dim!r}")
        self.head_dim = head_dim
        self.compress_ratio = 4
        q_lora_rank = int_arg(where, "q_lora_rank", q_lora_rank, 1)
        hidden_size = int_arg(where, "hidden_size", hidden_size, 1)
        self.wq_b = _weight((self.n_heads * head_dim, q_lora_rank), dtype, device)
        self.weights_proj = _weight((self.n_heads, hidden_size), dtype, device)
        self.compressor = DeepseekCompressor(4, hidden_size, head_dim, rope_dim, eps,
                                             "indexer_keys", dtype, device)

    def forward(self, hidden_states: torch.Tensor, qr: torch.Tensor, positions: torch.Tensor,
                cos_sin_cache: torch.Tensor, state_cache: torch.Tensor, k_cache: torch.Tensor,
                metadata: CompressorMetadata, state_block_size: int, block_size: int,
                topk_indices_buffer: torch.Tensor,
                topk_lens: Optional[torch.Tensor] = None) -> None:
        """hidden_states [T, hidden_size], qr [T, q_lora_rank] (the normed low-rank query, the
        weights' dtype), positions [T], cos_sin_cache [max_pos, rope_dim]; state_cache /
        k_cache / metadata / block sizes as DeepseekCompressor's (k_cache: the indexer key
        cache, its block table metadata.block_table). topk_indices_buffer int32 [>= T, topk]
        (rows [0, T) written); topk_lens (optional) int32 [T]: valid entries per row.
        Scores cover metadata.block_table.shape[1] · block_size entries (the most a request's
        table holds), so no value is read on the host."""
        where = "Indexer"
        x = tensor_arg(where, "hidden_states", hidden_states)
        qr = tensor_arg(where, "qr", qr)
        buf = tensor_arg(where, "topk_indices_buffer", topk_indices_buffer)
        if x.dim() != 2:
            raise Error(f"{where}: hidden_states.ndim: expected 2 ([T, hidden_size]), "
                        f"got {x.dim()}")
        T = x.shape[0]
        if buf.dim() != 2 or buf.shape[0] < T or buf.shape[1] != self.topk:
            raise Error(f"{where}: topk_indices_buffer.shape: expected [>= {T}, {self.topk}], "
                        f"got {list(buf.shape)}")
        metadata = _metadata_arg(where, metadata)
        block_table = tensor_arg(where, "metadata.block_table", metadata.block_table)
        if block_table.dim() != 2:
            raise Error(f"{where}: metadata.block_table.ndim: expected 2, got {block_table.dim()}")
        # What the query and score steps take is checked before the compressor writes.
        w = self.wq_b.weight
        if qr.dim() != 2 or qr.shape[0] != T or qr.shape[1] != w.shape[1]:
            raise Error(f"{where}: qr.shape: expected [{T}, {w.shape[1]}], got {list(qr.shape)}")
        if qr.dtype != w.dtype:
            raise Error(f"{where}: qr.dtype: expected {w.dtype} (wq_b's), got {qr.dtype}")
        topk_lens = optional_tensor_arg(where, "topk_lens", topk_lens)
        if topk_lens is not None and (topk_lens.dtype != torch.int32 or
                                      list(topk_lens.shape) != [T]):
            raise Error(f"{where}: topk_lens: expected int32 [{T}], got {topk_lens.dtype} "
                        f"{list(topk_lens.shape)}")
        block_size = int_arg(where, "block_size", block_size, 1, INT32_MAX)
        keys = _key_blocks(where, k_cache, block_size)
        self.compressor(x, positions, cos_sin_cache, state_cache, k_cache, metadata,
                        state_block_size, block_size)
        cos_sin = cos_sin_cache if cos_sin_cache.dtype == torch.float32 else cos_sin_cache.float()
        dev = x.device
        q_fp8 = torch.empty((T, self.n_heads, self.head_dim), dtype=torch.float8_e4m3fn,
                            device=dev)
        q_scale = torch.empty((T, self.n_heads), dtype=torch.float32, device=dev)
        weights = torch.empty_like(q_scale)
        workspace = None
        if dev.type == "cuda":
            workspace = torch.empty((_C.indexer_query_workspace_bytes(T, self.n_heads),),
                                    dtype=torch.uint8, device=dev)
        ops.indexer_query(qr, w, None, x, self.weights_proj.weight, positions,
                          cos_sin, q_fp8, q_scale, weights, workspace, None)
        scores = torch.empty((T, block_table.shape[1] * block_size), dtype=torch.float32,
                             device=dev)
        ops.indexer_scores(q_fp8, q_scale, weights, positions, metadata.token_to_req,
                           keys, block_size, block_table, self.compress_ratio, scores)
        ops.indexer_topk(scores, positions, self.compress_ratio, buf[:T], topk_lens)

"""Glue between torch and the extension: the stream an op runs on, device guards, RoPE tables.

The extension (`dsv4attn._C`) knows nothing about torch: it takes DLPack tensors and a stream
handle. Everything torch-specific (which stream is current, which device is active) is decided
here, without synchronizing the host.
"""
from __future__ import annotations

import contextlib
import functools

import torch

from . import _C
from ._args import INT32_MAX, int_arg


# torch's raw current-stream query (the one its own compiled kernels launch with): an int, no
# Stream object built per call (torch.cuda.current_stream costs a few µs a call). Absent from
# some torch builds: then the public query.
_raw_stream = getattr(torch._C, "_cuda_getCurrentRawStream", None)  # noqa: SLF001


def stream_handle(t: torch.Tensor) -> int:
    """The cudaStream_t (as an int) of torch's current stream on t's device; 0 on CPU (and for a
    non-tensor, which the op then rejects by name)."""
    if isinstance(t, torch.Tensor) and t.is_cuda:
        index = t.get_device()
        if _raw_stream is not None:
            return _raw_stream(index)
        return torch.cuda.current_stream(index).cuda_stream
    return 0


_NO_GUARD = contextlib.nullcontext()  # (reusable: it holds no state)


def device_guard(t: torch.Tensor):
    """Makes t's CUDA device current for the duration of an op (a no-op on CPU, for a tensor on
    the current device already, or for a non-tensor, which the op then rejects by name)."""
    if isinstance(t, torch.Tensor) and t.is_cuda:
        index = t.get_device()
        if index != torch.cuda.current_device():
            return torch.cuda.device(index)
    return _NO_GUARD


# Shape-only host computations, constant for given arguments: torch.compile evaluates them while
# tracing instead of breaking the graph on the extension call.
@torch.compiler.assume_constant_result
def kv_geometry(layout: str, block_size: int) -> dict:
    """Byte geometry (layout, block_size, dim, token_bytes, block_bytes) of a cache layout."""
    return _C.kv_geometry(layout, block_size)


@torch.compiler.assume_constant_result
def decode_schedule(b: int, s_q: int, h: int, topk_total: int, num_sms: int,
                    d_v: int) -> tuple:
    """(num_splits, split_len, workspace_bytes) of the split-KV decode plan (shapes only)."""
    return tuple(_C.decode_schedule(b, s_q, h, topk_total, num_sms, d_v))


@functools.lru_cache(maxsize=None)
def num_sms(device_index: int) -> int:
    """Streaming multiprocessors of a CUDA device (the decode split planner's parallelism)."""
    return torch.cuda.get_device_properties(device_index).multi_processor_count


def planner_sms(device: torch.device) -> int:
    # On CPU the split count only shapes the work partition; 132 (an H100) keeps CPU and CUDA
    # runs of the same shapes on the same plan.
    if device.type == "cuda":
        return num_sms(device.index if device.index is not None else torch.cuda.current_device())
    return 132


def rope_cos_sin(
    max_pos: int,
    rope_dims: int = 64,
    theta: float = 10000.0,
    yarn: bool = False,
    factor: float = 1.0,
    original_seq_len: int = 0,
    beta_fast: float = 32.0,
    beta_slow: float = 1.0,
    device: torch.device | str = "cpu",
) -> torch.Tensor:
    """fp32 [max_pos, rope_dims] table [cos(p·f_0..f_{R/2-1}) | sin(...)] (docs/spec.md §3).

    The layout is vLLM's `rotary_emb.cos_sin_cache` (cos half, then sin half) for GPT-J
    interleaved pairs; YaRN frequencies when `yarn` is True.
    """
    # Sizes are checked before they size the table (the extension checks the rest).
    max_pos = int_arg("rope_cos_sin", "max_pos", max_pos, 1, INT32_MAX)
    rope_dims = int_arg("rope_cos_sin", "rope_dims", rope_dims, 2, INT32_MAX)
    table = torch.empty((max_pos, rope_dims), dtype=torch.float32)
    _C.rope_cache(float(theta), rope_dims, bool(yarn), float(factor), original_seq_len,
                  float(beta_fast), float(beta_slow), table)
    return table.to(device)


def rope_cos_sin_for(config, layer: int, max_pos: int | None = None,
                     device: torch.device | str = "cpu") -> torch.Tensor:
    """The RoPE table one layer of a ModelConfig uses (compressed layers: YaRN, compress theta)."""
    r = config.rope_for_layer(layer)
    return rope_cos_sin(max_pos or config.max_position, r["rope_dims"], r["theta"], r["yarn"],
                        r["factor"], r["original_seq_len"], r["beta_fast"], r["beta_slow"],
                        device)

"""Argument checks of the Triton ops: shapes, dtypes, strides and devices, raised as
dsv4attn.Error naming the op, the argument, what was expected and what was found, before any
kernel runs. Index VALUES live on the device and are never read here (that would synchronize):
the kernels treat what the CPU reference rejects as invalid, as the CUDA backend does.
"""
from __future__ import annotations

import os
from typing import Iterable, Optional, Sequence, Union

import torch

from .. import Error

DTypes = Union[torch.dtype, Sequence[torch.dtype]]


def fail(op: str, arg: str, expected, got) -> None:
    raise Error(f"{op}: {arg}: expected {expected}, got {got}")


def interpreting() -> bool:
    """Triton's interpreter (TRITON_INTERPRET=1): kernels run on CPU tensors, with numpy."""
    return os.environ.get("TRITON_INTERPRET", "0") not in ("", "0", "false", "False")


def tensor(op: str, name: str, t, dtype: DTypes, shape: Optional[Sequence[int]] = None,
           ndim: Optional[int] = None, last_dim_contiguous: bool = True) -> torch.Tensor:
    """t is a tensor of `dtype` (or one of them), of `shape` (-1: any size) or `ndim` dims,
    whose last dim is contiguous (when it has more than one element)."""
    if not isinstance(t, torch.Tensor):
        fail(op, name, "a torch.Tensor", type(t).__name__)
    dtypes = (dtype,) if isinstance(dtype, torch.dtype) else tuple(dtype)
    if t.dtype not in dtypes:
        fail(op, f"{name}.dtype", " or ".join(str(d).replace("torch.", "") for d in dtypes),
             str(t.dtype).replace("torch.", ""))
    if shape is not None:
        if t.dim() != len(shape) or any(s != -1 and s != n for s, n in zip(shape, t.shape)):
            want = "[" + ", ".join("*" if s == -1 else str(s) for s in shape) + "]"
            fail(op, f"{name}.shape", want, list(t.shape))
    elif ndim is not None and t.dim() != ndim:
        fail(op, f"{name}.dim()", ndim, t.dim())
    if last_dim_contiguous and t.dim() > 0 and t.shape[-1] > 1 and t.stride(-1) != 1:
        fail(op, f"{name}.stride(-1)", "1 (last dim contiguous)", t.stride(-1))
    return t


def optional(op: str, name: str, t, dtype: DTypes, shape: Sequence[int]) -> None:
    if t is not None:
        tensor(op, name, t, dtype, shape)


def contiguous(op: str, name: str, t: torch.Tensor) -> None:
    if not t.is_contiguous():
        fail(op, name, "a contiguous tensor", f"strides {list(t.stride())}")


def same_device(op: str, named: Iterable[tuple]) -> torch.device:
    """Every given tensor on one device, which Triton can run on: a GPU (CUDA or ROCm), or the
    CPU under Triton's interpreter. Returns it."""
    device = None
    first = None
    for name, t in named:
        if t is None:
            continue
        if device is None:
            device, first = t.device, name
        elif t.device != device:
            fail(op, f"{name}.device", f"{device} (the device of {first})", t.device)
    if device is None:
        raise Error(f"{op}: expected at least one tensor")
    if device.type == "cpu" and not interpreting():
        raise Error(f"{op}: {first}.device: the Triton backend runs on GPUs; CPU tensors need "
                    f"Triton's interpreter (TRITON_INTERPRET=1), or use torch.ops.dsv4 (the CPU "
                    f"reference)")
    return device


def disjoint(op: str, outputs: Iterable[tuple], inputs: Iterable[tuple]) -> None:
    """No output shares memory with another output or with an input (storage ranges overlap)."""
    outs = [(n, t) for n, t in outputs if t is not None and t.numel() > 0]
    ins = [(n, t) for n, t in inputs if t is not None and t.numel() > 0]

    def span(t):
        lo = t.data_ptr()
        hi = lo + sum((s - 1) * st for s, st in zip(t.shape, t.stride())) * t.element_size()
        return lo, hi + t.element_size()

    for i, (n, t) in enumerate(outs):
        a0, a1 = span(t)
        for m, u in outs[i + 1:] + ins:
            if u.device != t.device:
                continue
            b0, b1 = span(u)
            if a0 < b1 and b0 < a1:
                raise Error(f"{op}: {n}: expected memory disjoint from {m}, got an overlap")


def positive(op: str, name: str, v: int) -> None:
    if v < 1:
        fail(op, name, ">= 1", v)

"""The op table of the Triton backend: op name -> implementation, with where it lives and what
runs it ("triton" kernels, or "torch" for the GEMMs, which go to cuBLAS / hipBLASLt).

Names and signatures are those of `torch.ops.dsv4.<name>` (python/dsv4attn/ops.py) where such
an op exists, so a caller dispatches by name alone:

    from dsv4attn.triton import registry
    registry.get("sparse_prefill")(q, kv, indices, topk_length, sink, scale, 512, out, ml, lse)

The compressor ops take the CompressorConfig's fields first (CompressorConfig.op_args()), as
torch.ops.dsv4's do. Every op writes caller-allocated outputs and returns nothing, like the
torch ops. `rows()` is what issue 16's `dsv4 info --ops` table
will list for this backend.
"""
from __future__ import annotations

import dataclasses
from typing import Callable, Dict, List


@dataclasses.dataclass(frozen=True)
class OpRow:
    name: str      # op name (torch.ops.dsv4 name where one exists)
    module: str    # dsv4attn.triton module holding it
    impl: str      # "triton" (kernels) or "torch" (GEMMs through torch)
    summary: str
    fn: Callable


_TABLE: Dict[str, OpRow] = {}


def op(name: str, summary: str, impl: str = "triton"):
    """Registers the decorated function as op `name` of the Triton backend."""

    def wrap(fn):
        if name in _TABLE:
            raise RuntimeError(f"dsv4attn.triton: op {name} registered twice")
        _TABLE[name] = OpRow(name, fn.__module__.rsplit(".", 1)[-1], impl, summary, fn)
        return fn

    return wrap


def get(name: str) -> Callable:
    from .. import Error

    try:
        return _TABLE[name].fn
    except KeyError:
        raise Error(f"dsv4attn.triton: op: expected one of {sorted(_TABLE)}, "
                    f"got {name!r}") from None


def rows() -> List[OpRow]:
    """Every registered op, sorted by name."""
    return [_TABLE[k] for k in sorted(_TABLE)]

"""Argument checks of the Python wrappers (flash_mla, vllm_ops, layer), done before a wrapper
reads an attribute of an argument or allocates anything from it.

A bad argument raises dsv4attn.Error naming the function and the argument, as the C++ ops do:
never Python's TypeError / AttributeError or torch's RuntimeError from a later allocation, and
never a silent conversion (int(2.5) == 2, int(True) == 1).
"""
from __future__ import annotations

import math
import operator
from typing import Optional

import torch

from . import Error

INT32_MAX = 2**31 - 1
INT64_MIN, INT64_MAX = -2**63, 2**63 - 1


def int_arg(where: str, name: str, value, lo: int = INT64_MIN, hi: int = INT64_MAX) -> int:
    """`value` as an int in [lo, hi]: an int (or anything with __index__, e.g. a numpy integer),
    never a bool, a float or None."""
    if isinstance(value, bool) or not hasattr(type(value), "__index__"):
        raise Error(f"{where}: {name}: expected an integer in [{lo}, {hi}], "
                    f"got {type(value).__name__} {value!r}")
    v = operator.index(value)
    if not lo <= v <= hi:
        raise Error(f"{where}: {name}: expected an integer in [{lo}, {hi}], got {v}")
    return v


def float_arg(where: str, name: str, value, *, positive: bool = False) -> float:
    """`value` as a finite float (> 0 with `positive`): an int or a float, never a bool."""
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise Error(f"{where}: {name}: expected a finite number, got {type(value).__name__} "
                    f"{value!r}")
    v = float(value)
    if not math.isfinite(v) or (positive and v <= 0):
        raise Error(f"{where}: {name}: expected a finite number{' > 0' if positive else ''}, "
                    f"got {v}")
    return v


def tensor_arg(where: str, name: str, value) -> torch.Tensor:
    """`value`, which must be a torch.Tensor."""
    if not isinstance(value, torch.Tensor):
        got = "None" if value is None else type(value).__name__
        raise Error(f"{where}: {name}: expected a tensor, got {got}")
    return value


def optional_tensor_arg(where: str, name: str, value) -> Optional[torch.Tensor]:
    """`value`, which must be a torch.Tensor or None."""
    return None if value is None else tensor_arg(where, name, value)

"""What the Triton backend's tests share: the device they run on (the GPU when there is one,
else the CPU under Triton's interpreter, which conftest.py selects), the backend's ops by name,
and comparisons in units of the formats involved.

On a GPU the tests use the real shapes (H 64 / 128, top-k 512 + the 128 window); in the
interpreter, whose cost is per operation, small ones, so the CPU run stays well under a minute.
"""
import os

import pytest
import torch

triton = pytest.importorskip("triton", reason="the Triton backend needs triton")

import dsv4attn  # noqa: E402
from dsv4attn import triton as dt  # noqa: E402

ON_GPU = torch.cuda.is_available()
INTERPRETED = os.environ.get("TRITON_INTERPRET", "0") not in ("", "0")
if not ON_GPU and not INTERPRETED:
    pytest.skip("no GPU and Triton's interpreter is off", allow_module_level=True)
DEVICE = torch.device("cuda") if ON_GPU else torch.device("cpu")
F64 = torch.float64


def op(name):
    return dt.get(name)


def gpu_or(small, big):
    """`big` on a GPU, `small` in the interpreter."""
    return big if ON_GPU else small


def to_dev(*ts):
    """Copies on DEVICE (always copies: ops write in place, the originals stay the inputs)."""
    out = tuple(t.to(DEVICE, copy=True) if isinstance(t, torch.Tensor) else t for t in ts)
    return out if len(out) > 1 else out[0]


def fp8_codes(t: torch.Tensor) -> torch.Tensor:
    """e4m3fn codes as uint8 with the two NaN codes (0x7F, 0xFF) folded into 0x7F. A NaN that
    arithmetic creates (0 × a NaN scale, inf − inf) takes the platform's default sign: set on
    x86 (the CPU reference), clear on NVIDIA GPUs. A NaN that an input carries keeps its sign on
    both, and no consumer reads a NaN's sign, so only NaN-ness is compared."""
    c = t.cpu().view(torch.uint8).clone()
    c[c == 0xFF] = 0x7F
    return c


def poisoned(shape, dtype):
    """An output buffer on DEVICE full of NaN (0x7F.. for ints, 0x7F for bytes) so unwritten
    elements show."""
    if dtype.is_floating_point:
        return torch.full(shape, float("nan"), dtype=dtype, device=DEVICE)
    return torch.full(shape, 0x7F, dtype=dtype, device=DEVICE)


def bf16_ulps(got: torch.Tensor, want: torch.Tensor) -> torch.Tensor:
    """|got - want| in units of the bf16 spacing at |want| (2^-7 relative, floored at 2^-126)."""
    got, want = got.double().cpu(), want.double().cpu()
    spacing = torch.exp2(torch.floor(torch.log2(want.abs().clamp_min(2.0 ** -126))) - 7)
    return (got - want).abs() / spacing

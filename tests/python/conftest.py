import os
import sys

import pytest
import torch

# The Triton backend's tests (test_triton_*.py) run on the GPU when there is one, else in
# Triton's interpreter on the CPU, which must be chosen before dsv4attn.triton is imported.
if not torch.cuda.is_available():
    os.environ.setdefault("TRITON_INTERPRET", "1")

sys.path.insert(0, os.path.dirname(__file__))  # reference.py

import dsv4attn  # noqa: E402

HAVE_CUDA = torch.cuda.is_available() and dsv4attn.with_cuda
requires_cuda = pytest.mark.skipif(not HAVE_CUDA, reason="needs a GPU and the CUDA backend")
DEVICES = ["cpu", pytest.param("cuda", marks=requires_cuda)]


@pytest.fixture(params=DEVICES)
def device(request):
    # With its index: tensors report cuda:N, and torch.device("cuda") != torch.device("cuda", 0).
    if request.param == "cuda":
        return torch.device("cuda", torch.cuda.current_device())
    return torch.device(request.param)


@pytest.fixture(autouse=True)
def _seed():
    torch.manual_seed(1234)


def poisoned(shape, dtype, device):
    """An output buffer full of NaN (or 0x7F.. for ints) so unwritten elements show."""
    if dtype.is_floating_point:
        return torch.full(shape, float("nan"), dtype=dtype, device=device)
    return torch.full(shape, 0x7F, dtype=dtype, device=device)

"""dsv4attn: DeepSeek-V4 hybrid sparse attention (SWA + compressed, FlashMLA "MODEL1").

    import dsv4attn                       # registers torch.ops.dsv4.*
    from dsv4attn.flash_mla import flash_mla_with_kvcache, flash_mla_sparse_fwd
    from dsv4attn import vllm_ops         # vLLM DeepSeek-V4 op semantics
    layer = dsv4attn.Attention.from_checkpoint(path, layer=0)   # the C++ layer (device="cuda")
    stack = dsv4attn.AttentionStack("v4-flash", layers=[0, 2, 3])  # several, residually chained
    layer = dsv4attn.Attention(cfg, 1, device="cuda", backend="triton")  # the portable backend
    mla = dsv4attn.SparseMlaAttention("tiny-v3.2", 0, device="cuda")  # DeepSeek-V3.2's layer
    from dsv4attn import triton as dt; dt.get("sparse_prefill")  # its ops (needs triton)

Tensors may live on the CPU (the reference backend) or on CUDA (when the extension was built
with CUDA). Invalid arguments raise dsv4attn.Error.
"""


class Error(ValueError, RuntimeError):
    """An argument was rejected by a dsv4attn op (the message names op, argument, expected and
    actual value), or a backend is unavailable. Nothing was written when it is raised."""


# torch first: it loads its bundled runtime libraries (libgomp.so.1, libcudart.so.13) before the
# extension asks for the same sonames, so the process holds one copy of each — torch's, which its
# own code expects. (The crash seen on the GPU image came from a statically linked libstdc++
# exported by _C; python/CMakeLists.txt keeps it private.)
import torch  # noqa: E402,F401

from . import _C  # noqa: E402

_C._set_error_type(Error)

from . import ops  # noqa: E402,F401  (registers torch.ops.dsv4.*)
from ._C import ModelConfig  # noqa: E402
from ._runtime import rope_cos_sin, rope_cos_sin_for  # noqa: E402
from . import flash_mla, vllm_ops  # noqa: E402,F401
from .layer import (  # noqa: E402
    Attention, AttentionStack, AttentionWeights, BatchDescription, reference_attention_layer)
from .sparse_mla import (  # noqa: E402
    SparseMlaAttention, SparseMlaWeights, reference_sparse_mla_layer)

with_cuda: bool = _C.with_cuda
__version__: str = _C.__version__  # the library's: CMakeLists.txt's project(VERSION)

__all__ = [
    "Attention", "AttentionStack", "AttentionWeights", "BatchDescription", "Error", "ModelConfig",
    "SparseMlaAttention", "SparseMlaWeights", "flash_mla", "ops", "reference_attention_layer",
    "reference_sparse_mla_layer", "rope_cos_sin", "rope_cos_sin_for", "vllm_ops", "with_cuda",
]

"""dsv4attn.SparseMlaAttention: one DeepSeek-V3.2 sparse-MLA attention layer driven from Python,
on the CPU or a CUDA device.

The layer is the C++ `dsv4::SparseMlaAttention` (include/dsv4/sparse_mla_layer.h), what vLLM's
FlashMLASparseBackend runs for DeepSeek-V3.2: q/kv LoRA projections and norms, q_nope absorbed
through W_UK into the 512-d latent (+ 64 RoPE dims: a 576-d query, heads padded to 64 or 128),
the latent + k_pe written into its own 656-byte V32_FP8 paged cache, the lightning indexer with
its FP8 key cache and top-`index_topk` selection, sparse attention (decodes on the FP8 cache,
prefills over gathered bf16 rows), then W_UV and o_proj.

    cfg = dsv4attn.ModelConfig.builtin("tiny-v3.2")
    layer = dsv4attn.SparseMlaAttention(cfg, 0)            # seeded random weights
    y = layer.forward(dsv4attn.BatchDescription([7], [0], [5]), torch.randn(5, cfg.dim))
    gpu = dsv4attn.SparseMlaAttention(cfg, 0, device="cuda")   # the CUDA ops (Hopper)

Weights: None (seeded random), a checkpoint directory / .safetensors file, a state dict under the
inference-code names (`layers.{i}.attn.wkv_b.weight`, ...) or the Hugging Face names
(`model.layers.{i}.self_attn.kv_b_proj.weight`, `.weight_scale_inv`), or SparseMlaWeights.
"""
from __future__ import annotations

import os
from typing import Mapping, Union

import torch

from . import _C
from ._args import int_arg, tensor_arg
from .layer import (BatchDescription, _device_guard, _layer_device, _LayerWrapper, _load_weights,
                    _step_input)

__all__ = ["SparseMlaAttention", "SparseMlaWeights", "reference_sparse_mla_layer"]

SparseMlaWeights = _C.SparseMlaWeights
WeightsArg = Union[None, str, os.PathLike, Mapping[str, torch.Tensor], SparseMlaWeights]


def _config(config):
    return _C.ModelConfig.builtin(config) if isinstance(config, str) else config


class SparseMlaAttention(_LayerWrapper):
    """One DeepSeek-V3.2 sparse-MLA layer with its weights and paged caches, on the CPU or a CUDA
    device.

    config: a V3.2 ModelConfig (or "v3.2" / "tiny-v3.2"). layer: the layer index.
    cache_blocks, block_size: the latent cache and the indexer key cache each hold cache_blocks
        blocks of block_size tokens; running out raises dsv4attn.Error before anything changes.
    fp8_activations: quantize the inputs of FP8-weight projections to FP8 (per token and 128
        columns, UE8M0) as production does (must stay on for FP8 weights on CUDA).
    device: "cpu" (the reference ops) or "cuda[:i]" (the CUDA ops; weights, caches and every
        temporary on that GPU, the forward asynchronous on torch's current stream).
    cuda_graphs: CUDA decode-only steps replay CUDA graphs, one per batch-size bucket (1, 2, 4,
        ..., 512 tokens), as Attention's do: the first step of a bucket runs eagerly, the second
        is captured. Such steps run padded to their bucket either way, so the results are the
        same bits with graphs on or off. A forward may also be captured by the caller with
        torch.cuda.graph (run one step of the same shape eagerly first, so the workspaces are
        sized); a replay re-runs the captured step, its plan included, on the inputs then in the
        captured tensors.
    """

    def __init__(self, config, layer: int, weights: WeightsArg = None, *, seed: int = 1,
                 fp8_weights: bool = True, cache_blocks: int = 256, block_size: int = 64,
                 fp8_activations: bool = True, device: Union[torch.device, str] = "cpu",
                 cuda_graphs: bool = True):
        self.config = _config(config)
        self.device = _layer_device(device, "SparseMlaAttention")
        w = _load_weights(self.config, layer, weights, seed, fp8_weights, SparseMlaWeights,
                          "SparseMlaAttention")
        with _device_guard(self.device):
            self._layer = _C.SparseMlaAttention(self.config, layer, w, cache_blocks, block_size,
                                                fp8_activations, self.device.type, cuda_graphs)

    @property
    def padded_heads(self) -> int:
        """The head count the sparse kernels run (64 or 128)."""
        return self._layer.padded_heads

    def forward(self, batch: BatchDescription, x: torch.Tensor) -> torch.Tensor:
        """x [T, dim] (float32 or bfloat16) → y [T, dim] float32 on the layer's device, rows in
        batch order. CPU layer: x on the CPU. CUDA layer: x on the CPU or the layer's GPU (rounded
        to bfloat16 there). Every request's context must equal the tokens this layer has cached
        for it (0 for a new request); a rejected batch raises dsv4attn.Error and changes
        nothing."""
        where = "SparseMlaAttention.forward"
        return self._native_forward(where, batch, _step_input(where, batch, x, self.config.dim))

    __call__ = forward

    def release(self, request_id: int) -> None:
        """Forgets a finished request and frees its cache blocks."""
        self._layer.release(int_arg("SparseMlaAttention.release", "request_id", request_id))

    def reserve(self, max_tokens: int, max_requests: int, max_context: int) -> "_C.LayerMemory":
        """Sizes every workspace for steps of up to max_tokens tokens over max_requests requests
        with sequences up to max_context (so they allocate nothing); returns the layer's memory
        in bytes (weights, caches, workspace, step upload)."""
        with _device_guard(self.device):
            return self._layer.reserve(max_tokens, max_requests, max_context)

    def memory(self) -> "_C.LayerMemory":
        """Bytes the layer holds on its device: weights, caches, workspace, step upload."""
        return self._layer.memory()

    def __repr__(self) -> str:
        return (f"<dsv4attn.SparseMlaAttention {self.config.name} layer {self.layer}, "
                f"{self.padded_heads} padded heads, on {self.device}>")


def reference_sparse_mla_layer(config, weights: SparseMlaWeights, x: torch.Tensor,
                               fp8_activations: bool = True) -> torch.Tensor:
    """float64 y [L, dim] of one request's tokens x [L, dim] at positions 0..L-1."""
    x = tensor_arg("reference_sparse_mla_layer", "x", x).detach().to("cpu", torch.float64).contiguous()
    return _C.reference_sparse_mla_layer(_config(config), weights, x, fp8_activations)

"""dsv4attn.Attention: one DeepSeek-V4 attention layer (SWA, C4A or C128A) driven from Python.

The layer is the C++ `dsv4::Attention` (include/dsv4/layer.h): projections, norms, RoPE, the
fused insert into its own paged FP8 caches, the compressor and indexer of compressed layers,
sparse attention over mixed batches (chunked prefill, decodes) and the output path. It keeps the
state of every request it has seen (cached tokens) until `release`.

    cfg = dsv4attn.ModelConfig.builtin("tiny")            # or .from_json_file(checkpoint_dir)
    layer = dsv4attn.Attention(cfg, 1)                     # C4A layer, seeded random weights
    batch = dsv4attn.BatchDescription([7, 9], contexts=[0, 0], num_new=[5, 3])
    y = layer.forward(batch, torch.randn(8, cfg.dim))      # fp32 [8, dim]
    y = layer.forward(dsv4attn.BatchDescription([7], [5], [1]), torch.randn(1, cfg.dim))

Weights come from a state dict under the official checkpoint names (`layers.{i}.attn.wq_a.weight`,
`...wq_a.scale`, ...; `AttentionWeights.tensor_names(config)` lists them), a checkpoint
directory, or are seeded random. The layer runs on the CPU for now: CUDA inputs raise
dsv4attn.Error (the ops in torch.ops.dsv4 have their CUDA paths).
"""
from __future__ import annotations

import dataclasses
import os
from typing import List, Mapping, Sequence, Tuple, Union

import torch

from . import Error, _C

__all__ = ["Attention", "AttentionWeights", "BatchDescription", "reference_attention_layer"]

AttentionWeights = _C.AttentionWeights
WeightsArg = Union[None, str, os.PathLike, Mapping[str, torch.Tensor], AttentionWeights]


@dataclasses.dataclass(frozen=True)
class BatchDescription:
    """The tokens of one forward step: request `request_ids[i]` has `contexts[i]` tokens cached
    by earlier steps and contributes `num_new[i]` new tokens at positions
    [contexts[i], contexts[i] + num_new[i]).

    Requests may be listed in any order (the layer runs decodes first internally); the rows of
    x and y follow the order given here: request i owns rows
    [query_start_loc[i], query_start_loc[i + 1]).
    """

    request_ids: List[int]
    contexts: List[int]
    num_new: List[int]

    def __post_init__(self):
        if not len(self.request_ids) == len(self.contexts) == len(self.num_new):
            raise Error(f"BatchDescription: expected one context and one num_new per request, "
                        f"got {len(self.request_ids)} requests, {len(self.contexts)} contexts, "
                        f"{len(self.num_new)} num_new")

    @staticmethod
    def from_lengths(requests: Sequence[Tuple[int, int, int]]) -> "BatchDescription":
        """requests: (request_id, num_new_tokens, num_cached_tokens) per request."""
        return BatchDescription([int(r[0]) for r in requests], [int(r[2]) for r in requests],
                                [int(r[1]) for r in requests])

    @property
    def num_tokens(self) -> int:
        return sum(self.num_new)

    @property
    def query_start_loc(self) -> List[int]:
        """R + 1 row offsets of the requests in x / y."""
        starts = [0]
        for n in self.num_new:
            starts.append(starts[-1] + n)
        return starts

    @property
    def positions(self) -> torch.Tensor:
        """int64 [T]: the absolute position of every row."""
        return torch.cat([torch.arange(c, c + n, dtype=torch.int64)
                          for c, n in zip(self.contexts, self.num_new)] or
                         [torch.empty(0, dtype=torch.int64)])

    def rows(self, request_id: int) -> slice:
        """The rows of x / y that belong to `request_id`."""
        i = self.request_ids.index(request_id)
        starts = self.query_start_loc
        return slice(starts[i], starts[i + 1])


def _require_cpu(where: str, what: str, device: Union[torch.device, str]) -> None:
    if torch.device(device).type != "cpu":
        raise Error(f"{where}: {what}: expected cpu, got {device}: the layer's CUDA path is not "
                    "available yet (the ops in torch.ops.dsv4 run on CUDA)")


def _load_weights(config, layer: int, weights: WeightsArg, seed: int,
                  fp8_weights: bool) -> AttentionWeights:
    if weights is None:
        return AttentionWeights.random(config, layer, seed, fp8_weights)
    if isinstance(weights, AttentionWeights):
        return weights
    if isinstance(weights, (str, os.PathLike)):
        return AttentionWeights.from_checkpoint(os.fspath(weights), config, layer)
    if isinstance(weights, Mapping):
        # Detached views (no copies): the loader looks only at this layer's tensors, copying
        # them to the host; tensors elsewhere in the dict are never touched.
        tensors = {}
        for name, t in weights.items():
            if not isinstance(t, torch.Tensor):
                raise Error(f"Attention: weights[{name!r}]: expected a torch.Tensor, got "
                            f"{type(t).__name__}")
            tensors[name] = t.detach()
        return AttentionWeights.from_state_dict(tensors, config, layer)
    raise Error("Attention: weights: expected None (seeded random), a checkpoint path, a state "
                f"dict or AttentionWeights, got {type(weights).__name__}")


class Attention:
    """One attention layer with its weights and paged caches, on the CPU.

    config: a ModelConfig (or the name of a built-in one, e.g. "tiny", "v4-flash").
    layer: the layer index; its kind (SWA, C4A, C128A) comes from the config.
    weights: None (seeded random: `seed`, FP8 as released when `fp8_weights`), a checkpoint
        directory or .safetensors file, a state dict {checkpoint name: tensor} (the official
        names, or the transformers spelling `model.layers.{i}.self_attn.` / `.weight_scale_inv`),
        or AttentionWeights. Missing or mis-shaped tensors raise dsv4attn.Error naming the
        tensor.
    swa_blocks, compressed_blocks, state_blocks, swa_block_size: cache pool sizes (blocks of
        swa_block_size tokens; the compressed caches use 64 / 2 entries per block for ratio 4 /
        128, the compressor state one window per block). SWA blocks beyond the window are
        recycled; running out raises dsv4attn.Error before anything changes.
    fp8_activations: quantize the attention output to FP8 before wo_a, as production does.
    """

    def __init__(self, config, layer: int, weights: WeightsArg = None, *, seed: int = 1,
                 fp8_weights: bool = True, swa_blocks: int = 256, compressed_blocks: int = 256,
                 state_blocks: int = 64, swa_block_size: int = 64, fp8_activations: bool = True,
                 device: Union[torch.device, str] = "cpu"):
        _require_cpu("Attention", "device", device)
        if isinstance(config, str):
            config = _C.ModelConfig.builtin(config)
        self.config = config
        w = _load_weights(config, layer, weights, seed, fp8_weights)
        self._layer = _C.Attention(config, layer, w, swa_blocks, compressed_blocks, state_blocks,
                                   swa_block_size, fp8_activations)

    @classmethod
    def from_checkpoint(cls, path: str, layer: int, **kw) -> "Attention":
        """The layer of a checkpoint directory (config.json + *.safetensors)."""
        return cls(_C.ModelConfig.from_json_file(os.fspath(path)), layer, path, **kw)

    @property
    def layer(self) -> int:
        return self._layer.layer

    @property
    def kind(self) -> str:
        """"SWA", "C4A" or "C128A"."""
        return self._layer.kind

    @property
    def weights(self) -> AttentionWeights:
        return self._layer.weights

    def state_dict(self) -> dict:
        """{checkpoint name: CPU tensor}: copies of the weights under the official names."""
        return self.weights.tensors(self.config)

    def forward(self, batch: BatchDescription, x: torch.Tensor) -> torch.Tensor:
        """x [T, dim] (float32 or bfloat16, CPU) → y [T, dim] float32, rows in batch order.

        Every request's context must equal the tokens this layer has cached for it (0 for a new
        request). A rejected batch raises dsv4attn.Error and changes nothing.
        """
        _require_cpu("Attention.forward", "x.device", x.device)
        x = x.detach().contiguous()
        y = torch.empty((x.shape[0], self.config.dim), dtype=torch.float32)
        self._layer.forward(batch.request_ids, batch.contexts, batch.num_new, x, y)
        return y

    __call__ = forward

    def release(self, request_id: int) -> None:
        """Forgets a finished request and frees its cache blocks."""
        self._layer.release(request_id)

    def __repr__(self) -> str:
        return f"<dsv4attn.Attention {self.config.name} layer {self.layer} ({self.kind})>"


def reference_attention_layer(config, layer: int, weights: AttentionWeights, x: torch.Tensor,
                              fp8_activations: bool = True) -> torch.Tensor:
    """The float64 reference (include/dsv4/reference.h): y [L, dim] float64 for ONE request's
    tokens x [L, dim] at positions 0..L-1, with no caches or batching."""
    if isinstance(config, str):
        config = _C.ModelConfig.builtin(config)
    x = x.detach().to("cpu", torch.float64).contiguous()
    return _C.reference_attention_layer(config, layer, weights, x, fp8_activations)

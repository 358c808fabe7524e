"""dsv4attn.Attention: one DeepSeek-V4 attention layer (SWA, C4A or C128A) driven from Python, on
the CPU or a CUDA device.

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
directory, or are seeded random. `device="cuda"` runs the layer through the ops' CUDA twins, its
caches and weights on the GPU. `AttentionStack` chains several layers of a config residually.

Backends: `backend="native"` (the default) is the C++ layer: the CPU reference ops, or the Hopper
CUDA kernels with device="cuda". `backend="triton"` runs the same layer step, orchestrated in
Python (dsv4attn/triton/layer.py), on the portable Triton kernels and torch GEMMs: any GPU torch
and Triton support (CUDA or ROCm), with the same cache layouts; on device="cpu" it needs Triton's
interpreter (TRITON_INTERPRET=1). The environment variable DSV4_BACKEND (native / triton) picks
the backend when the argument is left out.
"""
from __future__ import annotations

import contextlib
import dataclasses
import os
from typing import Callable, Dict, List, Mapping, Optional, Sequence, Tuple, Union

import torch

from . import Error, _C
from ._args import int_arg, tensor_arg

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
        where = "BatchDescription"
        lists = {"request_ids": self.request_ids, "contexts": self.contexts,
                 "num_new": self.num_new}
        for name, values in lists.items():
            if not isinstance(values, (list, tuple)):
                raise Error(f"{where}: {name}: expected a list of integers, got "
                            f"{type(values).__name__}")
        if not len(self.request_ids) == len(self.contexts) == len(self.num_new):
            raise Error(f"BatchDescription: expected one context and one num_new per request, "
                        f"got {len(self.request_ids)} requests, {len(self.contexts)} contexts, "
                        f"{len(self.num_new)} num_new")
        # Exact int64 values (the layer's request ids and positions): no bool, float or int that
        # would not fit; the layer checks ranges against its config and caches.
        for name, values in lists.items():
            object.__setattr__(self, name, [int_arg(where, f"{name}[{i}]", v)
                                            for i, v in enumerate(values)])

    @staticmethod
    def from_lengths(requests: Sequence[Tuple[int, int, int]]) -> "BatchDescription":
        """requests: (request_id, num_new_tokens, num_cached_tokens) per request."""
        return BatchDescription([r[0] for r in requests], [r[2] for r in requests],
                                [r[1] for r in requests])

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


def _layer_device(device: Union[torch.device, str], where: str = "Attention") -> torch.device:
    d = torch.device(device)
    if d.type == "cuda":
        if not _C.with_cuda:
            raise Error(f"{where}: device cuda: dsv4attn was built without CUDA")
        if not torch.cuda.is_available():
            raise Error(f"{where}: device cuda: no CUDA device is visible")
        return torch.device("cuda", d.index if d.index is not None else torch.cuda.current_device())
    if d.type != "cpu":
        raise Error(f"{where}: device: expected cpu or cuda, got {device}")
    return d


BACKENDS = ("native", "triton")


def selected_backend(backend: Union[str, None], where: str = "Attention") -> str:
    """The backend a layer runs on: the argument, else $DSV4_BACKEND, else "native"."""
    name = backend if backend is not None else os.environ.get("DSV4_BACKEND", "") or "native"
    name = str(name).strip().lower()
    if name not in BACKENDS:
        source = "backend" if backend is not None else "DSV4_BACKEND"
        raise Error(f"{where}: {source}: expected one of {', '.join(BACKENDS)}, got {name!r}")
    return name


def _triton_device(device: Union[torch.device, str], where: str) -> torch.device:
    """The device of a Triton-backed layer: a GPU torch sees (CUDA or ROCm; the extension need not
    be built with CUDA), or the CPU under Triton's interpreter."""
    d = torch.device(device)
    if d.type == "cuda":
        if not torch.cuda.is_available():
            raise Error(f"{where}: device cuda: no GPU is visible to torch")
        return torch.device("cuda", d.index if d.index is not None else torch.cuda.current_device())
    if d.type != "cpu":
        raise Error(f"{where}: device: expected cpu or cuda, got {device}")
    if os.environ.get("TRITON_INTERPRET", "0") in ("", "0"):
        raise Error(f"{where}: backend triton on device cpu: needs Triton's interpreter "
                    f"(TRITON_INTERPRET=1 before dsv4attn.triton is imported); use device='cuda' "
                    f"or backend='native'")
    return d


def _triton_layer_cls():
    try:
        from .triton.layer import TritonAttention
    except ImportError as e:  # triton missing or too old
        raise Error(f"Attention: backend triton: cannot import the Triton backend ({e}); "
                    f"pip install triton") from e
    return TritonAttention


def _device_guard(device: torch.device):
    return torch.cuda.device(device) if device.type == "cuda" else contextlib.nullcontext()


def _step_input(where: str, batch: "BatchDescription", x: torch.Tensor, dim: int) -> torch.Tensor:
    """x, detached, after checking the step's arguments: batch a BatchDescription and x a tensor
    [batch.num_tokens, dim] (checked before anything is planned or allocated from either)."""
    if not isinstance(batch, BatchDescription):
        raise Error(f"{where}: batch: expected a BatchDescription, got {type(batch).__name__}")
    x = tensor_arg(where, "x", x).detach()
    if x.dim() != 2 or x.shape[0] != batch.num_tokens or x.shape[1] != dim:
        raise Error(f"{where}: x.shape: expected [{batch.num_tokens}, {dim}], got {list(x.shape)}")
    return x


def _plan_order_rows(batch: "BatchDescription", x: torch.Tensor):
    """The layer runs decodes first: the batch's requests in that order (ids, contexts, num_new),
    x's rows gathered into it on x's device, and the function that scatters y back."""
    order = _C.plan_order(batch.request_ids, batch.contexts, batch.num_new)
    ids = [batch.request_ids[i] for i in order]
    ctx = [batch.contexts[i] for i in order]
    new = [batch.num_new[i] for i in order]
    if order == list(range(len(order))):
        return ids, ctx, new, x, lambda y: y

    def scatter(y: torch.Tensor) -> torch.Tensor:
        out = torch.empty_like(y)
        start = 0
        for i in ids:
            rows = batch.rows(i)
            out[rows] = y[start:start + (rows.stop - rows.start)]
            start += rows.stop - rows.start
        return out

    return ids, ctx, new, torch.cat([x[batch.rows(i)] for i in ids]), scatter


def _load_weights(config, layer: int, weights: WeightsArg, seed: int, fp8_weights: bool,
                  weights_cls=AttentionWeights, where: str = "Attention"):
    """A layer's weights from None (seeded random), a checkpoint path, a state dict or an
    instance of `weights_cls` (AttentionWeights, or SparseMlaWeights for V3.2 layers)."""
    if weights is None:
        return weights_cls.random(config, layer, seed, fp8_weights)
    if isinstance(weights, weights_cls):
        return weights
    if isinstance(weights, (str, os.PathLike)):
        return weights_cls.from_checkpoint(os.fspath(weights), config, layer)
    if isinstance(weights, Mapping):
        # Detached views (no copies): the loader looks only at this layer's tensors, copying
        # them to the host; tensors elsewhere in the dict are never touched.
        tensors = {}
        for name, t in weights.items():
            if not isinstance(t, torch.Tensor):
                raise Error(f"{where}: weights[{name!r}]: expected a torch.Tensor, got "
                            f"{type(t).__name__}")
            tensors[name] = t.detach()
        return weights_cls.from_state_dict(tensors, config, layer)
    raise Error(f"{where}: weights: expected None (seeded random), a checkpoint path, a state "
                f"dict or {weights_cls.__name__}, got {type(weights).__name__}")


class _LayerWrapper:
    """What the layer classes share (Attention, SparseMlaAttention): `config`, `device` and the
    wrapped C++ layer `_layer`, which knows its index and weights."""

    def _native_forward(self, where: str, batch: "BatchDescription", x: torch.Tensor,
                        reduce: Optional[Callable[[torch.Tensor], object]] = None) -> torch.Tensor:
        """The C++ layer's forward of x (checked by _step_input) → y [T, dim] float32 on the
        layer's device, rows in batch order. CPU layer: x on the CPU. CUDA layer: x on the CPU or
        the layer's GPU, rounded to bfloat16 there (the CUDA GEMMs take bf16 activations), rows
        gathered into the layer's order (decodes first), the forward enqueued on torch's current
        stream. `reduce` (the tensor-parallel sum) runs on y before its rows are scattered back."""
        if self.device.type == "cpu":
            if x.device.type != "cpu":
                raise Error(f"{where}: x.device: expected cpu (the layer's device), got {x.device}")
            x = x.contiguous()
            y = torch.empty((x.shape[0], self.config.dim), dtype=torch.float32)
            self._layer.forward(batch.request_ids, batch.contexts, batch.num_new, x, y)
            if reduce is not None:
                reduce(y)
            return y
        if x.device.type not in ("cpu", "cuda") or (x.device.type == "cuda" and x.device != self.device):
            raise Error(f"{where}: x.device: expected cpu or {self.device}, got {x.device}")
        if x.dtype not in (torch.float32, torch.bfloat16):
            raise Error(f"{where}: x.dtype: expected float32 or bfloat16, got {x.dtype}")
        x = x.to(self.device, torch.bfloat16).contiguous()
        ids, ctx, new, x, scatter = _plan_order_rows(batch, x)
        y = torch.empty((x.shape[0], self.config.dim), dtype=torch.float32, device=self.device)
        with _device_guard(self.device):
            self._layer.set_stream(torch.cuda.current_stream(self.device).cuda_stream)
            self._layer.forward(ids, ctx, new, x, y)
            if reduce is not None:
                reduce(y)
        return scatter(y)

    @classmethod
    def from_checkpoint(cls, path: str, layer: int, **kw):
        """The layer of a checkpoint directory (config.json + *.safetensors)."""
        return cls(_C.ModelConfig.from_json_file(os.fspath(path)), layer, path, **kw)

    @property
    def layer(self) -> int:
        return self._layer.layer

    @property
    def graph_stats(self) -> Tuple[int, int]:
        """(CUDA graphs captured, decode steps replayed from them)."""
        return self._layer.graph_captures, self._layer.graph_replays

    @property
    def weights(self):
        return self._layer.weights

    def state_dict(self) -> dict:
        """{checkpoint name: CPU tensor}: copies of the weights under the official names."""
        return self.weights.tensors(self.config)


def _cache_bytes(where: str, name: str, cache: torch.Tensor) -> torch.Tensor:
    """A caller's cache tensor as the uint8 [num_blocks, block_bytes] view the layer binds,
    keeping its block stride: [num_blocks, block_bytes] of any dtype (viewed as bytes), or
    [num_blocks, block_size, row] with dense blocks (vLLM's page shape)."""
    t = tensor_arg(where, f"caches.{name}", cache)
    if t.dim() not in (2, 3) or t.stride(-1) != 1:
        raise Error(f"{where}: caches.{name}: expected [num_blocks, block_bytes] or [num_blocks, "
                    f"block_size, row] with a contiguous last dim, got shape {list(t.shape)}, "
                    f"strides {tuple(t.stride())}")
    if t.dim() == 3:
        if t.shape[1] > 1 and t.stride(1) != t.shape[2]:
            raise Error(f"{where}: caches.{name}.stride(1): expected {t.shape[2]} (dense "
                        f"blocks), got {t.stride(1)}")
        block = t.shape[1] * t.shape[2]
        t = t.as_strided((t.shape[0], block), (t.stride(0) if t.shape[0] > 1 else block, 1))
    return t if t.dtype == torch.uint8 else t.view(torch.uint8)


class Attention(_LayerWrapper):
    """One attention layer with its weights and paged caches, on the CPU or a CUDA device.

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
    kv_layout: the SWA and compressed caches' layout: "model1" (MODEL1_FP8, FlashMLA's; default),
        "bf16" (full-width bf16 rows, as the FlashInfer port's cache) or "fp8_per_tensor"
        (full-width e4m3 rows with one scale, the port's per-tensor FP8 cache); the native
        backend, "cpu" and "cuda".
    kv_scale: the fp8_per_tensor caches' scale (value = fp8 · kv_scale; vLLM's per-layer kv
        scale, 1 by default as there).
    q_scale: with kv_layout "fp8_per_tensor" the layer's queries are FP8 too, as the FlashInfer
        port's: the insert writes e4m3(q / q_scale), decodes read them (the scale folded into the
        logit scale) and prefills attend with the bf16 q holding bf16(fp8 · q_scale). vLLM's
        per-layer q scale, 1 by default as there.
    fp8_activations: quantize activations to FP8 as production does (per token and 128 columns,
        UE8M0): the attention output before wo_a, and the input of every projection whose weight
        is FP8. Required on "cuda" for FP8 weights (FP8 tensor cores take FP8 inputs).
    device: "cpu" (the reference ops) or "cuda[:i]" (the CUDA ops; caches and weights — FP8 GEMM
        weights kept FP8 for the FP8 tensor cores, others bf16 — live on that GPU, and forwards
        run on torch's current stream without synchronizing).
    cuda_graphs: CUDA decode-only steps replay CUDA graphs, one per batch-size bucket (1, 2, 4,
        ..., 512 tokens): the first step of a bucket runs eagerly, the second is captured.
        A forward may also be captured by the caller with torch.cuda.graph (run one step of the
        same shape eagerly first, so the workspaces are sized); a replay re-runs the captured
        step, its plan included, on the inputs then in the captured tensors.
    backend: "native" (the C++ ops; default) or "triton" (the portable Triton kernels, see the
        module docstring); None: $DSV4_BACKEND, else native. The Triton layer keeps the same
        cache layouts and block policies; it has no CUDA graphs (cuda_graphs is ignored) and
        reserve() only reports memory.
    caller_caches: the caller (a serving engine, as vLLM) owns the caches: bind_caches() takes
        its cache tensors and forward_step() its per-step metadata; the layer allocates no cache
        and keeps no per-request state (forward() and release() are refused). Native backend
        only; of the cache options only swa_block_size applies.
    tp_rank, tp_size, reduce: tensor parallelism (docs/design.md "Tensor parallelism"; native
        backend only): the layer keeps rank tp_rank's shard of tp_size (its n_heads/tp_size
        heads of wq_b and attn_sink, its wo_a groups, its columns of wo_b) and its forward
        returns that rank's partial y, passed first to `reduce` if given — a callable summing y
        in place over the ranks, e.g. `lambda y: torch.distributed.all_reduce(y, group=pg)`
        (on the CUDA layer it runs on torch's current stream, which the forward used). Across
        GPUs: one process per GPU (torchrun), each its rank's layer on device cuda:LOCAL_RANK
        with that reduce (tests/python/multi_gpu/tp_torchrun.py).
    """

    def __init__(self, config, layer: int, weights: WeightsArg = None, *, seed: int = 1,
                 fp8_weights: bool = True, swa_blocks: int = 256, compressed_blocks: int = 256,
                 state_blocks: int = 64, swa_block_size: int = 64, fp8_activations: bool = True,
                 device: Union[torch.device, str] = "cpu", cuda_graphs: bool = True,
                 backend: Union[str, None] = None, caller_caches: bool = False,
                 tp_rank: int = 0, tp_size: int = 1,
                 reduce: Optional[Callable[[torch.Tensor], object]] = None,
                 kv_layout: str = "model1", kv_scale: float = 1.0, q_scale: float = 1.0):
        self.backend = selected_backend(backend)
        if self.backend != "native":
            for name, value, default in (("kv_layout", kv_layout, "model1"),
                                         ("kv_scale", kv_scale, 1.0), ("q_scale", q_scale, 1.0)):
                if value != default:
                    raise Error(f"Attention: {name}: expected {default!r} with backend "
                                f"{self.backend}, got {value!r}")
        if caller_caches and self.backend != "native":
            raise Error(f"Attention: caller_caches: the {self.backend} backend keeps its own "
                        f"caches; use backend='native'")
        self._bound_caches = None
        if isinstance(config, str):
            config = _C.ModelConfig.builtin(config)
        self.config = config
        self.tp_rank, self.tp_size, self._reduce = tp_rank, tp_size, reduce
        if self.backend == "triton" and (tp_size != 1 or reduce is not None):
            raise Error(f"Attention: tp_size: expected 1 with backend triton (tensor parallelism "
                        f"is the native backend's), got {tp_size}")
        if self.backend == "triton":
            self.device = _triton_device(device, "Attention")
            w = _load_weights(config, layer, weights, seed, fp8_weights)
            with self._device_guard():
                self._layer = _triton_layer_cls()(
                    config, layer, w, self.device, swa_blocks=swa_blocks,
                    compressed_blocks=compressed_blocks, state_blocks=state_blocks,
                    swa_block_size=swa_block_size, fp8_activations=fp8_activations)
            return
        self.device = _layer_device(device)
        w = _load_weights(config, layer, weights, seed, fp8_weights)
        with self._device_guard():
            self._layer = _C.Attention(config, layer, w, swa_blocks, compressed_blocks,
                                       state_blocks, swa_block_size, fp8_activations,
                                       self.device.type, cuda_graphs, bool(caller_caches),
                                       tp_rank, tp_size, kv_layout, kv_scale, q_scale)

    # ---- caller-owned caches (caller_caches=True) ---------------------------------------------
    _CACHE_NAMES = ("swa", "compressed", "compressor_state", "indexer_keys", "indexer_state")

    def bind_caches(self, swa: torch.Tensor, compressed: Optional[torch.Tensor] = None,
                    compressor_state: Optional[torch.Tensor] = None,
                    indexer_keys: Optional[torch.Tensor] = None,
                    indexer_state: Optional[torch.Tensor] = None) -> None:
        """The caller's cache tensors, on the layer's device: per cache [num_blocks, block_bytes]
        bytes (uint8, or any dtype viewed as bytes), or [num_blocks, block_size, row] with dense
        blocks (vLLM's shape); any block stride for swa / compressed (MODEL1_FP8 pages) and
        indexer_keys, dense blocks for the fp32 compressor rings. Which are needed depends on
        the kind: SWA swa; C128A + compressed, compressor_state; C4A all five. Block sizes:
        swa_block_size, 256 / ratio (compressed), 64 (indexer keys), ratio rows (rings). The
        tensors are kept alive while bound."""
        tensors = dict(zip(self._CACHE_NAMES, (swa, compressed, compressor_state, indexer_keys,
                                               indexer_state)))
        views = {name: (None if t is None else _cache_bytes("Attention.bind_caches", name, t))
                 for name, t in tensors.items()}
        with self._device_guard():
            self._layer.bind_caches(**views)
        self._bound_caches = tensors

    def forward_step(self, x: torch.Tensor, query_start_loc: torch.Tensor,
                     seq_lens: torch.Tensor, positions: torch.Tensor, slot_mapping: torch.Tensor,
                     block_tables: Dict[str, torch.Tensor]) -> torch.Tensor:
        """One step on the bound caches, with vLLM's metadata: query_start_loc [R + 1] (from 0;
        decodes first), seq_lens [R] (tokens after the step), positions [T], slot_mapping [T]
        (SWA slots) and block_tables {cache name: int [R, *]} for the caches of the kind (names
        as bind_caches'). The metadata is read on the host: pass CPU tensors (vLLM's *_cpu
        mirrors); CUDA tensors are copied to the host, which synchronizes. x [T, dim] → y [T, dim]
        float32 on the layer's device (x as forward() takes it). Every argument is checked
        before anything is written (dsv4attn.Error names it); see include/dsv4/caller_step.h."""
        where = "Attention.forward_step"
        if not isinstance(block_tables, dict) or not set(block_tables) <= set(self._CACHE_NAMES):
            raise Error(f"{where}: block_tables: expected a dict with keys among "
                        f"{list(self._CACHE_NAMES)}, got {block_tables!r:.200}")

        def host(name, t, dtype):
            t = tensor_arg(where, name, t)
            return t.to("cpu", dtype)

        meta = [host("query_start_loc", query_start_loc, torch.int32),
                host("seq_lens", seq_lens, torch.int32),
                host("positions", positions, torch.int64),
                host("slot_mapping", slot_mapping, torch.int64)]
        tables = [None if block_tables.get(n) is None else
                  host(f"block_tables[{n!r}]", block_tables[n], torch.int32)
                  for n in self._CACHE_NAMES]
        x = tensor_arg(where, "x", x)
        if x.dim() != 2:
            raise Error(f"{where}: x.ndim: expected 2 ([T, dim]), got {x.dim()}")
        if self.device.type == "cpu":
            x = x.contiguous()
        else:
            if x.dtype not in (torch.float32, torch.bfloat16):
                raise Error(f"{where}: x.dtype: expected float32 or bfloat16, got {x.dtype}")
            x = x.to(self.device, torch.bfloat16).contiguous()
        y = torch.empty((x.shape[0], self.config.dim), dtype=torch.float32, device=self.device)
        with self._device_guard():
            stream = (torch.cuda.current_stream(self.device).cuda_stream
                      if self.device.type == "cuda" else 0)
            self._layer.forward_step(*meta, *tables, x, y, stream)
            if self._reduce is not None:
                self._reduce(y)
        return y

    def _device_guard(self):
        return _device_guard(self.device)

    @property
    def kind(self) -> str:
        """"SWA", "C4A" or "C128A"."""
        return self._layer.kind

    def reserve(self, max_tokens: int, max_requests: int, max_context: int) -> "_C.LayerMemory":
        """Sizes every workspace for steps of up to max_tokens tokens over max_requests requests
        with sequences up to max_context (so they allocate nothing); returns the layer's memory
        in bytes (weights, caches, workspace, step upload). Triton backend: temporaries come
        from torch's caching allocator; returns memory() only."""
        if self.backend == "triton":
            return self.memory()
        with self._device_guard():
            return self._layer.reserve(max_tokens, max_requests, max_context)

    def memory(self) -> "_C.LayerMemory":
        """Bytes the layer holds on its device: weights, caches, workspace (and its high water
        mark), step upload. Triton backend: a dict {"weights", "caches"}."""
        return self._layer.memory()

    @property
    def graph_stats(self) -> Tuple[int, int]:
        """(CUDA graphs captured, decode steps replayed from them); the Triton layer has none."""
        if self.backend == "triton":
            return 0, 0
        return super().graph_stats

    def forward(self, batch: BatchDescription, x: torch.Tensor) -> torch.Tensor:
        """x [T, dim] (float32 or bfloat16) → y [T, dim] float32 on the layer's device, rows in
        batch order.

        CPU layer: x on the CPU. CUDA layer: x on the CPU or the layer's GPU (rounded to
        bfloat16 there, as the CUDA GEMMs take bf16 activations); the forward is asynchronous on
        torch's current stream. Every request's context must equal the tokens this layer has
        cached for it (0 for a new request). A rejected batch raises dsv4attn.Error and changes
        nothing.
        """
        where = "Attention.forward"
        x = _step_input(where, batch, x, self.config.dim)
        if self.backend == "triton":
            return self._forward_triton(batch, x)
        return self._native_forward(where, batch, x, self._reduce)

    __call__ = forward

    def _forward_triton(self, batch: BatchDescription, x: torch.Tensor) -> torch.Tensor:
        where = "Attention.forward"
        if x.device.type not in ("cpu", self.device.type) or (
                x.device.type == "cuda" and x.device != self.device):
            raise Error(f"{where}: x.device: expected cpu or {self.device}, got {x.device}")
        if x.dtype not in (torch.float32, torch.bfloat16):
            raise Error(f"{where}: x.dtype: expected float32 or bfloat16, got {x.dtype}")
        x = x.to(self.device).contiguous()
        ids, ctx, new, x, scatter = _plan_order_rows(batch, x)
        with self._device_guard():
            return scatter(self._layer.forward(ids, ctx, new, x))

    def release(self, request_id: int) -> None:
        """Forgets a finished request and frees its cache blocks."""
        self._layer.release(int_arg("Attention.release", "request_id", request_id))

    def __repr__(self) -> str:
        return (f"<dsv4attn.Attention {self.config.name} layer {self.layer} ({self.kind}) "
                f"on {self.device}, backend {self.backend}>")


class AttentionStack:
    """The attention layers of a config (all, or the indices in `layers`), each with its own
    weights and paged caches, run in sequence with the residual stream the rest of a transformer
    block would carry: h ← h + Attention_l(RMSNorm(h)) (unweighted RMSNorm) — the unit
    `dsv4 run` drives (include/dsv4/model.h).

    weights: None (seeded random, `seed`, FP8 as released when `fp8_weights`) or a checkpoint
    directory. device "cuda" runs every layer on the GPU, with the residual stream on the GPU
    too: x may be on the CPU or the GPU, y comes back on the stack's device, and a step neither
    synchronizes nor copies from pageable memory (decode steps replay CUDA graphs, see
    Attention). A step any layer rejects raises dsv4attn.Error before any layer changes state.
    """

    def __init__(self, config, layers: Sequence[int] | None = None,
                 weights: Union[str, os.PathLike, None] = None, *, seed: int = 1,
                 fp8_weights: bool = True, swa_blocks: int = 256, compressed_blocks: int = 256,
                 state_blocks: int = 64, fp8_activations: bool = True,
                 device: Union[torch.device, str] = "cpu", cuda_graphs: bool = True,
                 backend: Union[str, None] = None):
        self.backend = selected_backend(backend, "AttentionStack")
        if isinstance(config, str):
            config = _C.ModelConfig.builtin(config)
        self.config = config
        if self.backend == "triton":
            self.device = _triton_device(device, "AttentionStack")
            ids = [int(i) for i in (layers or range(config.n_layers))]
            for i in ids:
                if not 0 <= i < config.n_layers:
                    raise Error(f"AttentionStack: layers: expected 0..{config.n_layers - 1}, "
                                f"got {i}")
            cls = _triton_layer_cls()
            with _device_guard(self.device):
                self._layers = [cls(config, i, _load_weights(config, i, weights, seed,
                                                             fp8_weights), self.device,
                                    swa_blocks=swa_blocks, compressed_blocks=compressed_blocks,
                                    state_blocks=state_blocks, fp8_activations=fp8_activations)
                                for i in ids]
            return
        self.device = _layer_device(device)
        with _device_guard(self.device):
            self._stack = _C.AttentionStack(
                config, [int(i) for i in (layers or [])],
                os.fspath(weights) if weights is not None else "", int(seed), fp8_weights,
                swa_blocks, compressed_blocks, state_blocks, fp8_activations, self.device.type,
                cuda_graphs)

    def __len__(self) -> int:
        if self.backend == "triton":
            return len(self._layers)
        return self._stack.num_layers

    @property
    def layers(self) -> List[Tuple[int, str]]:
        """(layer index, kind) of every layer, in order."""
        if self.backend == "triton":
            return [(a.layer, a.kind) for a in self._layers]
        return [(self._stack.layer_index(i), self._stack.layer_kind(i)) for i in range(len(self))]

    def forward(self, batch: BatchDescription, x: torch.Tensor) -> torch.Tensor:
        """x [T, dim] → y [T, dim] float32 on the stack's device, rows in batch order."""
        where = "AttentionStack.forward"
        x = _step_input(where, batch, x, self.config.dim)
        x = x.to(self.device, torch.float32).contiguous()
        if self.backend == "triton":
            return self._forward_triton(batch, x)
        if self.device.type == "cpu":
            y = torch.empty((x.shape[0], self.config.dim), dtype=torch.float32)
            self._stack.forward(batch.request_ids, batch.contexts, batch.num_new, x, y)
            return y
        ids, ctx, new, x, scatter = _plan_order_rows(batch, x)
        y = torch.empty((x.shape[0], self.config.dim), dtype=torch.float32, device=self.device)
        with _device_guard(self.device):
            self._stack.set_stream(torch.cuda.current_stream(self.device).cuda_stream)
            self._stack.forward(ids, ctx, new, x, y)
        return scatter(y)

    __call__ = forward

    def _forward_triton(self, batch: BatchDescription, x: torch.Tensor) -> torch.Tensor:
        """The residual chain of include/dsv4/model.h on Triton layers: h <- h + layer(RMSNorm(h))
        (unweighted RMSNorm; bf16 layer input on a GPU, fp32 on the CPU)."""
        from .triton import get as op

        ids, ctx, new, h, scatter = _plan_order_rows(batch, x)
        for a in self._layers:  # every layer accepts the step before the first one runs
            a.check_plan(ids, ctx, new)
        h = h.clone()
        normed = torch.empty_like(h, dtype=torch.bfloat16 if self.device.type == "cuda"
                                  else torch.float32)
        with _device_guard(self.device):
            for a in self._layers:
                op("rms_norm")(h, None, float(self.config.norm_eps), normed)
                h += a.forward(ids, ctx, new, normed)
        return scatter(h)

    def release(self, request_id: int) -> None:
        """Forgets a finished request in every layer and frees its cache blocks."""
        request_id = int_arg("AttentionStack.release", "request_id", request_id)
        if self.backend == "triton":
            for a in self._layers:
                a.release(request_id)
            return
        self._stack.release(request_id)

    def __repr__(self) -> str:
        return (f"<dsv4attn.AttentionStack {self.config.name} {self.layers} on {self.device}, "
                f"backend {self.backend}>")


def reference_attention_layer(config, layer: int, weights: AttentionWeights, x: torch.Tensor,
                              fp8_activations: bool = True, kv_layout: str = "model1",
                              kv_scale: float = 1.0, q_scale: float = 1.0) -> torch.Tensor:
    """The float64 reference (include/dsv4/reference.h): y [L, dim] float64 for ONE request's
    tokens x [L, dim] at positions 0..L-1, with no caches or batching. fp8_activations: model the
    layer's FP8 activation quantizations (Attention's flag of the same name); kv_layout: model
    what the layer's caches hand back, kv_scale the FP8_PER_TENSOR scale and q_scale its FP8
    queries' (Attention's arguments of the same names)."""
    if isinstance(config, str):
        config = _C.ModelConfig.builtin(config)
    x = x.detach().to("cpu", torch.float64).contiguous()
    return _C.reference_attention_layer(config, layer, weights, x, fp8_activations, kv_layout,
                                        kv_scale, q_scale)

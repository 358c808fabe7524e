"""dsv4attn.Attention: one DeepSeek-V4 attention layer driven from Python.

This first version composes the layer from torch.ops.dsv4.* (SPEC §2) for sliding-window
(ratio 0, "SWA") layers: projections and norms, the fused q-norm/RoPE/KV insert into a paged
MODEL1_FP8 cache, sparse attention of every token over its window (read from the cache), inverse
RoPE and the grouped output projection. Compressed layers (C4A / C128A) need the compressor and
indexer, which the C++ layer (include/dsv4/layer.h, not written yet) will provide; constructing
one raises dsv4attn.Error.

    cfg = dsv4attn.ModelConfig.from_json_file(ckpt_dir)
    layer = dsv4attn.Attention.from_checkpoint(ckpt_dir, layer=0)
    cache = layer.new_cache(num_blocks=64)
    y = layer(x, dsv4attn.BatchDescription.from_lengths([(0, 5, 0)], device=x.device), cache)
"""
from __future__ import annotations

import dataclasses
import json
import mmap
import os
from typing import Dict, List, Optional, Sequence, Tuple

import torch

from . import Error, _C
from ._runtime import planner_sms, rope_cos_sin_for

__all__ = ["Attention", "BatchDescription", "LayerCache", "load_safetensors"]

_ST_DTYPES = {
    "BF16": torch.bfloat16, "F16": torch.float16, "F32": torch.float32, "F64": torch.float64,
    "F8_E4M3": torch.float8_e4m3fn, "F8_E8M0": getattr(torch, "float8_e8m0fnu", None),
    "I32": torch.int32,
    "I64": torch.int64, "U8": torch.uint8, "I8": torch.int8,
}


def load_safetensors(path: str, names: Optional[Sequence[str]] = None) -> Dict[str, torch.Tensor]:
    """Reads tensors (all, or `names`) of one .safetensors file into CPU tensors (torch only)."""
    with open(path, "rb") as f:
        header_len = int.from_bytes(f.read(8), "little")
        header = json.loads(f.read(header_len))
        data = mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_COPY)  # writable view: no torch warning
    base = 8 + header_len
    out = {}
    for name, info in header.items():
        if name == "__metadata__" or (names is not None and name not in names):
            continue
        dtype = _ST_DTYPES.get(info["dtype"])
        if dtype is None:
            raise Error(f"load_safetensors: {name}: unsupported dtype {info['dtype']}")
        begin, end = info["data_offsets"]
        raw = torch.frombuffer(data, dtype=torch.uint8, count=end - begin, offset=base + begin)
        out[name] = raw.clone().view(dtype).reshape(info["shape"])
    return out


@dataclasses.dataclass
class BatchDescription:
    """The tokens of one forward step: requests in order (decodes first), each contributing the
    token range [query_start_loc[r], query_start_loc[r+1]) at absolute positions."""

    request_ids: List[int]
    query_start_loc: List[int]   # R + 1 token offsets (host)
    positions: torch.Tensor      # [T] int64 absolute positions (on the device of the layer)
    positions_host: Optional[torch.Tensor] = None  # the same on the host (planning, no sync)

    def host_positions(self) -> torch.Tensor:
        if self.positions_host is None:
            self.positions_host = self.positions.cpu()
        return self.positions_host

    @staticmethod
    def from_lengths(requests: Sequence[Tuple[int, int, int]],
                     device: torch.device | str = "cpu") -> "BatchDescription":
        """requests: (request_id, num_new_tokens, num_cached_tokens) per request."""
        starts, positions = [0], []
        for _, new, cached in requests:
            starts.append(starts[-1] + new)
            positions.extend(range(cached, cached + new))
        host = torch.tensor(positions, dtype=torch.int64)
        return BatchDescription([r[0] for r in requests], starts, _to_device(host, device), host)


def _to_device(t: torch.Tensor, device: torch.device | str) -> torch.Tensor:
    """Host → device without blocking the host (pinned staging buffer) on CUDA."""
    device = torch.device(device)
    if device.type == "cpu":
        return t
    return t.pin_memory().to(device, non_blocking=True)


class LayerCache:
    """The paged MODEL1_FP8 SWA cache of one layer and its per-request block tables (blocks are
    handed out in order and never recycled in this first version)."""

    def __init__(self, num_blocks: int, block_size: int = 64, device: torch.device | str = "cpu"):
        geo = _C.kv_geometry("model1_fp8", block_size)
        self.block_size = block_size
        self.data = torch.zeros((num_blocks, geo["block_bytes"]), dtype=torch.uint8, device=device)
        self.tables: Dict[int, List[int]] = {}
        self.lengths: Dict[int, int] = {}
        self._next_block = 0

    def reserve(self, request_id: int, end_position: int) -> None:
        table = self.tables.setdefault(request_id, [])
        while len(table) * self.block_size < end_position:
            if self._next_block >= self.data.shape[0]:
                raise Error(f"LayerCache: out of blocks ({self.data.shape[0]}) for request "
                            f"{request_id} at position {end_position}")
            table.append(self._next_block)
            self._next_block += 1
        self.lengths[request_id] = max(self.lengths.get(request_id, 0), end_position)

    def block_table(self, request_ids: Sequence[int]) -> torch.Tensor:
        width = max(1, max(len(self.tables[r]) for r in request_ids))
        rows = [self.tables[r] + [-1] * (width - len(self.tables[r])) for r in request_ids]
        return torch.tensor(rows, dtype=torch.int32)


class Attention(torch.nn.Module):
    """One attention layer (SWA layers for now) with its weights, on CPU or CUDA tensors."""

    _LINEARS = ("wq_a", "wq_b", "wkv", "wo_a", "wo_b")

    def __init__(self, config, layer: int, weights: Dict[str, torch.Tensor],
                 device: torch.device | str = "cpu", max_position: Optional[int] = None):
        super().__init__()
        self.config, self.layer = config, layer
        kind = config.layer_kind(layer)
        if kind != "SWA":
            raise Error(f"Attention: layer {layer} is {kind}: only SWA layers run from Python so "
                        "far (the compressor/indexer path arrives with the C++ layer)")
        missing = [n for n in ("wq_a.weight", "q_norm.weight", "wq_b.weight", "wkv.weight",
                               "kv_norm.weight", "wo_a.weight", "wo_b.weight", "attn_sink")
                   if n not in weights]
        if missing:
            raise Error(f"Attention: weights: missing {missing}")
        self.w = {k: v.to(device) for k, v in weights.items()}
        H, D = config.n_heads, config.head_dim
        G, L = config.o_groups, config.o_lora_rank
        self.wo_a = self.w["wo_a.weight"].view(G, L, H * D // G)
        scale = self.w.get("wo_a.scale")
        self.wo_a_scale = scale.view(G, -1, scale.shape[-1]) if scale is not None else None
        self.cos_sin = rope_cos_sin_for(config, layer, max_position or 4096, device)

    # ---------------------------------------------------------------- construction
    @staticmethod
    def prefix_for(layer: int) -> List[str]:
        return [f"layers.{layer}.attn.", f"model.layers.{layer}.self_attn.",
                f"model.layers.{layer}.attn."]

    @classmethod
    def from_state_dict(cls, config, layer: int, state_dict: Dict[str, torch.Tensor],
                        device: torch.device | str = "cpu", **kw) -> "Attention":
        """Weights under the checkpoint names (`layers.{i}.attn.wq_a.weight`, ...; `.scale` or
        `.weight_scale_inv` for FP8 block scales), with or without the layer prefix."""
        weights = {}
        for name, t in state_dict.items():
            for p in cls.prefix_for(layer) + [""]:
                if name.startswith(p) and (p or "." in name or name == "attn_sink"):
                    weights[name[len(p):].replace(".weight_scale_inv", ".scale")] = t
                    break
        return cls(config, layer, weights, device, **kw)

    @classmethod
    def from_checkpoint(cls, path: str, layer: int, device: torch.device | str = "cpu",
                        **kw) -> "Attention":
        """config.json + *.safetensors of a checkpoint directory (only this layer is read)."""
        config = _C.ModelConfig.from_json_file(path)
        prefixes = cls.prefix_for(layer)
        state: Dict[str, torch.Tensor] = {}
        for fname in sorted(os.listdir(path)):
            if fname.endswith(".safetensors"):
                with open(os.path.join(path, fname), "rb") as f:
                    header = json.loads(f.read(int.from_bytes(f.read(8), "little")))
                wanted = [n for n in header if any(n.startswith(p) for p in prefixes)]
                if wanted:
                    state.update(load_safetensors(os.path.join(path, fname), wanted))
        return cls.from_state_dict(config, layer, state, device, **kw)

    def new_cache(self, num_blocks: int, block_size: int = 64) -> LayerCache:
        return LayerCache(num_blocks, block_size, self.cos_sin.device)

    # ---------------------------------------------------------------- forward
    def _linear(self, x: torch.Tensor, name: str, out_dtype=torch.bfloat16) -> torch.Tensor:
        w = self.w[f"{name}.weight"]
        y = torch.empty((x.shape[0], w.shape[0]), dtype=out_dtype, device=x.device)
        torch.ops.dsv4.linear(x, None, w, self.w.get(f"{name}.scale"), y)
        return y

    def forward(self, x: torch.Tensor, batch: BatchDescription, cache: LayerCache) -> torch.Tensor:
        """x [T, dim] bf16 → y [T, dim] bf16; appends the tokens' KV to `cache`."""
        cfg = self.config
        T, H, D, W = x.shape[0], cfg.n_heads, cfg.head_dim, cfg.window_size
        if T != batch.query_start_loc[-1] or batch.positions.shape[0] != T:
            raise Error(f"Attention.forward: x.shape[0]: expected {batch.query_start_loc[-1]} "
                        f"tokens (the batch description), got {T}")
        eps = float(cfg.norm_eps)
        qr, kv = self._linear(x, "wq_a"), self._linear(x, "wkv")
        qr_n, kv_n = torch.empty_like(qr), torch.empty_like(kv)
        torch.ops.dsv4.fused_qkv_rms_norm(qr, self.w["q_norm.weight"], kv, self.w["kv_norm.weight"],
                                          eps, qr_n, kv_n)
        q = self._linear(qr_n, "wq_b").view(T, H, D)

        # Token → request, slots for the new tokens, each token's window: planned on the host
        # (block tables are host bookkeeping), then copied without blocking.
        positions_cpu = batch.host_positions()
        token_to_req = torch.empty(T, dtype=torch.int32)
        for r, rid in enumerate(batch.request_ids):
            lo, hi = batch.query_start_loc[r], batch.query_start_loc[r + 1]
            token_to_req[lo:hi] = r
            if hi > lo:
                cache.reserve(rid, int(positions_cpu[hi - 1]) + 1)
        table = cache.block_table(batch.request_ids)
        local = positions_cpu.to(torch.int32).view(T, 1)
        slots = torch.empty((T, 1), dtype=torch.int32)
        torch.ops.dsv4.local_to_global_slots(local, token_to_req, table, cache.block_size, slots,
                                             None, True)
        window = torch.empty((T, W), dtype=torch.int32)
        window_lens = torch.empty(T, dtype=torch.int32)
        torch.ops.dsv4.swa_window_indices(positions_cpu, token_to_req, table, cache.block_size, W,
                                          window, window_lens)
        dev = x.device
        torch.ops.dsv4.qnorm_rope_kv_insert(q, kv_n, batch.positions, self.cos_sin, eps,
                                            cache.data, "model1_fp8", cache.block_size, 1.0,
                                            _to_device(slots.view(T).to(torch.int64), dev))

        # Every token attends to its window in the cache (one decode row per token).
        num_splits, split_len, ws_bytes = _C.decode_schedule(T, 1, H, W, planner_sms(dev), D)
        workspace = torch.empty(max(ws_bytes, 16), dtype=torch.uint8, device=dev)
        o = torch.empty((T, 1, H, D), dtype=torch.bfloat16, device=dev)
        lse = torch.empty((T, 1, H), dtype=torch.float32, device=dev)
        torch.ops.dsv4.sparse_decode(q.view(T, 1, H, D), cache.data, "model1_fp8",
                                     cache.block_size, _to_device(window.view(T, 1, W), dev),
                                     _to_device(window_lens, dev), None, "model1_fp8",
                                     cache.block_size, None, None, self.w["attn_sink"],
                                     D ** -0.5, D, num_splits, split_len, ws_bytes, workspace, o,
                                     lse)

        # Inverse RoPE, grouped wo_a, wo_b.
        o_rot = torch.empty((T, H, D), dtype=torch.bfloat16, device=dev)
        torch.ops.dsv4.apply_rope(o.view(T, H, D), batch.positions, self.cos_sin, True, o_rot)
        z = torch.empty((T, cfg.o_groups * cfg.o_lora_rank), dtype=torch.bfloat16, device=dev)
        torch.ops.dsv4.grouped_wo_a(o_rot.view(T, H * D), None, self.wo_a, self.wo_a_scale, z)
        return self._linear(z, "wo_b")

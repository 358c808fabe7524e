"""Paged caches of the Python (Triton-backed) layer: the block pool, per-request block tables and
the cache set of one layer, with the policies of include/dsv4/paged_cache.h, so a layer on this
backend allocates exactly the blocks the C++ layer allocates and its caches hold the same bytes
in the same places:

  - the pool hands out the lowest-numbered free block;
  - entry i of a request lives at slot table[i // B] * B + i % B;
  - a cache with `retain` (SWA: the window; compressor rings) releases, before appending, the
    blocks that hold only entries older than num_entries - retain (table entry -> -1).

Block tables and pools live on the host; the storage (uint8 [num_blocks, block_bytes]) lives on
the layer's device.
"""
from __future__ import annotations

import dataclasses
import heapq
from typing import Dict, List, Optional

import torch

from .. import Error
from .kv_cache import block_bytes as kv_block_bytes, layout_code


class BlockPool:
    def __init__(self, num_blocks: int):
        self.num_blocks = num_blocks
        self._free = list(range(num_blocks))  # an ascending list is a min-heap

    @property
    def num_free(self) -> int:
        return len(self._free)

    def allocate(self) -> int:
        if not self._free:
            raise Error(f"BlockPool.allocate: pool exhausted: all {self.num_blocks} blocks are in "
                        f"use")
        return heapq.heappop(self._free)

    def free(self, block: int) -> None:
        heapq.heappush(self._free, block)


@dataclasses.dataclass
class _Request:
    table: List[int] = dataclasses.field(default_factory=list)
    entries: int = 0


class PagedCache:
    """One paged cache: storage on `device`, a pool, the block tables of its requests."""

    def __init__(self, name: str, block_size: int, block_bytes: int, num_blocks: int,
                 retain: int, device: torch.device, layout: Optional[str] = None):
        self.name, self.block_size, self.block_bytes = name, block_size, block_bytes
        self.retain, self.layout = retain, layout
        self.pool = BlockPool(num_blocks)
        self.storage = torch.zeros((num_blocks, block_bytes), dtype=torch.uint8, device=device)
        self._requests: Dict[int, _Request] = {}

    def has_request(self, req: int) -> bool:
        return req in self._requests

    def add_request(self, req: int) -> None:
        if req in self._requests:
            raise Error(f"PagedCache({self.name}).add_request: request {req} already exists")
        self._requests[req] = _Request()

    def remove_request(self, req: int) -> None:
        r = self._requests.pop(req)
        for b in r.table:
            if b >= 0:
                self.pool.free(b)

    def num_entries(self, req: int) -> int:
        return self._requests[req].entries

    def block_table(self, req: int) -> List[int]:
        return self._requests[req].table

    def _releasable(self, entries: int) -> int:
        if self.retain <= 0 or entries <= self.retain:
            return 0
        return (entries - self.retain) // self.block_size

    def blocks_needed(self, entries_before: int, entries_after: int) -> int:
        """New blocks growing a request from entries_before to entries_after takes (not counting
        blocks recycling would free: conservative, as require_blocks_for_growth)."""
        B = self.block_size
        return -(-entries_after // B) - (-(-entries_before // B))

    def append(self, req: int, count: int) -> List[int]:
        """Reserves `count` entries at the end of the request; returns their global slots."""
        r = self._requests[req]
        B = self.block_size
        total = r.entries + count
        need = -(-total // B) - len(r.table)
        prefix = self._releasable(r.entries)
        released = sum(1 for b in r.table[:prefix] if b >= 0)
        if need > self.pool.num_free + released:
            raise Error(f"PagedCache({self.name}).append: pool exhausted: request {req} needs "
                        f"{need} new block(s) for {count} entries, "
                        f"{self.pool.num_free + released} free of {self.pool.num_blocks}")
        for k in range(min(prefix, len(r.table))):
            if r.table[k] >= 0:
                self.pool.free(r.table[k])
                r.table[k] = -1
        for _ in range(max(need, 0)):
            r.table.append(self.pool.allocate())
        first, r.entries = r.entries, total
        return [r.table[i // B] * B + i % B for i in range(first, total)]

    def tables(self, reqs: List[int], rows: int, width: int) -> torch.Tensor:
        """int32 [rows, width] host tensor: the block tables of `reqs`, -1 padded (extra rows
        for padding requests are all -1)."""
        out = torch.full((rows, max(width, 1)), -1, dtype=torch.int32)
        for i, req in enumerate(reqs):
            t = self._requests[req].table
            if t:
                out[i, :len(t)] = torch.tensor(t, dtype=torch.int32)
        return out

    def width(self, reqs: List[int]) -> int:
        return max([len(self._requests[r].table) for r in reqs] + [1])


class LayerCaches:
    """The caches of one layer (paged_cache.h make_layer_caches): swa for every kind;
    compressed + compressor_state for C4A / C128A; indexer_keys + indexer_state for C4A."""

    def __init__(self, config, kind: str, device: torch.device, layout: str = "model1_fp8",
                 swa_blocks: int = 256, compressed_blocks: int = 256, state_blocks: int = 64,
                 swa_block_size: int = 64):
        code = layout_code("Attention", "layout", layout)
        D = config.head_dim
        self.swa = PagedCache("swa", swa_block_size, kv_block_bytes(code, swa_block_size),
                              swa_blocks, max(config.window_size, 0), device, layout)
        self.compressed = self.compressor_state = self.indexer_keys = self.indexer_state = None
        if kind == "SWA":
            return
        ratio = 4 if kind == "C4A" else 128
        coff = 2 if ratio == 4 else 1
        cblock = 256 // ratio
        self.compressed = PagedCache("compressed", cblock, kv_block_bytes(code, cblock),
                                     compressed_blocks, 0, device, layout)
        self.compressor_state = PagedCache("compressor_state", ratio, ratio * 2 * coff * D * 4,
                                           state_blocks, coff * ratio, device)
        if kind == "C128A":
            return
        HD = config.index_head_dim
        self.indexer_keys = PagedCache("indexer_keys", 64, 64 * 132, compressed_blocks, 0, device)
        self.indexer_state = PagedCache("indexer_state", 4, 4 * 2 * 2 * HD * 4, state_blocks, 8,
                                        device)

    def all(self) -> List[PagedCache]:
        return [c for c in (self.swa, self.compressed, self.compressor_state, self.indexer_keys,
                            self.indexer_state) if c is not None]

    def add_request(self, req: int) -> None:
        for c in self.all():
            c.add_request(req)

    def remove_request(self, req: int) -> None:
        for c in self.all():
            c.remove_request(req)

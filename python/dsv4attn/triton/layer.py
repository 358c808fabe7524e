"""One DeepSeek-V4 attention layer step on the Triton backend, orchestrated in Python: the
sequence of src/layer/attention.cpp (and compressed_scope.cpp) over the ops of this package,
GEMMs through torch, caches as torch tensors in the C++ layouts (paged.py).

    x -> wq_a, wkv (GEMMs) -> fused q/kv RMSNorm -> wq_b -> q head-norm + RoPE, kv RoPE + FP8
      insert -> [compressor -> compressed cache; C4A: indexer compressor, query, scores, top-k;
      C128A: every emitted entry] -> decodes: sparse_decode over (SWA window | compressed) read
      from the FP8 caches -> prefills (groups of 4 requests): gather (compressed | SWA) into a
      bf16 workspace, sparse_prefill -> inverse RoPE + FP8 act quant -> grouped wo_a -> wo_b -> y

The step's plan (positions, slots, block tables, lengths) is built on the host and uploaded
once per step (pinned, asynchronous on CUDA); temporaries come from torch's caching allocator.
Decode steps are not captured as CUDA graphs here (the host plan changes shape every step).

Numerics follow the native layer: GEMM weights as bf16 on a GPU (FP8 weights dequantized once,
exact for UE8M0 scales), fp32 on the CPU (the interpreter path, closest to the CPU reference);
bf16 activations between ops; fp32 accumulation everywhere. With fp8_activations, the input of
every projection whose checkpoint weight is FP8 is quantized to FP8 (1 x 128, UE8M0) first, as
DeepSeek's Linear and the native layer do (x for wq_a / wkv, the normed q for wq_b and the
indexer's wq_b, z for wo_b), and o before wo_a; the GEMM then multiplies the exact dequantized
values in bf16 / fp32 (no FP8 tensor cores on this backend).
"""
from __future__ import annotations

from typing import Dict, List, Optional, Tuple

import torch

from .. import Error
from .._runtime import decode_schedule, planner_sms, rope_cos_sin
from . import get as op
from .compressor import CompressorConfig
from .gemm import matmul_f32
from .paged import LayerCaches

_PREFILL_GROUP = 4  # prefill requests gathered per workspace (the V4 wrapper's chunks)


def _dequantize_host(w: torch.Tensor, scale: Optional[torch.Tensor]) -> torch.Tensor:
    """fp32 copy of a checkpoint weight (FP8 e4m3 times its 128x128 block scales)."""
    if scale is None:
        return w.float()
    s = scale.float().repeat_interleave(128, 0)[:w.shape[0]].repeat_interleave(128, 1)
    return w.float() * s[:, :w.shape[1]]


class _Weights:
    """The layer's weights on its device, as the ops take them."""

    def __init__(self, config, layer: int, tensors: Dict[str, torch.Tensor],
                 device: torch.device):
        prefix = f"layers.{layer}.attn."
        if not any(k.startswith(prefix) for k in tensors):
            prefix = next(k for k in tensors if k.endswith("wq_a.weight"))[:-len("wq_a.weight")]
        gemm_dtype = torch.bfloat16 if device.type != "cpu" else torch.float32

        def gemm(name: str) -> torch.Tensor:
            w = tensors[prefix + name + ".weight"]
            return _dequantize_host(w, tensors.get(prefix + name + ".scale")).to(
                device=device, dtype=gemm_dtype).contiguous()

        def plain(name: str) -> torch.Tensor:
            return tensors[prefix + name].to(device).contiguous()

        G, L = config.o_groups, config.o_lora_rank
        # Which projections the checkpoint stores in FP8 (their inputs are quantized too).
        self.fp8 = {n: prefix + n + ".scale" in tensors
                    for n in ("wq_a", "wq_b", "wkv", "wo_a", "wo_b", "indexer.wq_b")}
        self.wq_a, self.wq_b, self.wkv, self.wo_b = (gemm(n) for n in ("wq_a", "wq_b", "wkv",
                                                                       "wo_b"))
        self.wo_a = gemm("wo_a").view(G, L, -1)
        self.q_norm, self.kv_norm = plain("q_norm.weight"), plain("kv_norm.weight")
        self.attn_sink = plain("attn_sink").float()
        self.compressor = self.indexer = None
        if prefix + "compressor.ape" in tensors:
            self.compressor = {"wkv": gemm("compressor.wkv"), "wgate": gemm("compressor.wgate"),
                               "ape": plain("compressor.ape").float(),
                               "norm": plain("compressor.norm.weight")}
        if prefix + "indexer.wq_b.weight" in tensors:
            self.indexer = {
                "wq_b": gemm("indexer.wq_b"), "weights_proj": gemm("indexer.weights_proj"),
                "compressor": {"wkv": gemm("indexer.compressor.wkv"),
                               "wgate": gemm("indexer.compressor.wgate"),
                               "ape": plain("indexer.compressor.ape").float(),
                               "norm": plain("indexer.compressor.norm.weight")}}

    def bytes(self) -> int:
        total = 0
        for v in vars(self).values():
            if v is self.fp8:
                continue
            items = v.values() if isinstance(v, dict) else [v]
            for t in items:
                if isinstance(t, dict):
                    total += sum(u.numel() * u.element_size() for u in t.values())
                elif isinstance(t, torch.Tensor):
                    total += t.numel() * t.element_size()
        return total


class TritonAttention:
    """A layer (config, layer index, AttentionWeights) on `device` ("cuda[:i]" for a GPU; "cpu"
    under TRITON_INTERPRET=1). forward(ids, contexts, num_new, x) -> y fp32, rows in the given
    order (decodes first); state per request until release(). dsv4attn.Attention(...,
    backend="triton") wraps it."""

    def __init__(self, config, layer: int, weights, device: torch.device, *,
                 swa_blocks: int = 256, compressed_blocks: int = 256, state_blocks: int = 64,
                 swa_block_size: int = 64, fp8_activations: bool = True,
                 layout: str = "model1_fp8"):
        if config.family != "v4":
            raise Error(f"Attention: config.family: expected v4 (the layer is DeepSeek-V4's), "
                        f"got {config.family}")
        self.config, self.layer, self.device = config, layer, device
        self.kind = config.layer_kind(layer)
        self.ratio = config.compress_ratio(layer)
        self.fp8_activations = fp8_activations
        self.layout = layout
        self.weights = weights  # the AttentionWeights (host copies)
        self.w = _Weights(config, layer, weights.tensors(config), device)
        self.caches = LayerCaches(config, self.kind, device, layout, swa_blocks,
                                  compressed_blocks, state_blocks, swa_block_size)
        self.cached: Dict[int, int] = {}
        self._rope = config.rope_for_layer(layer)
        self._cos_sin = torch.empty((0, config.rope_head_dim), dtype=torch.float32, device=device)
        self.compressor_cfg = CompressorConfig.attention(config, self.ratio) if self.ratio \
            else None
        self.indexer_cfg = CompressorConfig.indexer(config) if self.ratio == 4 else None

    # ---------------------------------------------------------------- bookkeeping
    def _rope_table(self, length: int) -> torch.Tensor:
        """The cos/sin table, grown by doubling (as the C++ layer) to cover [0, length)."""
        have = self._cos_sin.shape[0]
        if have < length:
            rows = max(have, 4096)
            while rows < length:
                rows *= 2
            r = self._rope
            self._cos_sin = rope_cos_sin(min(rows, self.config.max_position), r["rope_dims"],
                                         r["theta"], r["yarn"], r["factor"],
                                         r["original_seq_len"], r["beta_fast"], r["beta_slow"],
                                         self.device)
        return self._cos_sin

    def check_plan(self, ids: List[int], ctx: List[int], new: List[int]) -> None:
        """Contexts and cache capacity of a step, checked before anything changes."""
        for rid, c, n in zip(ids, ctx, new):
            have = self.cached.get(rid, 0)
            if c != have:
                raise Error(f"Attention.forward: context of request {rid}: expected {have} "
                            f"(tokens this layer has cached), got {c}")
            if c + n > self.config.max_position:
                raise Error(f"Attention.forward: sequence length of request {rid}: expected <= "
                            f"max_position {self.config.max_position}, got {c + n}")

        def need(cache, growth):
            blocks = sum(cache.blocks_needed(a, b) for a, b in growth)
            if blocks > cache.pool.num_free:
                raise Error(f"Attention.forward: {cache.name} cache exhausted: this step needs "
                            f"{blocks} new blocks, {cache.pool.num_free} of "
                            f"{cache.pool.num_blocks} are free")

        need(self.caches.swa, [(c, c + n) for c, n in zip(ctx, new)])
        if self.ratio:
            grow = [(c // self.ratio, (c + n) // self.ratio) for c, n in zip(ctx, new)]
            need(self.caches.compressed, grow)
            if self.caches.indexer_keys is not None:
                need(self.caches.indexer_keys, grow)
            for cache, cfg in ((self.caches.compressor_state, self.compressor_cfg),
                               (self.caches.indexer_state, self.indexer_cfg)):
                if cache is None:
                    continue
                fresh = sum(1 for rid in ids if rid not in self.cached)
                blocks = fresh * -(-cfg.ring_rows // cache.block_size)
                if blocks > cache.pool.num_free:
                    raise Error(f"Attention.forward: {cache.name} cache exhausted: new requests "
                                f"need {blocks} blocks, {cache.pool.num_free} are free")

    def release(self, rid: int) -> None:
        if rid not in self.cached:
            raise Error(f"Attention.release: unknown request {rid}")
        self.caches.remove_request(rid)
        del self.cached[rid]

    def memory(self) -> Dict[str, int]:
        return {"weights": self.w.bytes(),
                "caches": sum(c.storage.numel() for c in self.caches.all())}

    def _fp8_input(self, weight: str) -> bool:
        """Whether projection `weight` takes FP8-quantized inputs (FP8 weight, fp8_activations)."""
        return self.fp8_activations and self.w.fp8[weight]

    def _gemm_input(self, x: torch.Tensor, weight: str) -> torch.Tensor:
        """x as the projection `weight` takes it: FP8-rounded (1 x 128, UE8M0; exact values in
        x's dtype) when _fp8_input(weight), else x."""
        return self._fp8_round(x) if self._fp8_input(weight) else x

    def _fp8_round(self, x: torch.Tensor) -> torch.Tensor:
        """x [T, K] through quantize_act_fp8 (block 128) and back: the FP8 values, exactly."""
        T, K = x.shape
        xq = torch.empty((T, K), dtype=torch.float8_e4m3fn, device=self.device)
        scale = torch.empty((T, K // 128), dtype=torch.float32, device=self.device)
        op("quantize_act_fp8")(x, 128, xq, scale)
        out = torch.empty_like(x)
        op("dequantize_fp8_blocks")(xq, scale, 1, 128, out)
        return out

    def _upload(self, t: torch.Tensor) -> torch.Tensor:
        if self.device.type == "cuda":
            return t.pin_memory().to(self.device, non_blocking=True)
        return t.to(self.device)

    # ---------------------------------------------------------------- the step
    def forward(self, ids: List[int], ctx: List[int], new: List[int],
                x: torch.Tensor) -> torch.Tensor:
        """x [T, dim] on the layer's device (rows in the given order, decodes first) -> y."""
        self.check_plan(ids, ctx, new)
        cfg = self.config
        T = sum(new)
        y = torch.empty((T, cfg.dim), dtype=torch.float32, device=self.device)
        if T == 0:
            return y
        cos_sin = self._rope_table(max(c + n for c, n in zip(ctx, new)))
        for rid in ids:
            if rid not in self.cached:
                self.caches.add_request(rid)
                for cache, ccfg in ((self.caches.compressor_state, self.compressor_cfg),
                                    (self.caches.indexer_state, self.indexer_cfg)):
                    if cache is not None:  # the compressor rings, reserved once
                        cache.append(rid, ccfg.ring_rows)
                self.cached[rid] = 0
        plan = self._plan(ids, ctx, new)
        for rid, c, n in zip(ids, ctx, new):
            self.cached[rid] = c + n
        self._launch(plan, x, y, cos_sin)
        return y

    def _plan(self, ids, ctx, new) -> dict:
        """The host half of a step (attention.cpp plan_step, compressed_scope.cpp plan)."""
        R, W = len(ids), self.config.window_size
        nd = sum(1 for c, n in zip(ctx, new) if n == 1 and c > 0)
        positions, t2r, slots, qsl = [], [], [], [0]
        for r, (rid, c, n) in enumerate(zip(ids, ctx, new)):
            positions += range(c, c + n)
            t2r += [r] * n
            slots += self.caches.swa.append(rid, n)
            qsl.append(qsl[-1] + n)
        swa = self.caches.swa
        p = {"T": qsl[-1], "R": R, "nd": nd, "qsl": qsl,
             "positions": torch.tensor(positions, dtype=torch.int64),
             "token_to_req": torch.tensor(t2r, dtype=torch.int32),
             "slots": torch.tensor(slots, dtype=torch.int64),
             "swa_table": swa.tables(ids, R, swa.width(ids))}
        if self.ratio:
            r = self.ratio
            max_visible = 0
            for rid, c, n in zip(ids, ctx, new):
                max_visible = max(max_visible, (c + n) // r)
                grow = (c + n) // r - c // r
                if grow > 0:
                    self.caches.compressed.append(rid, grow)
                    if self.caches.indexer_keys is not None:
                        self.caches.indexer_keys.append(rid, grow)
            p["context"] = torch.tensor(ctx, dtype=torch.int64)
            for key, cache in (("state_table", self.caches.compressor_state),
                               ("out_table", self.caches.compressed),
                               ("index_state_table", self.caches.indexer_state),
                               ("index_key_table", self.caches.indexer_keys)):
                if cache is not None:
                    p[key] = cache.tables(ids, R, cache.width(ids))
            p["topk"] = self.config.index_topk if r == 4 else max_visible
            p["score_cols"] = max(max_visible, 1)
        groups = []
        for g0 in range(nd, R, _PREFILL_GROUP):
            g1 = min(R, g0 + _PREFILL_GROUP)
            seq = [ctx[i] + new[i] for i in range(g0, g1)]
            gather = [min(s, new[i] + W - 1) for s, i in zip(seq, range(g0, g1))]
            cseq = [s // self.ratio for s in seq] if self.ratio else []
            N = max(cseq, default=0)
            groups.append({"r0": g0, "r1": g1, "t0": qsl[g0], "t1": qsl[g1],
                           "qsl": torch.tensor([q - qsl[g0] for q in qsl[g0:g1 + 1]],
                                               dtype=torch.int32),
                           "seq": torch.tensor(seq, dtype=torch.int32),
                           "gather": torch.tensor(gather, dtype=torch.int32),
                           "cseq": torch.tensor(cseq, dtype=torch.int32), "N": N,
                           "M": N + max(gather)})
        p["groups"] = groups
        return p

    def _launch(self, p: dict, x: torch.Tensor, y: torch.Tensor, cos_sin: torch.Tensor) -> None:
        cfg, w, dev = self.config, self.w, self.device
        T, H, D, W = p["T"], cfg.n_heads, cfg.head_dim, cfg.window_size
        eps = float(cfg.norm_eps)
        up = {k: self._upload(v) for k, v in p.items() if isinstance(v, torch.Tensor)}
        positions, t2r = up["positions"], up["token_to_req"]
        act = torch.bfloat16 if dev.type != "cpu" else torch.float32
        xin = x.to(act)

        # 1-3. Projections and norms (x quantized once for both FP8 projections reading it).
        x8 = self._fp8_round(xin) if self._fp8_input("wq_a") or self._fp8_input("wkv") else xin
        qr = matmul_f32(x8 if self._fp8_input("wq_a") else xin, w.wq_a)
        kv_raw = matmul_f32(x8 if self._fp8_input("wkv") else xin, w.wkv)
        qr_n = torch.empty((T, cfg.q_lora_rank), dtype=torch.bfloat16, device=dev)
        kv = torch.empty((T, D), dtype=torch.bfloat16, device=dev)
        op("fused_qkv_rms_norm")(qr, w.q_norm, kv_raw, w.kv_norm, eps, qr_n, kv)
        # 6. The compressed half: request-local compressed entries per token.
        local, K = self._compressed(p, up, xin, qr_n, positions, t2r, cos_sin) if self.ratio \
            else (None, 0)
        q = matmul_f32(self._gemm_input(qr_n.to(act), "wq_b"), w.wq_b)
        q = q.to(torch.bfloat16).view(T, H, D)
        # 4-5. q head-norm + RoPE; kv RoPE + quant + insert into the SWA slots.
        swa = self.caches.swa
        op("qnorm_rope_kv_insert")(q, kv, positions, cos_sin, eps, swa.storage, self.layout,
                                   swa.block_size, 1.0, up["slots"])
        o = torch.empty((T, H, D), dtype=torch.bfloat16, device=dev)
        scale = D ** -0.5
        if p["nd"]:
            self._decodes(p, up, q, o, local, K, scale)
        if p["groups"]:
            self._prefills(p, up, q, o, local, K, scale)
        self._output(o, positions, cos_sin, y)

    def _compressed(self, p, up, x, qr_n, positions, t2r, cos_sin) -> Tuple[torch.Tensor, int]:
        cfg, dev, T = self.config, self.device, p["T"]
        caches = self.caches

        def compress(ccfg, wts, state, out, state_table, out_table, layout):
            rows = torch.empty((T, ccfg.proj_width), dtype=torch.float32, device=dev)
            scores = torch.empty_like(rows)
            op("compressor_project")(*ccfg.op_args(), x, wts["wkv"], wts["wgate"], wts["ape"], positions,
                                     rows, scores)
            op("compressor_update_and_emit")(
                *ccfg.op_args(), rows, scores, positions, t2r, up["context"], wts["norm"], cos_sin,
                state.storage.view(torch.float32).view(-1, ccfg.state_width), state_table,
                state.block_size, out.storage, out_table, out.block_size, layout)

        compress(self.compressor_cfg, self.w.compressor, caches.compressor_state,
                 caches.compressed, up["state_table"], up["out_table"], self.layout)
        K = p["topk"]
        local = torch.empty((T, max(K, 1)), dtype=torch.int32, device=dev)[:, :K]
        lens = torch.empty((T,), dtype=torch.int32, device=dev)
        if self.ratio == 128:
            if K:
                op("compressed_prefix_indices")(positions, self.ratio, local, lens)
            return local, K
        iw = self.w.indexer
        compress(self.indexer_cfg, iw["compressor"], caches.indexer_state, caches.indexer_keys,
                 up["index_state_table"], up["index_key_table"], "model1_fp8")
        HI = cfg.index_n_heads
        q_fp8 = torch.empty((T, HI, cfg.index_head_dim), dtype=torch.float8_e4m3fn, device=dev)
        q_scale = torch.empty((T, HI), dtype=torch.float32, device=dev)
        weights = torch.empty((T, HI), dtype=torch.float32, device=dev)
        act = x.dtype
        op("indexer_query")(self._gemm_input(qr_n.to(act), "indexer.wq_b"), iw["wq_b"], None, x,
                            iw["weights_proj"], positions, cos_sin, q_fp8, q_scale, weights)
        scores = torch.empty((T, p["score_cols"]), dtype=torch.float32, device=dev)
        op("indexer_scores")(q_fp8, q_scale, weights, positions, t2r,
                             caches.indexer_keys.storage, caches.indexer_keys.block_size,
                             up["index_key_table"], self.ratio, scores)
        op("indexer_topk")(scores, positions, self.ratio, local, lens)
        return local, K

    def _decodes(self, p, up, q, o, local, K, scale) -> None:
        cfg, dev, nd = self.config, self.device, p["nd"]
        H, D, W = cfg.n_heads, cfg.head_dim, cfg.window_size
        swa = self.caches.swa
        swa_idx = torch.empty((nd, W), dtype=torch.int32, device=dev)
        swa_len = torch.empty((nd,), dtype=torch.int32, device=dev)
        op("swa_window_indices")(up["positions"][:nd], up["token_to_req"][:nd], up["swa_table"],
                                 swa.block_size, W, swa_idx, swa_len)
        extra = {}
        if K > 0:
            ext_idx = torch.empty((nd, K), dtype=torch.int32, device=dev)
            ext_len = torch.empty((nd,), dtype=torch.int32, device=dev)
            comp = self.caches.compressed
            op("local_to_global_slots")(local[:nd], up["token_to_req"][:nd], up["out_table"],
                                        comp.block_size, ext_idx, ext_len)
            extra = dict(extra_k_cache=comp.storage, extra_block_size=comp.block_size,
                         extra_indices=ext_idx.view(nd, 1, K), extra_topk_length=ext_len)
        splits, split_len, ws_bytes = decode_schedule(nd, 1, H, W + K, planner_sms(dev), D)
        ws = torch.empty((max(ws_bytes, 16),), dtype=torch.uint8, device=dev)
        lse = torch.empty((nd, 1, H), dtype=torch.float32, device=dev)
        op("sparse_decode")(
            q[:nd].view(nd, 1, H, D), swa.storage, self.layout, swa.block_size,
            swa_idx.view(nd, 1, W), swa_len, extra.get("extra_k_cache"), self.layout,
            extra.get("extra_block_size", 1), extra.get("extra_indices"),
            extra.get("extra_topk_length"), self.w.attn_sink, scale, D, splits, split_len,
            ws_bytes, ws, o[:nd].view(nd, 1, H, D), lse)

    def _prefills(self, p, up, q, o, local, K, scale) -> None:
        cfg, dev = self.config, self.device
        H, D, W = cfg.n_heads, cfg.head_dim, cfg.window_size
        swa, comp = self.caches.swa, self.caches.compressed
        rows = max((g["r1"] - g["r0"]) * g["M"] for g in p["groups"])
        kv_all = torch.empty((rows * D,), dtype=torch.bfloat16, device=dev)
        for g in p["groups"]:
            n, M, N = g["r1"] - g["r0"], g["M"], g["N"]
            t0, t1 = g["t0"], g["t1"]
            kv_rows = kv_all[:n * M * D].view(n, M, D)
            seq, gather = self._upload(g["seq"]), self._upload(g["gather"])
            if self.ratio and N > 0:
                op("dequantize_and_gather")(comp.storage, self.layout, comp.block_size, 1.0,
                                            up["out_table"][g["r0"]:g["r1"]],
                                            self._upload(g["cseq"]), None, 0, kv_rows)
            op("dequantize_and_gather")(swa.storage, self.layout, swa.block_size, 1.0,
                                        up["swa_table"][g["r0"]:g["r1"]], seq, gather, N, kv_rows)
            topk = local[t0:t1] if K > 0 else torch.empty((t1 - t0, 0), dtype=torch.int32,
                                                          device=dev)
            idx = torch.empty((t1 - t0, K + W), dtype=torch.int32, device=dev)
            lens = torch.empty((t1 - t0,), dtype=torch.int32, device=dev)
            op("combine_topk_swa_indices")(topk, self._upload(g["qsl"]), seq, gather, W, N, M,
                                           self.ratio, idx, lens)
            ml = torch.empty((t1 - t0, H), dtype=torch.float32, device=dev)
            op("sparse_prefill")(q[t0:t1], kv_rows.view(n * M, 1, D),
                                 idx.view(t1 - t0, 1, K + W), lens, self.w.attn_sink, scale, D,
                                 o[t0:t1], ml, torch.empty_like(ml))

    def _output(self, o, positions, cos_sin, y) -> None:
        """8-9. Inverse RoPE (+ FP8 act quant, 1x128 UE8M0), grouped wo_a, wo_b -> y."""
        cfg, w, dev = self.config, self.w, self.device
        T, HD = o.shape[0], o.shape[1] * o.shape[2]
        if self.fp8_activations:
            oq = torch.empty((T, HD), dtype=torch.float8_e4m3fn, device=dev)
            osc = torch.empty((T, HD // 128), dtype=torch.float32, device=dev)
            o2 = torch.empty((T, HD), dtype=torch.bfloat16, device=dev)
            op("inv_rope_fp8_quant")(o, positions, cos_sin, 128, oq, osc, o_dequant=o2)
        else:
            op("apply_rope")(o, positions, cos_sin, True, o)
            o2 = o.view(T, HD)
        G, L = cfg.o_groups, cfg.o_lora_rank
        act = w.wo_a.dtype
        z = matmul_f32(o2.to(act).view(T, G, HD // G).transpose(0, 1), w.wo_a)  # [G, T, L]
        z = z.transpose(0, 1).reshape(T, G * L)
        # z is bf16 on a GPU (its GEMMs take bf16) and wherever an FP8 wo_b's input is quantized
        # from it (as DeepSeek's inference code stores it); fp32 on the CPU otherwise.
        if self._fp8_input("wo_b"):
            z = self._fp8_round(z.to(torch.bfloat16))
        y.copy_(matmul_f32(z.to(act), w.wo_b))

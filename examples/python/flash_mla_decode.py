"""Sparse decode over a paged MODEL1 FP8 KV cache, called as FlashMLA's API is (README)."""
import torch
from dsv4attn.flash_mla import alloc_kv_cache, flash_mla_with_kvcache, get_mla_metadata

b, s_q, h_q, topk = 2, 1, 64, 128
k_cache = alloc_kv_cache(num_blocks=16, page_block_size=64)  # [16, 64, 1, 584] uint8, MODEL1_FP8
q = torch.randn(b, s_q, h_q, 512, dtype=torch.bfloat16)
indices = torch.randint(0, 16 * 64, (b, s_q, topk), dtype=torch.int32)  # block*64+offset; -1 = none
sched, _ = get_mla_metadata()
out, lse = flash_mla_with_kvcache(q, k_cache, None, None, 512, sched, is_fp8_kvcache=True,
                                  indices=indices, attn_sink=torch.zeros(h_q))
print(out.shape, lse.shape)  # (2, 1, 64, 512) bf16, (2, 64, 1) fp32

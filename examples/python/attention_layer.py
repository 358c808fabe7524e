"""One C4A attention layer over two steps: prefills of two requests, then a decode beside a
prefill chunk (requests in any order; x's rows follow it). The README's layer example."""
import torch, dsv4attn

cfg = dsv4attn.ModelConfig.builtin("tiny")        # or ModelConfig.from_json_file(ckpt_dir)
layer = dsv4attn.Attention(cfg, 1, seed=0)        # weights: state dict | checkpoint dir | None
step = dsv4attn.BatchDescription([7, 9], contexts=[0, 0], num_new=[5, 3])
y = layer.forward(step, torch.randn(step.num_tokens, cfg.dim))  # fp32 [8, 256]
step = dsv4attn.BatchDescription([9, 7], contexts=[3, 5], num_new=[4, 1])  # 9: chunk, 7: decode
y = layer.forward(step, torch.randn(5, cfg.dim))
print(layer.kind, y.shape, y[step.rows(7)].shape)  # C4A (5, 256) (1, 256)
layer.release(7)

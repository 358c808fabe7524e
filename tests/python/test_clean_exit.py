"""A program that uses the package exits cleanly: status 0 and nothing on stderr.

nanobind checks at interpreter exit that every object of the extension's types has been freed
and prints "nanobind: leaked N instances/types/functions" otherwise; any other warning printed
at exit (or along the way) shows here as well. The program runs in a fresh interpreter, so the
exit is a real one, and touches every kind of object the extension hands out: the torch ops (and
their error path), the FlashMLA and vLLM front ends, the layer and the stack, weights, configs.
"""
import os
import subprocess
import sys
import textwrap

import dsv4attn

PROGRAM = textwrap.dedent("""
    import torch
    import dsv4attn
    from dsv4attn import vllm_ops
    from dsv4attn.flash_mla import (alloc_kv_cache, flash_mla_sparse_fwd,
                                    flash_mla_with_kvcache, get_mla_metadata)

    q = torch.randn(4, 16, 512, dtype=torch.bfloat16)
    kv = torch.randn(100, 1, 512, dtype=torch.bfloat16)
    idx = torch.randint(0, 100, (4, 1, 64), dtype=torch.int32)
    out, max_logits, lse = flash_mla_sparse_fwd(q, kv, idx, 512 ** -0.5)

    cache = alloc_kv_cache(num_blocks=4, page_block_size=64)
    sched, _ = get_mla_metadata()
    flash_mla_with_kvcache(q.view(2, 2, 16, 512), cache, None, None, 512, sched,
                           is_fp8_kvcache=True, indices=idx.view(2, 2, 64) % 256)

    x = torch.randn(3, 64)
    vllm_ops.fused_q_kv_rmsnorm(x, x.clone(), torch.ones(64), torch.ones(64), 1e-6)
    try:
        torch.ops.dsv4.rms_norm(x, None, 1e-6, torch.empty(2, 64))
    except dsv4attn.Error:
        pass

    cfg = dsv4attn.ModelConfig.builtin("tiny")
    layer = dsv4attn.Attention(cfg, 1, seed=0)
    step = dsv4attn.BatchDescription([7, 9], contexts=[0, 0], num_new=[5, 3])
    layer.forward(step, torch.randn(step.num_tokens, cfg.dim))
    weights = layer.weights
    state = layer.state_dict()
    dsv4attn.Attention(cfg, 1, state)
    dsv4attn.reference_attention_layer(cfg, 1, weights, torch.randn(3, cfg.dim))
    stack = dsv4attn.AttentionStack("tiny", layers=[0, 1])
    stack.forward(step, torch.randn(step.num_tokens, cfg.dim))
    print("ok", dsv4attn.__version__)
""")


def test_program_exits_cleanly():
    # The child imports the package the tests import (the build tree's, or an installed one).
    package_root = os.path.dirname(os.path.dirname(dsv4attn.__file__))
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [package_root, env.get("PYTHONPATH")]))
    r = subprocess.run([sys.executable, "-c", PROGRAM], capture_output=True, text=True, env=env,
                       timeout=300)
    assert r.returncode == 0, r.stderr
    assert r.stdout == f"ok {dsv4attn.__version__}\n"
    assert r.stderr == ""

"""bench/plot_layer.py draws a `dsv4 bench layer` report (skipped where matplotlib is missing)."""
import json
import os
import subprocess
import sys

import pytest

SCRIPT = os.path.join(os.path.dirname(__file__), "..", "..", "bench", "plot_layer.py")


def op(name, gpu_us, floor_us, flop, bytes_, bound, modeled=True):
    return {"name": name, "gpu_us": gpu_us, "host_us": gpu_us, "floor_us": floor_us if modeled else None,
            "flop": flop if modeled else None, "flop_fp8": flop if modeled else None, "flop_bf16": 0.0 if modeled else None,
            "bytes": bytes_ if modeled else None, "bound": bound if modeled else None, "modeled": modeled}


def report():
    case = {"model": "v4-flash", "layer": 2, "kind": "C4A", "case": "decode-128", "phase": "decode", "requests": 128,
            "tokens": 128, "context": 4096, "context_range": [4098, 4120], "wall_us": 4800.0, "wall_mode": "eager",
            "gpu_us": 520.0, "host_us": 4700.0, "floor_us": 70.0, "floor_complete": False,
            "unmodeled_ops": ["fused_new_op"], "reps": 20,
            "ops": [op("wq_b", 60.0, 11.0, 8.6e9, 3.4e7, "memory"), op("sparse_decode", 110.0, 22.0, 1.1e10, 6.5e7, "memory"),
                    op("act_quant", 20.0, 4.0, 0.0, 1.3e7, "memory"), op("fused_new_op", 5.0, 0, 0, 0, None, modeled=False)]}
    return {"device": "test", "commit": "abc", "date": "2026-11-25T00:00:00Z", "backend": "cuda",
            "ceilings": {"fp8_tflops": 1400.0, "bf16_tflops": 780.0, "copy_gbps": 2960.0},
            "settings": {}, "cases": [case, dict(case, case="decode-32", requests=32, tokens=32)]}


def test_plot_layer_writes_pngs(tmp_path):
    pytest.importorskip("matplotlib")
    src = tmp_path / "layer.json"
    src.write_text(json.dumps(report()))
    out = tmp_path / "layer.png"
    subprocess.run([sys.executable, SCRIPT, str(src), str(out), "--split"], check=True)
    for png in (out, tmp_path / "layer-v4-flash-C4A.png"):
        assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"

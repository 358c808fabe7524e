"""The README's Python examples run as written."""
import os
import re

README = os.path.join(os.path.dirname(__file__), "..", "..", "README.md")


def test_readme_flash_mla_example(capsys):
    text = open(README).read()
    blocks = re.findall(r"```python\n(.*?)```", text, re.S)
    example = next(b for b in blocks if "flash_mla_with_kvcache" in b)
    assert len(example.strip().splitlines()) <= 11
    exec(compile(example, "README.md", "exec"), {})
    assert "torch.Size([2, 1, 64, 512]) torch.Size([2, 64, 1])" in capsys.readouterr().out


def test_readme_layer_example(capsys):
    blocks = re.findall(r"```python\n(.*?)```", open(README).read(), re.S)
    example = next(b for b in blocks if "dsv4attn.Attention(" in b)
    exec(compile(example, "README.md", "exec"), {})
    assert "C4A torch.Size([5, 256]) torch.Size([1, 256])" in capsys.readouterr().out

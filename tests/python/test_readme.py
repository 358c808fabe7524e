"""The README's Python example runs as written."""
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

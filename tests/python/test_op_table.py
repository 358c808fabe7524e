"""The Triton backend's declared rows in the C++ tables (src/ops/backends/triton.cpp, printed by
`dsv4 info --ops`) against the ops the Python registry really registers: each side would fail the
test if it lost a row the other has."""
import os
import pathlib
import subprocess

import pytest

pytest.importorskip("triton", reason="the Triton registry imports triton")

import dsv4attn  # noqa: E402
from dsv4attn.triton import registry  # noqa: E402



def dsv4_cli():
    """The `dsv4` binary of the build that made this package: $DSV4_CLI, else build/dsv4 beside
    build/python/dsv4attn/_C*.so (`make pytest` runs from there)."""
    if os.environ.get("DSV4_CLI"):
        return pathlib.Path(os.environ["DSV4_CLI"])
    return pathlib.Path(dsv4attn._C.__file__).resolve().parents[2] / "dsv4"


def matrix():
    """{op: {backend: mark}} from the op x backend matrix of `dsv4 info --ops`."""
    cli = dsv4_cli()
    if not cli.exists():
        pytest.skip(f"no dsv4 binary at {cli} (set DSV4_CLI)")
    out = subprocess.run([str(cli), "info", "--ops"], check=True, capture_output=True,
                         text=True).stdout
    lines = out.splitlines()
    header = lines[1].split()
    assert header[0] == "op" and header[1:] == ["cpu", "cuda", "triton"], lines[1]
    rows = {}
    for line in lines[2:]:
        if not line.strip():
            break
        words = line.split()
        rows[words[0]] = dict(zip(header[1:], words[1:]))
    return rows


def test_triton_rows_match_the_registry():
    table = matrix()
    declared = {op for op, marks in table.items() if marks["triton"] == "yes"}
    registered = {r.name for r in registry.rows()}
    assert declared == registered
    # Every op of the C++ table runs on the CPU backend.
    assert all(marks["cpu"] == "yes" for marks in table.values())

"""`python -m dsv4attn.triton`: the Triton backend's op table (name, module, what runs it,
summary) — until `dsv4 info --ops` lists backend rows from the C++ op tables (issue 16)."""
import sys

from . import rows


def main() -> int:
    table = rows()
    width = max(len(r.name) for r in table)
    for r in table:
        print(f"{r.name:{width}s}  triton  {r.module:15s} {r.impl:13s} {r.summary}")
    return 0


if __name__ == "__main__":
    sys.exit(main())

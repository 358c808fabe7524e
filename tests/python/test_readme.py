"""The README says what is tested:
- its Python examples are the files of examples/python, and run as written;
- its C++ op example and the CMake consumer are excerpts of examples/cpp (built and run against the
  installed package by scripts/test_package.sh, and in the build tree by ctest);
- every shell command of its "Install and quick start" section is one that `make test` runs:
  a line of scripts/test_package.sh, or `make build` (a prerequisite of `make test`).
"""
import os
import re
import runpy

import pytest

ROOT = os.path.join(os.path.dirname(__file__), "..", "..")
README = open(os.path.join(ROOT, "README.md")).read()


def read(*path):
    return open(os.path.join(ROOT, *path)).read()


def blocks(lang, text=README):
    return re.findall(rf"```{lang}\n(.*?)```", text, re.S)


def section(title):
    start = README.index(f"\n## {title}\n")
    end = README.find("\n## ", start + 1)
    return README[start:end if end >= 0 else None]


def code_of(path):
    """An example's code: the file without its leading docstring."""
    text = read(path)
    return re.sub(r'^""".*?"""\n', "", text, count=1, flags=re.S)


def lines(text):
    return [line.strip() for line in text.splitlines() if line.strip()]


def in_order(needles, haystack):
    it = iter(haystack)
    return all(any(n == h for h in it) for n in needles)


@pytest.mark.parametrize("example, printed", [
    ("flash_mla_decode.py", "torch.Size([2, 1, 64, 512]) torch.Size([2, 64, 1])"),
    ("attention_layer.py", "C4A torch.Size([5, 256]) torch.Size([1, 256])"),
])
def test_python_examples_are_the_readme_and_run(example, printed, capsys):
    code = code_of(os.path.join("examples", "python", example))
    assert code in blocks("python"), f"README has no block equal to examples/python/{example}"
    runpy.run_path(os.path.join(ROOT, "examples", "python", example), run_name="__main__")
    assert printed in capsys.readouterr().out


def test_switching_block_runs():
    block = next(b for b in blocks("python", section("Install and quick start"))
                 if "from dsv4attn import vllm_ops" in b)
    exec(compile(block, "README.md", "exec"), {})


def test_cpp_blocks_are_excerpts_of_examples_cpp():
    cpp = next(b for b in blocks("cpp") if "sparse_prefill(a)" in b)
    assert in_order(lines(cpp), lines(read("examples", "cpp", "sparse_prefill.cpp")))
    cmake = blocks("cmake", section("Install and quick start"))
    assert cmake and all(in_order(lines(b), lines(read("examples", "cpp", "CMakeLists.txt")))
                         for b in cmake)


def test_install_commands_are_run_by_make_test():
    script = lines(read("scripts", "test_package.sh"))
    # The script's own paths for what the README leaves to the reader (build dir, wheel dir).
    script = [s.replace('"$BUILD"', "build").replace('"$tmp/dist"', "dist") for s in script]
    commands = [re.sub(r"\s+#.*", "", c).strip()
                for b in blocks("sh", section("Install and quick start")) for c in lines(b)]
    assert len(commands) >= 10
    for c in commands:
        assert c == "make build" or any(c in s for s in script), \
            f"README command not run by scripts/test_package.sh: {c}"


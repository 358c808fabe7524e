"""Every kernel under src/cuda is launched through launch_kernel() and starts with
grid_dependency_entry() (src/cuda/common/launch.cuh): launches are programmatic dependents, and a
kernel that did not wait first could read its predecessor's output before it is written, or let a
later kernel overtake one it depends on. This checks the sources; tests/cuda/test_launch_cuda.cu
checks the behaviour on a GPU."""
import os
import re

ROOT = os.path.join(os.path.dirname(__file__), "..", "..")
CUDA_SRC = os.path.join(ROOT, "src", "cuda")
ENTRY = "grid_dependency_entry();"


def strip_comments(text):
    text = re.sub(r"/\*.*?\*/", "", text, flags=re.S)
    return re.sub(r"//[^\n]*", "", text)


def violations(name, text):
    """The rule's violations in one source file's text, as messages."""
    found = []
    code = strip_comments(text)
    if "<<<" in code:
        found.append(f"{name}: a <<<...>>> launch (use launch_kernel)")
    for m in re.finditer(r"__global__", code):
        body = code.index("{", m.end())
        first = code[body + 1:].lstrip()
        if not first.startswith(ENTRY):
            signature = " ".join(code[m.start():body].split())
            found.append(f"{name}: {signature[:80]}... does not begin with {ENTRY}")
    return found


def test_the_checker_finds_each_kind_of_violation():
    good = "__global__ void k(int* p) {\n  grid_dependency_entry();\n  *p = 1;\n}\n"
    assert violations("good.cu", good) == []
    late = "__global__ void k(int* p) {\n  if (!p) return;  // grid_dependency_entry();\n  grid_dependency_entry();\n}\n"
    assert len(violations("late.cu", late)) == 1
    missing = "template <int N>\n__global__ void __launch_bounds__(128) k(int* p) { *p = N; }\n"
    assert len(violations("missing.cu", missing)) == 1
    plain = good + "void go(int* p) { k<<<1, 1>>>(p); }\n"
    assert len(violations("plain.cu", plain)) == 1


def test_every_kernel_under_src_cuda_waits_first_and_is_launched_by_launch_kernel():
    found, kernels = [], 0
    for folder, _, files in os.walk(CUDA_SRC):
        for f in files:
            if not f.endswith((".cu", ".cuh")):
                continue
            path = os.path.join(folder, f)
            with open(path, encoding="utf-8") as fh:
                text = fh.read()
            kernels += len(re.findall(r"__global__", strip_comments(text)))
            found += violations(os.path.relpath(path, ROOT), text)
    assert kernels >= 25, f"found only {kernels} kernels: is src/cuda where it was?"
    assert found == [], "\n".join(found)

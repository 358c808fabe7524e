"""scripts/docs_refs.py: --check finds every kind of reference that does not resolve, and --fix
rewrites the old spellings so that --check passes. Run on small trees written here; the repository
itself is checked by the ctest Docs.References."""
import importlib.util
import os
import shutil
import subprocess

import pytest

ROOT = os.path.join(os.path.dirname(__file__), "..", "..")
_spec = importlib.util.spec_from_file_location("docs_refs", os.path.join(ROOT, "scripts", "docs_refs.py"))
docs_refs = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(docs_refs)

SPEC = "# spec\n## 1. Configurations\ntext\n## 2. Layer forward\n### 2.1 Detail\n"


def write(root, files):
    for name, text in files.items():
        path = os.path.join(root, name)
        os.makedirs(os.path.dirname(path), exist_ok=True)
        with open(path, "w", encoding="utf-8") as f:
            f.write(text)


def check(root):
    return docs_refs.Checker(str(root)).check()


def tree(tmp_path, files):
    write(tmp_path, {"docs/spec.md": SPEC, **files})
    return tmp_path


def test_resolving_references_pass(tmp_path):
    root = tree(tmp_path, {
        "docs/notes/decode.md": "# decode\n",
        "bench/results/run.json": "{}",
        "src/a.cpp": "// docs/spec.md §2 and §1; docs/spec.md §2.1 (docs/notes/decode.md, v7).\n"
                     "// bench/results/run.json; bench/results/ holds them.\n"
                     "// docs/spec.md §2 steps 1–2, §1) then §9 outside the parenthesis\n",
        "bench/RESULTS.md": "see [the spec](../docs/spec.md#x) and bench/results/layer-<date>.json\n",
    })
    assert check(root) == []


@pytest.mark.parametrize("line, problem", [
    ("// docs/spec.md §3", "'docs/spec.md' has no section §3"),
    ("// docs/spec.md §2–§4", "'docs/spec.md' has no section §4"),
    ("// (docs/spec.md §2 steps 1–2, §5)", "'docs/spec.md' has no section §5"),
    ("// docs/design.md", "'docs/design.md' does not exist"),
    ("// bench/logs/gone.log.", "'bench/logs/gone.log' does not exist"),
    ("// docs/notes/", "'docs/notes/' does not exist"),
])
def test_dangling_references_fail(tmp_path, line, problem):
    root = tree(tmp_path, {"src/a.cpp": "int x;\n" + line + "\n"})
    assert check(root) == [f"src/a.cpp:2: {problem}"]


def test_markdown_link_is_relative_to_its_file(tmp_path):
    root = tree(tmp_path, {"docs/README.md": "[ok](spec.md) [bad](notes/x.md) [web](https://x.org/a.md)\n"})
    assert check(root) == ["docs/README.md:1: link target 'notes/x.md' does not exist"]


def test_fix_rewrites_old_spellings_then_check_passes(tmp_path, capsys):
    old = ("// SPEC §2 steps 5–6, SPEC §1/§2; the SPEC formula; ../shared/SPEC.md\n"
           "// PERF.md anchors; DESIGN.md; bench/NOTES-decode.md v7; NOTES-decode.md\n"
           "int DSV4_SPEC_X;  // not a reference\n")
    root = tree(tmp_path, {"src/a.cpp": old, "docs/performance.md": "# perf\n",
                           "docs/design.md": "# design\n", "docs/notes/decode.md": "# decode\n"})
    found = check(root)
    assert [p.split(": ", 1)[1].split("'")[1] for p in found] == [
        "SPEC", "SPEC", "SPEC", "../shared/SPEC.md",
        "PERF.md", "DESIGN.md", "bench/NOTES-decode.md", "NOTES-decode.md"], found
    assert all("old spelling" in p for p in found), found
    assert docs_refs.main(["--fix", "--root", str(root)]) == 0
    assert open(root / "src/a.cpp").read() == (
        "// docs/spec.md §2 steps 5–6, docs/spec.md §1/§2; the docs/spec.md formula; docs/spec.md\n"
        "// docs/performance.md anchors; docs/design.md; docs/notes/decode.md v7; docs/notes/decode.md\n"
        "int DSV4_SPEC_X;  // not a reference\n")
    assert "rewrote src/a.cpp" in capsys.readouterr().out
    assert docs_refs.main(["--fix", "--root", str(root)]) == 0  # idempotent
    assert "rewrote" not in capsys.readouterr().out


def test_fix_cannot_resolve_paths_outside_the_repository(tmp_path):
    root = tree(tmp_path, {"README.md": "run ../shared/peers/x.py\n"})
    assert docs_refs.main(["--fix", "--root", str(root)]) == 1
    assert open(root / "README.md").read() == "run ../shared/peers/x.py\n"


@pytest.mark.skipif(shutil.which("git") is None, reason="needs git")
def test_commit_citations_are_checked_against_history(tmp_path):
    git = ["git", "-c", "user.name=t", "-c", "user.email=t@t", "-c", "commit.gpgsign=false"]
    root = tree(tmp_path, {"bench/logs/old.log": "x\n"})
    subprocess.run(git + ["init", "-q"], cwd=root, check=True)
    subprocess.run(git + ["add", "-A"], cwd=root, check=True)
    subprocess.run(git + ["commit", "-qm", "c"], cwd=root, check=True)
    sha = subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=root, check=True,
                         capture_output=True, text=True).stdout.strip()
    subprocess.run(["git", "rm", "-rq", "bench/logs"], cwd=root, check=True)
    write(root, {"bench/RESULTS.md": f"`git show {sha}:bench/logs/old.log`, {sha}:bench/logs/, "
                                     f"{sha}:bench/logs/new.log, 1234567:bench/unknown-commit.log\n"})
    assert check(root) == [f"bench/RESULTS.md:1: '{sha}:bench/logs/new.log' is not in git history"]


def test_markdown_checks_paths_under_every_top_level_folder(tmp_path):
    root = tree(tmp_path, {
        "src/cpu/a.cpp": "// src/cpu/gone.h: code is checked only for documents and results\n",
        "docs/notes/x.md": "src/cpu/a.cpp, src/cpu/*.h, FlashMLA's tests/ref.py; src/cpu/gone.h\n",
    })
    assert check(root) == ["docs/notes/x.md:1: 'src/cpu/gone.h' does not exist"]


@pytest.mark.skipif(shutil.which("git") is None, reason="needs git")
def test_fix_follows_renames_since_a_commit(tmp_path):
    git = ["git", "-c", "user.name=t", "-c", "user.email=t@t", "-c", "commit.gpgsign=false"]
    body = "".join(f"int f{i}() {{ return {i}; }}\n" for i in range(20))  # enough for -M to pair
    root = tree(tmp_path, {"src/cpu/norm_math.h": body, "src/cpu/norm_math.hpp": "other\n",
                           "docs/notes/n.md": "see src/cpu/norm_math.h (and src/cpu/norm_math.hpp)\n",
                           "src/b.cpp": "// shared with src/cpu/norm_math.h.\n"})
    subprocess.run(git + ["init", "-q"], cwd=root, check=True)
    subprocess.run(git + ["add", "-A"], cwd=root, check=True)
    subprocess.run(git + ["commit", "-qm", "c"], cwd=root, check=True)
    os.makedirs(root / "src/math")
    subprocess.run(["git", "mv", "src/cpu/norm_math.h", "src/math/norm.h"], cwd=root, check=True)
    assert check(root) == ["docs/notes/n.md:1: 'src/cpu/norm_math.h' does not exist"]
    assert docs_refs.main(["--fix", "--renames-since", "HEAD", "--root", str(root)]) == 0
    assert open(root / "docs/notes/n.md").read() == "see src/math/norm.h (and src/cpu/norm_math.hpp)\n"
    assert open(root / "src/b.cpp").read() == "// shared with src/math/norm.h.\n"

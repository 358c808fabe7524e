#!/usr/bin/env python3
"""Keeps the repository's references to its own documents resolvable.

Code, tests, tools and prose cite the layer's specification, design and benchmark notes by their
path inside the repository, e.g. "docs/spec.md §6" or "docs/notes/prefill.md". This script finds
every such reference in the files git tracks (plus untracked files it does not ignore) and checks:
  - a path under docs/ or bench/ names a file or folder that exists, and so does, in Markdown, a
    path under any top-level folder (src/, tests/, ...);
  - a "§N" after a docs/ path (up to the next ")" or the end of the line) is a numbered heading
    ("## N. ...") of that file;
  - a relative Markdown link [text](path) in a .md file points at something that exists;
  - "<commit>:<path>" (as in "git show dbbe5ad:bench/logs/x.log") names a file or folder of that
    commit, checked where git has the commit (a clone without that history skips it);
  - no spelling from before the docs moved into the repository is left (the shared spec, design
    and performance files, and the design notes that used to live in bench/).

  scripts/docs_refs.py --check   list what does not resolve; exit status 1 if anything
  scripts/docs_refs.py --fix     rewrite the old spellings into docs/ paths, then --check
  scripts/docs_refs.py --fix --renames-since REV
                                 also rewrite the paths of files git sees renamed since REV
                                 (after a branch that moves files is merged: REV = the merge base)

--fix is idempotent, so it can be rerun after files move or branches merge.
"""
import argparse
import os
import re
import subprocess
import sys

# The old spellings and what they become. The order matters: a path form before the bare name.
LEGACY_REWRITES = [
    (re.compile(r"(?:\.\./shared/|/work/shared/)?SPEC\.md"), "docs/spec.md"),
    (re.compile(r"(?:\.\./shared/|/work/shared/)?PERF\.md"), "docs/performance.md"),
    (re.compile(r"(?:\.\./shared/|/work/shared/)?DESIGN\.md"), "docs/design.md"),
    (re.compile(r"\bSPEC\b"), "docs/spec.md"),
    (re.compile(r"(?:bench/)?\bNOTES-([a-z0-9-]+)\.md"), r"docs/notes/\1.md"),
]
# What --check reports as an old spelling (anything --fix would rewrite, and paths outside the
# repository that --fix cannot know a replacement for).
LEGACY = [pattern for pattern, _ in LEGACY_REWRITES] + [re.compile(r"\.\./shared/|/work/shared/")]

# A path inside the repository, not part of a longer path or URL: docs/… or bench/… in any file,
# and in Markdown a path under any top-level folder. A path followed by "<", "{" or "*" is a
# pattern (bench/results/layer-<date>.json), not a file.
def _paths_under(roots):
    return re.compile(rf"(?<![\w/.:~$-])((?:{roots})/[\w./-]*)(?![\w./<{{*-])")


DOC_PATH = _paths_under("docs|bench")
ANY_PATH = _paths_under("docs|bench|src|include|tools|tests|python|scripts|examples|cmake")
# Files of other repositories that the documents cite by their own path (FlashMLA's tests).
FOREIGN_PATHS = {"tests/ref.py", "tests/lib.py", "tests/quant.py"}
SECTION = re.compile(r"§(\d+(?:\.\d+)*)")
NUMBERED_HEADING = re.compile(r"^#{1,6}\s+(\d+(?:\.\d+)*)\.?\s", re.M)
MD_LINK = re.compile(r"\[[^\]\n]*\]\(([^)\s]+)\)")
# A file as it was at a commit, as git names it ("git show dbbe5ad:bench/logs/x.log"); a name
# followed by "*", "…" or "{" is a pattern and is left alone.
AT_COMMIT = re.compile(r"(?<![\w/])([0-9a-f]{7,40}):((?:[\w.-]+/)+[\w.-]*)(?![\w*{…-])")

# Text files that may cite documents (data files, pictures and archives never do).
TEXT_SUFFIXES = (".md", ".txt", ".cpp", ".h", ".hpp", ".cu", ".cuh", ".cc", ".c", ".py", ".pyi",
                 ".sh", ".cmake", ".in", ".toml", ".cfg", ".yml", ".yaml")
TEXT_NAMES = ("Makefile", "CMakeLists.txt", "run")
# This script and its test spell the old forms on purpose.
SKIP_FILES = ("scripts/docs_refs.py", "tests/python/test_docs_refs.py")
SKIP_DIRS = ("third_party/", ".git/")


def repo_files(root):
    """The files git knows (tracked, or untracked and not ignored); every file where git is absent."""
    try:
        out = subprocess.run(["git", "ls-files", "-z", "--cached", "--others", "--exclude-standard"],
                             cwd=root, capture_output=True, check=True).stdout
        names = sorted({n.decode() for n in out.split(b"\0") if n})
    except (OSError, subprocess.CalledProcessError):
        names = []
        for d, dirs, files in os.walk(root):
            # Not hidden folders (.git, .venv), vendored code or build trees.
            dirs[:] = [x for x in dirs if not x.startswith((".", "build")) and x != "third_party"]
            names += [os.path.relpath(os.path.join(d, f), root) for f in files]
    for name in names:
        name = name.replace(os.sep, "/")
        if name in SKIP_FILES or name.startswith(SKIP_DIRS):
            continue
        if not (name.endswith(TEXT_SUFFIXES) or os.path.basename(name) in TEXT_NAMES):
            continue
        if os.path.isfile(os.path.join(root, name)):
            yield name


def fix_text(text):
    for pattern, replacement in LEGACY_REWRITES:
        text = pattern.sub(replacement, text)
    return text


class Checker:
    def __init__(self, root):
        self.root = root
        self.headings = {}  # docs file → its numbered sections
        self.commits = {}   # commit → whether git knows it (None: no git history here)

    def sections_of(self, path):
        if path not in self.headings:
            with open(os.path.join(self.root, path), encoding="utf-8") as f:
                self.headings[path] = set(NUMBERED_HEADING.findall(f.read()))
        return self.headings[path]

    def in_history(self, commit, path):
        """True / False where git has the commit; None where this tree has no such history."""
        if commit not in self.commits:
            try:
                r = subprocess.run(["git", "cat-file", "-e", commit + "^{commit}"], cwd=self.root,
                                   capture_output=True)
                self.commits[commit] = r.returncode == 0
            except OSError:  # no git on this machine
                self.commits[commit] = False
        if not self.commits[commit]:
            return None
        r = subprocess.run(["git", "cat-file", "-e", f"{commit}:{path}"], cwd=self.root,
                           capture_output=True)
        return r.returncode == 0

    def exists(self, path):
        return os.path.exists(os.path.join(self.root, path))

    def check_line(self, name, line):
        problems = []
        # Old spellings, each span once (the longest of those starting at a place).
        legacy = sorted((m.span() for pattern in LEGACY for m in pattern.finditer(line)),
                        key=lambda span: (span[0], -span[1]))
        reported = []
        for start, end in legacy:
            if reported and start < reported[-1][1]:
                continue
            reported.append((start, end))
            problems.append(f"'{line[start:end]}' is outside the repository or an old spelling"
                            " (--fix rewrites the old spellings)")
        for m in (ANY_PATH if name.endswith(".md") else DOC_PATH).finditer(line):
            if any(start < m.end() and m.start() < end for start, end in reported):
                continue
            path = m.group(1).rstrip(".")
            if path in FOREIGN_PATHS:
                continue
            if not self.exists(path):
                problems.append(f"'{path}' does not exist")
                continue
            if not path.startswith("docs/") or not path.endswith(".md"):
                continue
            # The § numbers that follow, up to the closing parenthesis or the next path.
            tail = line[m.end():]
            stop = min([i for i in (tail.find(")"), tail.find("docs/"), tail.find("bench/"))
                        if i >= 0] + [len(tail)])
            wanted = SECTION.findall(tail[:stop])
            have = self.sections_of(path) if wanted else set()
            problems += [f"'{path}' has no section §{n}" for n in wanted if n not in have]
        if name.endswith(".md"):
            base = os.path.dirname(name)
            for m in MD_LINK.finditer(line):
                target = m.group(1).split("#")[0]
                if not target or re.match(r"[a-z]+:", target):
                    continue
                if not self.exists(os.path.normpath(os.path.join(base, target))):
                    problems.append(f"link target '{m.group(1)}' does not exist")
        for m in AT_COMMIT.finditer(line):
            if self.in_history(m.group(1), m.group(2).rstrip(".").rstrip("/")) is False:
                problems.append(f"'{m.group(1)}:{m.group(2)}' is not in git history")
        return problems

    def check(self):
        problems = []
        for name in repo_files(self.root):
            with open(os.path.join(self.root, name), encoding="utf-8", errors="replace") as f:
                for number, line in enumerate(f, 1):
                    problems += [f"{name}:{number}: {p}" for p in self.check_line(name, line)]
        return problems


def renames_since(root, rev):
    """(old path, new path) of every file git sees renamed between `rev` and the working tree."""
    out = subprocess.run(["git", "diff", "-z", "-M", "--name-status", "--diff-filter=R", rev],
                         cwd=root, capture_output=True, check=True, text=True).stdout.split("\0")
    # Records: "R<score>", old, new.
    return [(out[i + 1], out[i + 2]) for i in range(0, len(out) - 2, 3) if out[i].startswith("R")]


def rename_rewrites(renames):
    return [(re.compile(rf"(?<![\w/.:~$-]){re.escape(old)}(?![\w/-]|\.\w)"), new)
            for old, new in sorted(renames, key=lambda r: -len(r[0]))]


def fix(root, rewrites=()):
    changed = []
    for name in repo_files(root):
        path = os.path.join(root, name)
        with open(path, encoding="utf-8", errors="surrogateescape") as f:
            text = f.read()
        new = fix_text(text)
        for pattern, replacement in rewrites:
            new = pattern.sub(replacement, new)
        if new != text:
            with open(path, "w", encoding="utf-8", errors="surrogateescape") as f:
                f.write(new)
            changed.append(name)
    return changed


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    mode = parser.add_mutually_exclusive_group(required=True)
    mode.add_argument("--check", action="store_true", help="report references that do not resolve")
    mode.add_argument("--fix", action="store_true", help="rewrite old spellings, then check")
    parser.add_argument("--renames-since", metavar="REV",
                        help="with --fix: also rewrite paths of files git sees renamed since REV")
    parser.add_argument("--root", default=os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."),
                        help="the repository (default: the one holding this script)")
    args = parser.parse_args(argv)
    root = os.path.abspath(args.root)
    if args.renames_since and not args.fix:
        parser.error("--renames-since goes with --fix")
    if args.fix:
        rewrites = rename_rewrites(renames_since(root, args.renames_since)) if args.renames_since else ()
        for name in fix(root, rewrites):
            print(f"rewrote {name}")
    problems = Checker(root).check()
    for p in problems:
        print(p)
    if problems:
        print(f"{len(problems)} reference(s) do not resolve", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())

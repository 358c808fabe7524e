#!/usr/bin/env bash
# The packages as users get them (`make test` runs this after ctest and pytest; `make
# package-test` runs it alone). The README's install commands are run here as written there
# (tests/python/test_readme.py checks that each one appears in this file):
#   C++     `cmake --install` of the build into a temporary prefix; examples/cpp, a separate
#           project that calls find_package(dsv4attn), configured, built and run against it from
#           outside the source tree; the same with a shared library (BUILD_SHARED_LIBS=ON, CPU only).
#   Python  in a fresh virtual environment, `pip install .` (the CUDA kernels are in it when nvcc
#           is found, and that is checked), then `pip wheel .` installed into a second fresh
#           environment; in each, the examples of examples/python run from outside the source
#           tree, and the process exits with nothing on stderr.
# Each pip build compiles the library from scratch (scikit-build-core starts a new CMake cache in
# every isolated build environment): the two pip builds are most of this script's time.
# Versions: `dsv4 --version`, the C++ dsv4::version(), dsv4attn.__version__ and the wheel's
# metadata must all be CMakeLists.txt's project version.
#
# The fresh environments get torch (3.5 GB with its CUDA libraries) from the project's virtual
# environment through a .pth file instead of a second download, numpy excepted: that comes from
# PyPI as the package's declared dependency (without it, torch keeps the importing module's
# globals alive past exit and nanobind reports them as leaks; the clean-exit check catches that).
#
# Usage: scripts/test_package.sh BUILD_DIR PROJECT_VENV_PYTHON   (DSV4_CUDA=AUTO|ON|OFF)
set -euo pipefail
SRC=$(cd "$(dirname "$0")/.." && pwd)
BUILD=$(cd "${1:?build directory}" && pwd)
PROJECT_PYTHON=${2:?python of the project venv}
DSV4_CUDA=${DSV4_CUDA:-AUTO}
VERSION=$(sed -n 's/^project(dsv4attn VERSION \([0-9.]*\).*/\1/p' "$SRC/CMakeLists.txt")
tmp=$(mktemp -d "${TMPDIR:-/tmp}/dsv4attn-package.XXXXXX")
trap 'rm -rf "$tmp"' EXIT
export PIP_DISABLE_PIP_VERSION_CHECK=1
step() { echo "== package-test [$((SECONDS / 60))m$((SECONDS % 60))s] $*"; }
fail() { echo "package-test: FAILED: $*" >&2; exit 1; }
expect_line() {  # expect_line WANT CMD...: CMD's output has the line WANT
  local out; out=$("${@:2}") || fail "$*"
  grep -qxF -- "$1" <<<"$out" || fail "$* printed:"$'\n'"$out"$'\n'"expected the line: $1"
}
# The examples, outside the source tree: a user's checkout of them, without the package's sources.
work="$tmp/work"
mkdir -p "$work" && cp -r "$SRC/examples" "$work/"

# ---- C++: the static library as built, then a shared one -----------------------------------
step "cmake --install $BUILD (static library)"
PREFIX="$tmp/prefix"
cmake --install "$BUILD" --prefix "$PREFIX" >/dev/null
for f in include/dsv4/ops.h include/dsv4/version.h lib/libdsv4attn.a bin/dsv4 \
         lib/cmake/dsv4attn/dsv4attnConfig.cmake lib/cmake/dsv4attn/dsv4attnConfigVersion.cmake; do
  [ -e "$PREFIX/$f" ] || fail "not installed: $f"
done
expect_line "dsv4attn $VERSION" "$PREFIX/bin/dsv4" --version

consume() {  # builds and runs examples/cpp against the package in $PREFIX
  step "examples/cpp: find_package(dsv4attn) in $PREFIX"
  (cd "$work" && rm -rf build-example &&
   cmake -S examples/cpp -B build-example -DCMAKE_PREFIX_PATH="$PREFIX" >build-example.log &&
   cmake --build build-example >>build-example.log) || { cat "$work/build-example.log"; fail "examples/cpp build"; }
  grep -q "dsv4attn $VERSION (CUDA backend: " "$work/build-example.log" || fail "find_package version"
  (cd "$work" && build-example/sparse_prefill) | tee "$tmp/sparse_prefill.out"
  grep -qxF "dsv4attn $VERSION (headers $VERSION)" "$tmp/sparse_prefill.out" || fail "dsv4::version()"
}
consume

step "shared library (BUILD_SHARED_LIBS=ON, CPU only): build and install"
cmake -S "$SRC" -B "$tmp/build-shared" -G Ninja -DBUILD_SHARED_LIBS=ON -DDSV4_CUDA=OFF \
  -DDSV4_PYTHON=OFF -DDSV4_BUILD_TESTS=OFF >"$tmp/build-shared.log" &&
  cmake --build "$tmp/build-shared" >>"$tmp/build-shared.log" || { tail -40 "$tmp/build-shared.log"; fail "shared build"; }
PREFIX="$tmp/prefix-shared"
cmake --install "$tmp/build-shared" --prefix "$PREFIX" >/dev/null
[ -e "$PREFIX/lib/libdsv4attn.so" ] && [ ! -e "$PREFIX/lib/libdsv4attn.a" ] || fail "shared install: $(ls "$PREFIX/lib")"
expect_line "dsv4attn $VERSION" "$PREFIX/bin/dsv4" --version
consume

# ---- Python: pip install . ; pip wheel . into another environment -------------------------
# A fresh virtual environment that sees the project venv's packages but numpy (see the top).
project_site="$tmp/project-site"
mkdir "$project_site"
for f in "$("$PROJECT_PYTHON" -c "import sysconfig; print(sysconfig.get_paths()['purelib'])")"/*; do
  case "$(basename "$f")" in numpy|numpy-*|numpy.libs|*.pth) ;; *) ln -s "$f" "$project_site/";; esac
done
fresh_venv() {
  "$PROJECT_PYTHON" -m venv "$1"   # the same Python as the project venv's
  "$1/bin/python" -c "import sysconfig, sys; open(sysconfig.get_paths()['purelib'] + '/project_site.pth', 'w').write(sys.argv[1] + '\n')" "$project_site"
}
want_cuda=False
if [ "$DSV4_CUDA" != OFF ] && { command -v nvcc || [ -x /usr/local/cuda/bin/nvcc ]; } >/dev/null; then
  want_cuda=True
fi
# The installed package, used from outside the source tree: the README's examples, a clean exit,
# versions, and the CUDA kernels when nvcc was there to build them.
check_installed() {
  (cd "$work" &&
   python examples/python/flash_mla_decode.py &&
   python examples/python/attention_layer.py) >"$tmp/examples.out" 2>"$tmp/examples.err" ||
    { cat "$tmp/examples.out" "$tmp/examples.err"; fail "examples/python"; }
  cat "$tmp/examples.out"
  [ ! -s "$tmp/examples.err" ] || { cat "$tmp/examples.err"; fail "examples/python wrote to stderr"; }
  (cd "$work" && python - "$VERSION" "$VIRTUAL_ENV" "$want_cuda" <<'PY') || fail "installed package"
import importlib.metadata, os, sys
import dsv4attn
version, venv, want_cuda = sys.argv[1:]
assert os.path.realpath(dsv4attn.__file__).startswith(os.path.realpath(venv) + os.sep), \
       f"imported {dsv4attn.__file__}, not the package installed in {venv}"
assert dsv4attn.__version__ == importlib.metadata.version("dsv4attn") == version, \
       (dsv4attn.__version__, importlib.metadata.version("dsv4attn"), version)
assert str(dsv4attn.with_cuda) == want_cuda, f"with_cuda {dsv4attn.with_cuda}, expected {want_cuda}"
print(f"dsv4attn {dsv4attn.__version__} from {os.path.dirname(dsv4attn.__file__)}, "
      f"CUDA kernels: {dsv4attn.with_cuda}")
PY
  (cd "$work" && python -m pytest -q -p no:cacheprovider "$SRC/tests/python/test_clean_exit.py") ||
    fail "clean exit"
}

step "fresh venv: pip install ."
fresh_venv "$tmp/venv"
source "$tmp/venv/bin/activate"
cd "$SRC"
if [ "$DSV4_CUDA" = OFF ]; then
  pip install . -C cmake.define.DSV4_CUDA=OFF
else
  pip install .
fi
check_installed

step "pip wheel . ; the wheel into another fresh venv"
cd "$SRC"
if [ "$DSV4_CUDA" = OFF ]; then
  pip wheel . --no-deps -w "$tmp/dist" -C cmake.define.DSV4_CUDA=OFF
else
  pip wheel . --no-deps -w "$tmp/dist"
fi
deactivate
fresh_venv "$tmp/venv-wheel"
source "$tmp/venv-wheel/bin/activate"
pip install "$tmp"/dist/dsv4attn-*.whl
check_installed
deactivate
step "passed"

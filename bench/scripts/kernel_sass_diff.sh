#!/usr/bin/env bash
# Resources and SASS of kernels before and after a change, without a GPU: compiles the given CUDA
# translation units of this tree and of BASE_REV (git archive of its src/ and include/) with the
# exact nvcc command of the configured build (+ -Xptxas -v), then prints per kernel: registers,
# stack and spills (ptxas), instruction count, whether the instruction streams are identical
# (branch targets aside) and the counts of the instructions that matter for these kernels.
#   bench/scripts/kernel_sass_diff.sh main                     # the four sparse attention TUs
#   bench/scripts/kernel_sass_diff.sh main src/cuda/foo/bar.cu
# BUILD (default build) must be configured with CUDA; CUOBJDUMP defaults to cuobjdump on PATH,
# else the one Triton ships in the venv.
set -euo pipefail
base_rev=${1:?usage: kernel_sass_diff.sh BASE_REV [TU.cu ...]}; shift
tus=("$@")
[ ${#tus[@]} -gt 0 ] || tus=(src/cuda/attention/sparse_decode/instantiations/model1_fp8.cu
                           src/cuda/attention/sparse_decode/instantiations/v32_fp8.cu
                           src/cuda/attention/sparse_prefill/instantiations/d512.cu
                           src/cuda/attention/sparse_prefill/instantiations/d576.cu)
root=$(git rev-parse --show-toplevel); build=$(cd "${BUILD:-build}" && pwd)
cuobjdump=${CUOBJDUMP:-$(command -v cuobjdump || ls "$root"/.venv/lib/python3*/site-packages/triton/backends/nvidia/bin/cuobjdump 2>/dev/null | head -1)}
[ -x "$cuobjdump" ] || { echo "no cuobjdump: set CUOBJDUMP" >&2; exit 1; }
work=$(mktemp -d); trap 'rm -rf "$work"' EXIT
mkdir -p "$work/base-src" && git -C "$root" archive "$base_rev" src include | tar -x -C "$work/base-src"
for side in base new; do
  src_root=$root; [ $side = base ] && src_root=$work/base-src
  mkdir -p "$work/$side"
  for tu in "${tus[@]}"; do
    obj=$(ninja -C "$build" -t targets all | grep -o "^[^:]*${tu}\.o" | head -1)
    cmd=$(ninja -C "$build" -t commands "$obj" | tail -1)
    name=$(echo "$tu" | tr / _)
    # Same flags; sources and includes from the side's tree; output and ptxas report into $work.
    cmd=${cmd//-I$root\/src/-I$src_root/src}; cmd=${cmd//-I$root\/include/-I$src_root/include}
    cmd=$(echo "$cmd" | sed -E "s# -MD -MT [^ ]+ -MF [^ ]+##; s# -c [^ ]+ -o [^ ]+# -c $src_root/$tu -o $work/$side/$name.o#")
    (cd "$build" && eval "${cmd#ccache } -Xptxas=-v") >"$work/$side/$name.ptxas.txt" 2>&1
    "$cuobjdump" -sass "$work/$side/$name.o" >"$work/$side/$name.sass"
  done
done
python3 "$root/bench/scripts/sass_stats.py" "$work/base" "$work/new"

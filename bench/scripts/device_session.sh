#!/usr/bin/env bash
# One device call for a development round (logs under $OUT): build the C++ library, GPU tests, CLI
# and Python extension for the device's python3; then the steps named on the command line, in
# order: graphs (the layer graph/residual GPU tests), quick (bench/scripts/layer_quick.py),
# gputests (the whole GPU suite), pytest (the Python tests), run (dsv4 run --backend cuda --check),
# profile (bench/scripts/layer_profile.py with PROFILE_ARGS), ncu (Nsight Compute sections of the
# kernels matching NCU_KERNELS in such a run), cputests (dsv4_tests with CPU_FILTER),
# kernels (the sparse kernels against a base tree's: see kernels_step), flashmla (FlashMLA's
# side_by_side.py from the carried .peers/flashmla, plainly and with side_by_side_idle.py), flashmla-ncu (ncu of its decode kernel and ours), ab (`dsv4 bench` cases against a base's files:
# see ab_step), envab (`dsv4 bench layer` with and without AB_ENV: see envab_step), trace or decode-trace
# (the sparse kernels' per-tile event traces on TRACE_CASES, decode_* or prefill_* bench cases:
# src/cuda/common/kernel_trace.cuh, bench/trace/{decode,prefill}_trace_summary.py). BUILD_TARGETS overrides the
# targets built first (default: dsv4_gpu_tests dsv4 _C). The device returns at most 8 files from its
# $OUT: PACK=FILE (e.g. "$OUT/../r.tgz" with OUT=$OUT/r) packs this session's $OUT into one archive
# at the end and removes the folder, so that every log comes back (a log of this script's own
# output kept inside $OUT is packed as far as it was written).
set -o pipefail
OUT=${OUT:-/tmp/out}; mkdir -p "$OUT"
log() { echo "== $(date +%T) $*"; }
PY=$(command -v python3)
export PYTHONPATH="$PWD/third_party/pylib${PYTHONPATH:+:$PYTHONPATH}"
# FlashMLA's build (~2 min) runs beside ours when a flashmla step is asked for.
FM_BUILD=
if [[ " $* " == *" flashmla "* || " $* " == *" flashmla-ncu "* ]] && [ -f .peers/flashmla/build.sh ]; then
  bash .peers/flashmla/build.sh /tmp/flashmla >"$OUT/flashmla_build.log" 2>&1 &
  FM_BUILD=$!
fi
# FlashMLA built in /tmp/flashmla (the one beside ours, or built now), its log's tail printed.
flashmla_built() {
  if [ -n "$FM_BUILD" ]; then wait "$FM_BUILD"; else bash .peers/flashmla/build.sh /tmp/flashmla >"$OUT/flashmla_build.log" 2>&1; fi
  tail -3 "$OUT/flashmla_build.log"
}
log configure+build
# A kernels step (below) leaves objects of another version in build/ for the folders it swapped;
# it lists them here. This call's fresh copy of the tree can carry older mtimes than those
# objects, so ninja would keep them: touch the listed folders' files to rebuild them from this tree.
if [ -f build/.swapped-sources ]; then
  while read -r d; do [ -e "$d" ] && find "$d" -type f -exec touch {} +; done <build/.swapped-sources
  rm -f build/.swapped-sources
fi
cmake -S . -B build -G Ninja -DDSV4_CUDA=ON -DDSV4_PYTHON=ON -DPython_EXECUTABLE="$PY" >"$OUT/cmake.log" 2>&1 || { tail -30 "$OUT/cmake.log"; exit 1; }
cmake --build build -j16 --target ${BUILD_TARGETS:-dsv4_gpu_tests dsv4 _C} >"$OUT/build.log" 2>&1 || { grep -B5 -A20 -E "error" "$OUT/build.log" | head -80; exit 1; }
nvidia-smi --query-gpu=name,driver_version,clocks.sm,temperature.gpu,power.limit --format=csv,noheader | tee "$OUT/gpu.txt"
export PYTHONPATH="$PWD/build/python:$PYTHONPATH"

# The sparse attention kernels of this tree against a base's (bit-identical outputs, speed), for a
# kernel change that must not change results or lose time. BASE_SRC (default .bench-base) holds
# the base's src/cuda/attention/sparse_prefill and sparse_decode folders (and src/cuda/common, if the
# change touches it), e.g. made locally with
#   rm -rf .bench-base && mkdir .bench-base && git archive main src/cuda/attention src/cuda/common | tar -x -C .bench-base
# and carried to the device (ignored by git). Those folders are swapped into this tree, the base
# binaries built (only what includes them recompiles) and this tree's folders and binaries put
# back (fresh mtimes: the next build recompiles them). KERNEL_VARIANTS (patch files, e.g.
# bench/experiments/*.patch, or a.patch+b.patch for a change written on top of another) adds
# versions: each is applied to this tree alone (patch -p1), built, and reverted, so one call
# measures several prepared changes. Then: the base's (else this tree's)
# sparse GPU tests (GPU_FILTER, default *Sparse*) record their outputs' digests
# (tests/cuda/output_digest.h), every other version's must match them bit for bit (and pass;
# KERNELS_NEW_NUMERICS=1 for a change that reorders arithmetic: pass only); then
# every sparse anchor of `dsv4 bench`
# (prefill *_sink, whose filter also takes *_sink_len; decode; KERNELS_ONLY keeps one kernel's,
# KERNELS_CASES, a regex, a subset) runs with each version's binary back to back, the order
# rotating per case, and a side-by-side table goes to $OUT/kernels_side_by_side.txt (ratios to the
# base, else to this tree).
# A unified diff applied to this tree (-R: reverted), by patch(1), else by `git apply` (which works
# outside a repository too).
apply_patch() {
  if command -v patch >/dev/null; then patch -p1 --forward --silent $2 <"$1"; else git apply $2 "$1"; fi
}
# Whether it applies whole (nothing is changed either way): a patch that fails part-way would
# leave the hunks it did apply in the tree.
patch_applies() {
  if command -v patch >/dev/null; then patch -p1 --forward --silent --dry-run <"$1"; else git apply --check "$1"; fi
}
kernels_step() {
  local base=${BASE_SRC:-.bench-base} attn=src/cuda/attention bins=/tmp/kernels-bins
  rm -rf "$bins" && mkdir -p "$bins" "$OUT/kernels" || return 1
  cp build/dsv4 "$bins/dsv4-new" && cp build/dsv4_gpu_tests "$bins/tests-new" || return 1
  local versions="new" have_base=0
  if [ -d "$base/$attn/sparse_prefill" ] && [ -d "$base/$attn/sparse_decode" ]; then
    log base build of the sparse kernels
    # The kernels' folders, and the shared device helpers (src/cuda/common) when the base has them.
    local dirs="$attn/sparse_prefill $attn/sparse_decode" d keep; keep=$(mktemp -d)
    [ -d "$base/src/cuda/common" ] && dirs="$dirs src/cuda/common"
    printf '%s\n' $dirs >>build/.swapped-sources  # until the next call's build (above)
    for d in $dirs; do mkdir -p "$keep/$d" && cp -r "$d/." "$keep/$d/" && rm -rf "$d" && cp -r "$base/$d" "$d"; done
    if cmake --build build -j16 --target dsv4_gpu_tests dsv4 >"$OUT/build_base.log" 2>&1; then
      cp build/dsv4 "$bins/dsv4-base" && cp build/dsv4_gpu_tests "$bins/tests-base" && have_base=1 &&
        versions="new base"
    else
      grep -B5 -A20 -E "error" "$OUT/build_base.log" | head -60
    fi
    for d in $dirs; do rm -rf "$d" && cp -r "$keep/$d" "$d"; done
    rm -rf "$keep"
  fi
  local patch_file name
  local variant parts applied k
  for variant in ${KERNEL_VARIANTS:-}; do
    # A variant is one patch, or patches joined by '+' applied in that order (a change written on
    # top of another: a.patch+b.patch).
    IFS='+' read -r -a parts <<<"$variant"
    name=""
    for patch_file in "${parts[@]}"; do name="${name:+$name+}$(basename "$patch_file" .patch)"; done
    log "variant build: $name"
    applied=()
    for patch_file in "${parts[@]}"; do
      # The files it touches (its +++ lines): headers under include/, tests and Python too.
      sed -n 's|^+++ b/\([^[:space:]]*\).*|\1|p' "$patch_file" >>build/.swapped-sources
      patch_applies "$patch_file" >>"$OUT/kernels/patch_$name.log" 2>&1 &&
        apply_patch "$patch_file" >>"$OUT/kernels/patch_$name.log" 2>&1 || break
      applied+=("$patch_file")
    done
    if [ ${#applied[@]} = ${#parts[@]} ]; then
      if cmake --build build -j16 --target dsv4_gpu_tests dsv4 >"$OUT/kernels/build_$name.log" 2>&1; then
        cp build/dsv4 "$bins/dsv4-$name" && cp build/dsv4_gpu_tests "$bins/tests-$name" && versions="$versions $name"
      else
        grep -B5 -A20 -E "error" "$OUT/kernels/build_$name.log" | head -40
      fi
    else
      cat "$OUT/kernels/patch_$name.log"
    fi
    for ((k = ${#applied[@]} - 1; k >= 0; k--)); do
      apply_patch "${applied[$k]}" -R || { echo "could not revert $name"; return 1; }
    done
  done
  cp "$bins/dsv4-new" build/dsv4 && cp "$bins/tests-new" build/dsv4_gpu_tests  # for later steps
  # The reference version (the base, else this tree) records its outputs' digests; every other
  # version's outputs must match them bit for bit.
  local filter=${GPU_FILTER:-*Sparse*} digests="$OUT/kernels/digests" ref=new v
  [ $have_base = 1 ] && ref=base
  log "sparse tests of $ref (recording output digests)"
  mkdir -p "$digests"
  DSV4_OUTPUT_DIGESTS_RECORD="$digests" timeout 150 "$bins/tests-$ref" --gtest_filter="$filter" \
    >"$OUT/kernels/tests_$ref.log" 2>&1
  grep -E "^\[  (FAILED|PASSED|SKIPPED) |^\[==========\]" "$OUT/kernels/tests_$ref.log" | tail -5
  # KERNELS_NEW_NUMERICS=1: the change reorders arithmetic (outputs may differ in the last bits),
  # so the other versions' tests only have to pass their own tolerances against the CPU.
  local expect=(DSV4_OUTPUT_DIGESTS_EXPECT="$digests") rule="outputs must match $ref's bit for bit"
  [ -n "${KERNELS_NEW_NUMERICS:-}" ] && expect=() && rule="their own tolerances only"
  for v in $versions; do
    [ "$v" = "$ref" ] && continue
    log "sparse tests of $v ($rule)"
    env "${expect[@]}" timeout 150 "$bins/tests-$v" --gtest_filter="$filter" \
      >"$OUT/kernels/tests_$v.log" 2>&1
    grep -E "^\[  (FAILED|PASSED|SKIPPED) |^\[==========\]|differ from|no recorded" "$OUT/kernels/tests_$v.log" | tail -20
  done
  log "sparse anchors ($versions)"
  local cases i=0 order n
  # KERNELS_ONLY=decode|prefill keeps one kernel's anchors (a change to the other cannot move them).
  # Without KERNELS_CASES, decode's anchors are its s_q 2 cases; with it, any decode case it
  # matches (the s_q 1 small batches are the ones that split and run the combine).
  cases=$("$bins/dsv4-new" bench --list | awk -v only="${KERNELS_ONLY:-}" -v keep="${KERNELS_CASES:-}" \
    '($1 == "prefill" && $2 ~ /_sink$/ || $1 == "decode" && ($2 ~ /_sq2_/ || keep != "")) &&
     (only == "" || $1 == only) && $2 ~ keep {print $2}')
  read -r -a order <<<"$versions"
  n=${#order[@]}
  for c in $cases; do
    local k
    for ((k = 0; k < n; k++)); do  # version (i + k) mod n: each version leads in turn
      v=${order[$(((i + k) % n))]}
      timeout 60 "$bins/dsv4-$v" bench --filter "$c" --json "$OUT/kernels/bench__${v}__$i.json" 2>&1 |
        grep -E "^(prefill|decode)_" | sed "s/^/$v  /"
    done
    i=$((i + 1))
  done >"$OUT/kernels/bench.log"
  python3 - "$OUT/kernels" "$versions" <<'PY' | tee "$OUT/kernels_side_by_side.txt"
import glob, json, os, sys
versions = sys.argv[2].split()
ref = "base" if "base" in versions else "new"
runs = {v: {} for v in versions}
for path in glob.glob(os.path.join(sys.argv[1], "bench__*.json")):
    v = os.path.basename(path).split("__")[1]
    for r in json.load(open(path))["results"]:
        runs[v][r["name"]] = r["median_us"]
others = [v for v in versions if v != ref]
print(f"{'case':48} {ref + ' us':>9} " + " ".join(f"{v[:22] + ' us':>25} {'/' + ref:>7}" for v in others))
for name, r in runs[ref].items():
    cells = []
    for v in others:
        us = runs[v].get(name)
        cells.append(f"{us:25.1f} {us / r:7.3f}" if us else f"{'-':>25} {'-':>7}")
    print(f"{name:48} {r:9.1f} " + " ".join(cells))
PY
}
# This tree's `dsv4 bench --filter F` cases (F in the space-separated AB_FILTER) against a base's, for a kernel change
# outside the sparse kernels: every file under BASE_SRC (default .bench-base, a mirror of repo
# paths, e.g. `git show main:src/x.cu > .bench-base/src/x.cu`) replaces this tree's for the base
# build of dsv4, then this tree's files come back. AB_REPS rounds, the order alternating per round;
# the medians of both go to $OUT/ab.txt.
ab_step() {
  local base=${BASE_SRC:-.bench-base} bins=/tmp/ab-bins keep
  rm -rf "$bins" && mkdir -p "$bins" && cp build/dsv4 "$bins/dsv4-new" || return 1
  keep=$(mktemp -d)
  (cd "$base" && find . -type f) | while read -r f; do
    mkdir -p "$keep/$(dirname "$f")" && cp "$f" "$keep/$f" && cp "$base/$f" "$f"
  done
  log base build of dsv4
  if cmake --build build -j16 --target dsv4 >"$OUT/build_base.log" 2>&1; then cp build/dsv4 "$bins/dsv4-base"
  else grep -B5 -A20 -E "error" "$OUT/build_base.log" | head -40; fi
  rm -f "$OUT/build_base.log"
  (cd "$keep" && find . -type f) | while read -r f; do cp "$keep/$f" "$f"; done
  rm -rf "$keep"
  # Rebuild this tree's targets now: the restored files are newer than the base's objects here,
  # but a later call on this warm machine copies them in with their older local times, and ninja
  # would keep (and link) the base's objects.
  log rebuild of this tree
  cmake --build build -j16 --target ${BUILD_TARGETS:-dsv4_gpu_tests dsv4 _C} >/dev/null 2>&1 || return 1
  for i in $(seq 1 "${AB_REPS:-2}"); do
    local order="new base"
    [ $((i % 2)) = 0 ] && order="base new"
    for v in $order; do
      [ -x "$bins/dsv4-$v" ] || continue
      local k=0 f
      for f in $AB_FILTER; do  # space-separated substrings, one bench run each
        timeout 120 "$bins/dsv4-$v" bench --filter "$f" --json "$bins/bench-$v-$i-$k.json" >/dev/null 2>&1
        k=$((k + 1))
      done
    done
  done
  # AB_LAYER_ARGS: also `dsv4 bench layer` cases, both binaries, the order alternating per round.
  if [ -n "${AB_LAYER_ARGS:-}" ]; then
    for i in $(seq 1 "${AB_REPS:-2}"); do
      local order="new base"
      [ $((i % 2)) = 0 ] && order="base new"
      for v in $order; do
        [ -x "$bins/dsv4-$v" ] || continue
        timeout 200 "$bins/dsv4-$v" bench layer $AB_LAYER_ARGS --json "$bins/layer-$v-$i.json" >/dev/null 2>&1 ||
          echo "$v $i: bench layer failed"
      done
    done
    # Per case and binary: each round's wall and (where reported) replayed-graph GPU µs.
    python3 - "$bins" <<'PY' | tee "$OUT/ab_layer.txt"
import glob, json, os, sys
rows = {}
for path in sorted(glob.glob(os.path.join(sys.argv[1], "layer-*.json"))):
    v = os.path.basename(path).split("-")[1]
    for c in json.load(open(path))["cases"]:
        key = (c["kind"], c["case"])
        rows.setdefault(key, {}).setdefault(v, []).append(
            f"{c['wall_us']:.1f}/{c.get('graph_gpu_us', 0):.1f}/{c.get('before_launch_us', 0):.1f}")
print("wall / graph GPU / host before the first graph part, µs, per round")
for (kind, case), by in rows.items():
    print(f"{kind:6} {case:14} new {' '.join(by.get('new', []))}   base {' '.join(by.get('base', []))}")
PY
  fi
  python3 - "$bins" <<'PY' | tee "$OUT/ab.txt"
import glob, json, os, statistics, sys
runs = {"new": {}, "base": {}}
for path in sorted(glob.glob(os.path.join(sys.argv[1], "bench-*.json"))):
    v = os.path.basename(path).split("-")[1]
    for r in json.load(open(path))["results"]:
        runs[v].setdefault(r["name"], []).append(r["median_us"])
print(f"{'case':48} {'new us':>9} {'base us':>9} {'new/base':>9}")
for name, us in runs["new"].items():
    n, b = statistics.median(us), runs["base"].get(name)
    b = statistics.median(b) if b else None
    print(f"{name:48} {n:9.1f} " + (f"{b:9.1f} {n / b:9.3f}" if b else f"{'-':>9} {'-':>9}"))
PY
}
# `dsv4 bench layer $AB_LAYER_ARGS` of this build with and without the environment AB_ENV (e.g.
# DSV4_PDL=0: one binary, a runtime switch), AB_REPS rounds, the order alternating per round; per
# case the median wall and GPU µs of both go to $OUT/envab.txt, the JSON reports to $OUT/envab/.
envab_step() {
  mkdir -p "$OUT/envab"
  for i in $(seq 1 "${AB_REPS:-2}"); do
    local order="new base"
    [ $((i % 2)) = 0 ] && order="base new"
    for v in $order; do
      local envs=()
      [ $v = base ] && envs=($AB_ENV)
      env "${envs[@]}" timeout "${LAYER_TIMEOUT:-300}" ./build/dsv4 bench layer $AB_LAYER_ARGS \
        --json "$OUT/envab/layer-$v-$i.json" >"$OUT/envab/layer-$v-$i.log" 2>&1 || tail -5 "$OUT/envab/layer-$v-$i.log"
    done
  done
  python3 - "$OUT/envab" "${AB_ENV}" <<'PY' | tee "$OUT/envab.txt"
import glob, json, os, statistics, sys
runs = {}
for path in sorted(glob.glob(os.path.join(sys.argv[1], "layer-*.json"))):
    v = os.path.basename(path).split("-")[1]
    for c in json.load(open(path))["cases"]:
        key = (c["model"], c["kind"], c["phase"], c["requests"], c["tokens"])
        runs.setdefault(key, {}).setdefault(v, []).append((c["wall_us"], c["gpu_us"], c["floor_us"]))
print(f"base = with {sys.argv[2]}; µs medians over rounds")
print(f"{'case':40} {'wall new':>9} {'wall base':>9} {'ratio':>6} {'gpu new':>9} {'gpu base':>9} {'ratio':>6} {'floor':>7}")
for key, by in runs.items():
    med = {v: [statistics.median(x[k] for x in r) for k in range(3)] for v, r in by.items()}
    n, b = med.get("new"), med.get("base")
    if not n or not b:
        continue
    name = "{} {} {} {}x{}".format(*key)
    print(f"{name:40} {n[0]:9.1f} {b[0]:9.1f} {n[0] / b[0]:6.3f} {n[1]:9.1f} {b[1]:9.1f} {n[1] / b[1]:6.3f} {n[2]:7.1f}")
PY
}
for step in "$@"; do
  case "$step" in
    graphs)
      log graph tests
      timeout 240 ./build/dsv4_gpu_tests --gtest_filter="${GPU_FILTER:-*Graph*:*CudaLayerTest*}" 2>&1 | tee "$OUT/graph_tests.log" |
        grep -E "^\[  (FAILED|PASSED|SKIPPED) |^\[==========\]|median|Failure|error" | tail -30 ;;
    quick)
      log layer quick timing
      timeout 300 $PY bench/scripts/layer_quick.py "${QUICK_ARGS[@]}" 2>&1 | tee "$OUT/layer_quick.log" | tail -12 ;;
    gputests)
      log all gpu tests
      timeout 300 ./build/dsv4_gpu_tests 2>&1 | tee "$OUT/gpu_tests.log" |
        grep -E "^\[  (FAILED|PASSED|SKIPPED) |^\[==========\]" | tail -12 ;;
    pytest)
      log python tests
      timeout 300 $PY -m pytest -q -x ${PYTEST_ARGS:-tests/python} 2>&1 | tee "$OUT/pytest.log" | tail -15 ;;
    layer)
      log dsv4 bench layer
      timeout "${LAYER_TIMEOUT:-300}" ./build/dsv4 bench layer ${LAYER_ARGS:---model v4-flash} --json "$OUT/layer.json" 2>&1 |
        tee "$OUT/layer.log" | tail -40 ;;
    serve)
      log dsv4 run throughput
      timeout 300 ./build/dsv4 run --backend cuda --model v4-flash --layers 0,2,3 --requests 256 \
        --prompt-len 512 --decode-steps 64 --chunk 8192 --json "$OUT/run.json" 2>&1 | tee "$OUT/serve.log" | tail -14 ;;
    profile)
      log per-kernel profile of a layer step
      timeout 300 $PY bench/scripts/layer_profile.py ${PROFILE_ARGS:---layer 2 --requests 128 --graphs 1} 2>&1 |
        tee "$OUT/profile.log" | tail -60 ;;
    ncu)
      # Nsight Compute sections of the first launch of each kernel named in NCU_KERNELS (regexes,
      # space-separated) in a layer_profile.py run (NCU_PROFILE_ARGS): a memory-bound kernel's why.
      for k in ${NCU_KERNELS:-inv_rope}; do
        log "ncu: $k"
        # NCU_CMD replaces the profiled program (e.g. a `dsv4 bench layer` case), NCU_SKIP skips
        # that many matching launches first (a later, longer-context step).
        timeout 300 ncu --kernel-name "regex:$k" --launch-skip "${NCU_SKIP:-0}" --launch-count 1 \
          --section SpeedOfLight --section MemoryWorkloadAnalysis --section Occupancy --section LaunchStats \
          --section WarpStateStats --section SchedulerStats --section ComputeWorkloadAnalysis \
          ${NCU_CMD:-$PY bench/scripts/layer_profile.py ${NCU_PROFILE_ARGS:---layer 2 --requests 128 --context 256}} \
          >"$OUT/ncu-$k.log" 2>&1
        grep -E "^  [a-zA-Z_].*\(|Duration|Memory Throughput|DRAM Throughput|Compute \(SM\) Throughput|Achieved Occupancy|Theoretical Occupancy|Registers Per|Block Limit|Warp Cycles Per Issued|Issued Warp|No Eligible|L1/TEX Hit|L2 Hit|Mem Busy|Max Bandwidth|Grid Size|Block Size" \
          "$OUT/ncu-$k.log" | head -40
      done ;;
    cputests)
      log "CPU-suite tests (dsv4_tests, with the GPU visible: ${CPU_FILTER:-*})"
      timeout 300 ./build/dsv4_tests --gtest_filter="${CPU_FILTER:-*}" 2>&1 | tee "$OUT/cpu_tests.log" |
        grep -E "^\[  (FAILED|PASSED|SKIPPED) |^\[==========\]|Failure" | tail -12 ;;
    triton)
      log triton bench
      timeout "${TRITON_TIMEOUT:-120}" $PY bench/scripts/bench_triton.py ${TRITON_ARGS:-} --json "$OUT/triton.json" 2>&1 |
        tee "$OUT/triton.log" | tail -40 ;;
    kernels)
      kernels_step ;;
    ab)
      ab_step ;;
    envab)
      envab_step ;;
    flashmla)
      # FlashMLA beside us on its own inputs (docs/performance.md): its measurement-only snapshot
      # (build.sh, side_by_side.py, sources) is copied into the ignored .peers/flashmla and
      # carried; built here (~2 min).
      log FlashMLA build
      flashmla_built
      log FlashMLA side by side
      PYTHONPATH="/tmp/flashmla:/tmp/flashmla/tests:$PYTHONPATH" timeout "${SBS_TIMEOUT:-420}" \
        $PY .peers/flashmla/side_by_side.py ${SBS_MODES:-decode prefill} --json "$OUT/side_by_side.json" 2>&1 |
        tee "$OUT/side_by_side.log" | grep -E "speed|SUMMARY|Error" | cut -c1-260
      # The same with the GPU idle before each implementation's timing (side_by_side_idle.py: the
      # plain harness times ours right after FlashMLA, on a board at its power cap).
      log FlashMLA side by side, idle before each implementation
      PYTHONPATH="/tmp/flashmla:/tmp/flashmla/tests:$PYTHONPATH" timeout "${SBS_TIMEOUT:-420}" \
        $PY bench/scripts/side_by_side_idle.py ${SBS_MODES:-decode prefill} --json "$OUT/side_by_side_idle.json" 2>&1 |
        tee "$OUT/side_by_side_idle.log" | grep -E "speed|SUMMARY|Error" | cut -c1-260 ;;
    flashmla-ncu)
      # Nsight Compute (--set full) on FlashMLA's decode or prefill kernel and ours, same inputs,
      # one process (NCU_CASES of bench/scripts/ncu_side_by_side.py, e.g. peak64 or prefill_v32):
      # the speed-of-light and stall summary of each, and the 40 instructions with the most stall
      # samples per kernel. NCU_REGEX replaces the kernels' name regex, e.g. with
      # "fp8_sparse_kernel|sparse_decode_kernel|combine_kernel" for the split decode's combines.
      flashmla_built
      for c in ${NCU_CASES:-peak64 peak128}; do
        log "ncu: FlashMLA and ours, $c"
        PYTHONPATH="/tmp/flashmla:/tmp/flashmla/tests:$PYTHONPATH" timeout 400 ncu \
          --kernel-name "regex:${NCU_REGEX:-fp8_sparse_kernel|sparse_decode_kernel|sparse_attn_fwd_kernel|sparse_prefill_kernel}" --set full --import-source no \
          -o "/tmp/ncu_$c" -f $PY bench/scripts/ncu_side_by_side.py "$c" >"$OUT/ncu_run_$c.log" 2>&1 ||
          tail -20 "$OUT/ncu_run_$c.log"
        ncu --import "/tmp/ncu_$c.ncu-rep" --page details >"$OUT/ncu_$c.txt" 2>&1
        ncu --import "/tmp/ncu_$c.ncu-rep" --page source --csv --print-source sass >"/tmp/ncu_sass_$c.csv" 2>&1 &&
          $PY bench/scripts/ncu_sass_top.py "/tmp/ncu_sass_$c.csv" >>"$OUT/ncu_$c.txt"
        grep -E "^  [a-zA-Z_].*\(|Duration|DRAM Throughput|L2 Hit Rate|Issue Slots Busy|No Eligible|Warp Cycles Per Issued|Est. Speedup|bank" \
          "$OUT/ncu_$c.txt" | cut -c1-160 | head -60
      done ;;
    decode-trace|trace)
      # A second build with -DDSV4_KERNEL_TRACE (its kernels record clock64 events of the grid's
      # first CTA pair and dump them after each launch; the default build's SASS is unchanged), then
      # each `dsv4 bench` case of TRACE_CASES (substrings naming one case each) under it, the last
      # launch's trace summarised.
      log "trace build (-DDSV4_KERNEL_TRACE)"
      cmake -S . -B build-trace -G Ninja -DDSV4_CUDA=ON -DDSV4_PYTHON=OFF -DCMAKE_CUDA_FLAGS=-DDSV4_KERNEL_TRACE \
        >"$OUT/cmake_trace.log" 2>&1 && cmake --build build-trace -j16 --target dsv4 >"$OUT/build_trace.log" 2>&1 ||
        { grep -B5 -A20 -E "error" "$OUT/build_trace.log" | head -60; continue; }
      for c in ${TRACE_CASES:-decode_pro_b128_h128_sq2_128+1024_blk2 decode_flash_b256_h64 decode_v32_b128}; do
        log "kernel trace: $c"
        t=${c%\$}  # a filter ending in '$' names one case exactly (dsv4 bench --help)
        DSV4_KERNEL_TRACE="$OUT/trace_$t.txt" timeout 120 ./build-trace/dsv4 bench --filter "$c" 2>&1 |
          grep -E "^(decode|prefill)_"
        summary=bench/trace/decode_trace_summary.py
        case $c in prefill_*) summary=bench/trace/prefill_trace_summary.py ;; esac
        $PY $summary "$OUT/trace_$t.txt" | tee "$OUT/trace_$t.summary.txt"
      done ;;
    run)
      log dsv4 run on the GPU
      timeout 200 ./build/dsv4 run --backend cuda --model v4-flash --layers 0,2,3 --requests 4 \
        --prompt-len 160,256,192,128 --decode-steps 8 --chunk 256 --check 2>&1 | tee "$OUT/run_cuda.log" | tail -14 ;;
  esac
done
log done
if [ -n "${PACK:-}" ]; then
  tar czf "$PACK" -C "$(dirname "$OUT")" "$(basename "$OUT")" && rm -rf "$OUT"
fi

#!/usr/bin/env bash
# One device call of the release check (logs under $OUT):
#   bench/device_check.sh test   build; the main job on the GPU (--check); GPU tests (CPU-vs-CUDA
#                                included)
#   bench/device_check.sh sanitize  compute-sanitizer memcheck (whole GPU suite) and racecheck
#                                (attention kernels, then the whole layer); `memcheck`,
#                                `racecheck` and `racecheck-layer` run one part each
#   bench/device_check.sh memcheck-full / racecheck-full   the whole GPU test binary, nothing
#                                filtered out (racecheck-full: ~6 min on the H100; all its hazards
#                                listed by kernel function and by test)
#   bench/device_check.sh bench  build (reused when warm); ceilings; `dsv4 bench` (all docs/performance.md cases)
#   bench/device_check.sh layer  build (reused when warm); `dsv4 bench layer` (issue 14 item 7: one
#                                layer of each kind, V4-Flash and V4-Pro, against its floor; ~2-4
#                                min); LAYER_ARGS="--model v4-flash ..." narrows it; the picture is
#                                drawn here only where matplotlib exists (else: bench/plot_layer.py)
#   bench/device_check.sh python the extension against the device's python3/torch: library and
#                                import-order probes (issue 5's crash at import), then the Python
#                                tests (CUDA variants included)
#   bench/device_check.sh tp     multi-GPU kinds (issue 18): build with NCCL (required); the
#                                tensor-parallel GPU tests (tp 2/4/8, skipped above the GPUs
#                                visible); `dsv4 run --tp N --backend cuda --check`; `dsv4 bench
#                                layer --tp N` for N = 1, 2, 4, 8 up to the GPUs visible (the
#                                scaling for bench/RESULTS.md); the torchrun Python check (2 GPUs).
#                                NVLink multicast stays off (NCCL_NVLS_ENABLE=0). TP_PARTS picks
#                                parts (default "tests run bench python"), to split it over calls.
set -o pipefail
OUT=${OUT:-/tmp/out}; mkdir -p "$OUT"
MODES=" ${*:-test} "   # several modes in one call: `device_check.sh test python`
has() { [[ "$MODES" == *" $1 "* ]]; }
if has sanitize; then MODES="$MODES memcheck racecheck racecheck-layer "; fi
log() { echo "== $(date +%T) $*"; }
log configure+build
# tp: NCCL must be found: the toolkit's or /usr/local's, else the nvidia-nccl wheel torch uses
# (asked of python3 itself: its site directory need not sit beside the interpreter).
NCCL_ARGS=()
if has tp; then
  NCCL_ARGS=(-DDSV4_NCCL=ON)
  NCCL_WHEEL=$(python3 -c "import nvidia.nccl as n; print(list(n.__path__)[0])" 2>/dev/null)
  SYSTEM_NCCL=; for h in /usr/local/cuda/include/nccl.h /usr/include/nccl.h /usr/local/include/nccl.h; do
    [ -e "$h" ] && SYSTEM_NCCL=$h; done
  if [ -z "$SYSTEM_NCCL" ] && [ -e "$NCCL_WHEEL/include/nccl.h" ]; then
    NCCL_ARGS+=(-DDSV4_NCCL_INCLUDE_DIR="$NCCL_WHEEL/include" -DDSV4_NCCL_LIBRARY="$NCCL_WHEEL/lib/libnccl.so.2")
  fi
fi
cmake -S . -B build -G Ninja -DDSV4_CUDA=ON -DDSV4_PYTHON=OFF "${NCCL_ARGS[@]}" >"$OUT/cmake.log" 2>&1 || { tail -30 "$OUT/cmake.log"; exit 1; }
cmake --build build -j16 --target dsv4_gpu_tests dsv4 >"$OUT/build.log" 2>&1 || { grep -B5 -A20 error "$OUT/build.log" | head -80; exit 1; }
nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.max.sm,temperature.gpu --format=csv,noheader | tee "$OUT/gpu.txt"
git rev-parse --short HEAD 2>/dev/null | tee "$OUT/commit.txt"
if has test; then
  log main job on the GPU
  timeout 120 ./build/dsv4 run --backend cuda --model v4-flash --layers 0,2,3 --requests 4 \
    --prompt-len 160,256,192,128 --decode-steps 8 --chunk 256 --check 2>&1 | tee "$OUT/run_cuda.log" | tail -12
  log gpu tests
  timeout 200 ./build/dsv4_gpu_tests 2>&1 | tee "$OUT/gpu_tests.log" | grep -E "^\[  (FAILED|PASSED|SKIPPED) |^\[==========\]" | tail -8
fi
if has bench; then
  log ceilings
  python3 - <<'PY' 2>&1 | tee "$OUT/ceilings.txt"
import torch
def med(f, n=20):
    for _ in range(3): f()
    ts = []
    for _ in range(n):
        s, e = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        s.record(); f(); e.record(); torch.cuda.synchronize(); ts.append(s.elapsed_time(e))
    return sorted(ts)[n // 2] / 1e3
a = torch.randn(8192, 8192, device="cuda", dtype=torch.bfloat16); b = torch.randn_like(a)
t = med(lambda: a @ b); print(f"bf16 matmul 8192^3: {2 * 8192**3 / t / 1e12:.0f} TFLOP/s")
x = torch.empty(1 << 29, device="cuda", dtype=torch.int16).random_(); y = torch.empty_like(x)
t = med(lambda: y.copy_(x)); print(f"D2D copy 1 GiB: {2 * x.numel() * 2 / t / 1e9:.0f} GB/s (read + write)")
PY
  log bench
  # SM clock, power and clock-event flags every 20 ms beside the sweep (0x04: power cap), tied to
  # the cases' run windows by bench/trace/clocks_per_case.py.
  echo "unix_ms_at_sampler_start $(date +%s%3N) local $(date '+%Y/%m/%d %H:%M:%S.%3N')" > "$OUT/clocks.csv"
  nvidia-smi --query-gpu=timestamp,clocks.sm,clocks.mem,power.draw,temperature.gpu,clocks_event_reasons.active \
    --format=csv,noheader -lms 20 >> "$OUT/clocks.csv" 2>&1 &
  smi=$!
  timeout 420 ./build/dsv4 bench --json "$OUT/bench.json" 2>&1 | tee "$OUT/bench.log" | tail -45
  kill $smi; gzip -f "$OUT/clocks.csv"
  python3 bench/trace/clocks_per_case.py "$OUT/bench.json" "$OUT/clocks.csv.gz" > "$OUT/clocks_per_case.txt"
fi
if has layer; then
  log bench layer
  # The report is rewritten after every case, so a run cut short keeps what it measured.
  timeout 540 ./build/dsv4 bench layer ${LAYER_ARGS:-} --json "$OUT/layer.json" --plot "$OUT/layer.png" 2>&1 |
    tee "$OUT/bench_layer.log" | grep -E "^(v4|tiny|  wall|ceil|  +(FP8|bf16|copy)|[0-9]+ cases|wrote)|error|WARNING" | head -120
fi
if has python; then
  log python extension
  PY=$(command -v python3)
  { $PY -c "import sys, torch; print(sys.version); print('torch', torch.__version__, torch.version.cuda)"
    g++ --version | head -1; ldd --version | head -1; } 2>&1 | tee "$OUT/python_env.txt"
  # nanobind: the copy scripts/stage_device_deps.sh put in third_party/pylib (no registry there).
  export PYTHONPATH="$PWD/third_party/pylib${PYTHONPATH:+:$PYTHONPATH}"
  cmake -S . -B build -DDSV4_PYTHON=ON -DPython_EXECUTABLE="$PY" >>"$OUT/cmake.log" 2>&1 &&
    cmake --build build -j16 --target _C >"$OUT/build_py.log" 2>&1 || { tail -30 "$OUT/build_py.log"; exit 1; }
  ldd build/python/dsv4attn/_C*.so | tee "$OUT/python_ldd.txt"
  # Each probe in its own process, with Python's fault handler: which order of imports crashes.
  for probe in "import torch; import dsv4attn._C" "import dsv4attn" \
               "import dsv4attn._C, torch; from dsv4attn import Attention; print(Attention)" \
               "import dsv4attn; a = dsv4attn.Attention('tiny', 1, device='cuda'); print(a)"; do
    echo "-- $probe"
    PYTHONPATH=build/python:$PYTHONPATH timeout 60 $PY -X faulthandler -c "$probe" 2>&1 | tail -15
    echo "rc=$?"
  done 2>&1 | tee "$OUT/python_probes.txt"
  LD_DEBUG=libs PYTHONPATH=build/python:$PYTHONPATH timeout 60 $PY -c "import dsv4attn" 2>&1 |
    grep -E "libgomp|libcudart|libstdc" | grep -E "calling init|find library" | head -40 > "$OUT/python_ld_debug.txt"
  log python tests
  PYTHONPATH=build/python:$PYTHONPATH timeout 300 $PY -m pytest -q tests/python 2>&1 | tee "$OUT/pytest.log" | tail -15
fi
if has tp; then
  export NCCL_NVLS_ENABLE=0
  GPUS=$(nvidia-smi -L | wc -l)
  TP_PARTS=" ${TP_PARTS:-tests run bench python} "
  tp_part() { [[ "$TP_PARTS" == *" $1 "* ]]; }
  if tp_part tests; then
    log "tensor parallelism on $GPUS GPU(s): GPU tests"
    timeout 300 ./build/dsv4_gpu_tests --gtest_filter='*TensorParallel*' 2>&1 | tee "$OUT/tp_tests.log" |
      grep -E "worst token error|max rel err|^\[  (FAILED|PASSED|SKIPPED) |^\[==========\]" | tail -40
  fi
  for N in 1 2 4 8; do
    tp_part run && [ "$N" -le "$GPUS" ] || continue
    log "dsv4 run --tp $N --backend cuda --check"
    timeout 180 ./build/dsv4 run --backend cuda --tp $N --model v4-flash --layers 0,2,3 --requests 4 \
      --prompt-len 160,256,192,128 --decode-steps 8 --chunk 256 --check --json "$OUT/run_tp$N.json" 2>&1 |
      tee "$OUT/run_tp$N.log" | tail -12
  done
  for N in 1 2 4 8; do
    tp_part bench && [ "$N" -le "$GPUS" ] || continue
    log "dsv4 bench layer --tp $N"
    # Narrower than `layer` by default (four of these fit one call); LAYER_ARGS replaces it.
    timeout 150 ./build/dsv4 bench layer --tp $N ${LAYER_ARGS:---model v4-flash --decode-requests 1,32,128 --mtp-requests 0 --cooldown-ms 300} \
      --json "$OUT/layer_tp$N.json" 2>&1 | tee "$OUT/bench_layer_tp$N.log" |
      grep -E "^(v4|tp |  wall|[0-9]+ cases|wrote)|tp_allreduce|error|WARNING" | head -80
  done
  if tp_part python && [ "$GPUS" -ge 2 ] && python3 -c "import torch" 2>/dev/null; then
    log "python: torchrun tensor-parallel check"
    PY=$(command -v python3)
    export PYTHONPATH="$PWD/third_party/pylib${PYTHONPATH:+:$PYTHONPATH}"
    cmake -S . -B build -DDSV4_PYTHON=ON -DPython_EXECUTABLE="$PY" >>"$OUT/cmake.log" 2>&1 &&
      cmake --build build -j16 --target _C >"$OUT/build_py.log" 2>&1 || { tail -30 "$OUT/build_py.log"; exit 1; }
    PYTHONPATH=build/python:$PYTHONPATH timeout 400 $PY -m pytest -q -rs tests/python/test_tensor_parallel.py \
      2>&1 | tee "$OUT/pytest_tp.log" | tail -15
  fi
fi
if has memcheck; then
  log memcheck
  timeout 170 compute-sanitizer --tool memcheck --print-limit 10 ./build/dsv4_gpu_tests \
    --gtest_filter='-*BitIdentical*:*ManyItems*' >"$OUT/memcheck.log" 2>&1
  echo "memcheck rc=$?"; grep -E "ERROR SUMMARY|^\[  PASSED|^\[  FAILED" "$OUT/memcheck.log" | tail -4
fi
if has racecheck; then
  log racecheck
  F='*Edge*:*Combine*:*CpuVsCuda*:*cluster*:Shapes/SparsePrefillGrid.*H64_d512_topk512*:*H128_d576_topk64*:*v32*h128*'
  timeout 150 compute-sanitizer --tool racecheck --racecheck-report all ./build/dsv4_gpu_tests \
    --gtest_filter="$F-*BitIdentical*" >"$OUT/racecheck.log" 2>&1
  echo "racecheck rc=$?"; grep -E "RACECHECK SUMMARY|ERROR SUMMARY|^\[  PASSED|^\[  FAILED" "$OUT/racecheck.log" | tail -4
fi
if has racecheck-layer; then
  # The whole layer on the GPU (every op's kernels, cuBLASLt's too, at the tiny config's padded
  # 16 heads): which functions the hazards are reported in.
  log racecheck layer
  timeout 150 compute-sanitizer --tool racecheck --racecheck-report hazard --print-limit 200 \
    ./build/dsv4_gpu_tests --gtest_filter='*CudaLayerTest.MatchesCpu*/SWA:*CudaLayerTest.MatchesCpu*/C4A' \
    >"$OUT/racecheck_layer.log" 2>&1
  echo "racecheck layer rc=$?"; grep -E "RACECHECK SUMMARY" "$OUT/racecheck_layer.log"
  # (--kernel-name-exclude kns=nvjet, to check everything but cuBLASLt, made compute-sanitizer
  # 2025.3 fail with an internal error on the H100: every displayed hazard is listed below instead.)
  # Where the hazards are: the access sites, addresses stripped, most frequent first.
  grep -E "(Read|Write) Thread" "$OUT/racecheck_layer.log" | sed -E 's/0x[0-9a-f]+//g; s/^=+ +//; s/Thread \([0-9,]+\)//' |
    cut -c1-200 | sort | uniq -c | sort -rn | head -16
fi
if has memcheck-full; then
  log memcheck, whole binary
  timeout 450 compute-sanitizer --tool memcheck --print-limit 20 ./build/dsv4_gpu_tests >"$OUT/memcheck_full.log" 2>&1
  echo "memcheck-full rc=$?"; grep -E "ERROR SUMMARY|^\[  PASSED|^\[  FAILED|tests ran" "$OUT/memcheck_full.log" | tail -4
fi
if has racecheck-full; then
  log racecheck, whole binary
  timeout 540 compute-sanitizer --tool racecheck --racecheck-report hazard --print-limit 0 \
    ./build/dsv4_gpu_tests >"$OUT/racecheck_full.log" 2>&1
  echo "racecheck-full rc=$?"; grep -E "RACECHECK SUMMARY|^\[  PASSED|^\[  FAILED|tests ran" "$OUT/racecheck_full.log" | tail -4
  # Which kernel functions the displayed hazards are in, and which tests reported them.
  echo "-- functions of the displayed hazards (Read / Write sites):"
  grep -oE "(Read|Write) Thread \([0-9,]+\) at [A-Za-z_0-9]+" "$OUT/racecheck_full.log" | awk '{print $NF}' | sort | uniq -c | sort -rn | head
  echo "-- tests that reported hazards:"
  awk '/^\[ RUN/ {t=$NF} /Potential .* hazard/ {n[t]++} END {for (k in n) print n[k], k}' "$OUT/racecheck_full.log" | sort -rn | head -40
  gzip -f "$OUT/racecheck_full.log"
fi
log done

#!/usr/bin/env bash
# One device call of the release check (logs under $OUT):
#   bench/device_check.sh test   build; GPU tests; CPU-vs-CUDA tests; compute-sanitizer memcheck
#                                (whole GPU suite) and racecheck; Python tests on CUDA
#   bench/device_check.sh bench  build (reused when warm); ceilings; `dsv4 bench` (all PERF.md cases)
set -o pipefail
OUT=${OUT:-/tmp/out}; mkdir -p "$OUT"
MODE=${1:-test}
log() { echo "== $(date +%T) $*"; }
log configure+build
cmake -S . -B build -G Ninja -DDSV4_CUDA=ON -DDSV4_PYTHON=OFF >"$OUT/cmake.log" 2>&1 || { tail -30 "$OUT/cmake.log"; exit 1; }
cmake --build build -j16 --target dsv4_gpu_tests dsv4 >"$OUT/build.log" 2>&1 || { grep -B5 -A20 error "$OUT/build.log" | head -80; exit 1; }
nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.max.sm,temperature.gpu --format=csv,noheader | tee "$OUT/gpu.txt"
git rev-parse --short HEAD 2>/dev/null | tee "$OUT/commit.txt"
if [ "$MODE" = test ]; then
  log gpu tests
  timeout 200 ./build/dsv4_gpu_tests 2>&1 | tee "$OUT/gpu_tests.log" | grep -E "^\[  (FAILED|PASSED|SKIPPED) |^\[==========\]" | tail -8
  log memcheck
  timeout 170 compute-sanitizer --tool memcheck --print-limit 10 ./build/dsv4_gpu_tests \
    --gtest_filter='-*BitIdentical*:*ManyItems*' >"$OUT/memcheck.log" 2>&1
  echo "memcheck rc=$?"; grep -E "ERROR SUMMARY|^\[  PASSED|^\[  FAILED" "$OUT/memcheck.log" | tail -4
  log racecheck
  F='*Edge*:*Combine*:*CpuVsCuda*:Shapes/SparsePrefillGrid.*H64_d512_topk512*:*H128_d576_topk64*:*v32*h128*'
  timeout 150 compute-sanitizer --tool racecheck --racecheck-report all ./build/dsv4_gpu_tests \
    --gtest_filter="$F-*BitIdentical*" >"$OUT/racecheck.log" 2>&1
  echo "racecheck rc=$?"; grep -E "RACECHECK SUMMARY|ERROR SUMMARY|^\[  PASSED|^\[  FAILED" "$OUT/racecheck.log" | tail -4
fi
if [ "$MODE" = bench ]; then
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
  timeout 420 ./build/dsv4 bench --json "$OUT/bench.json" 2>&1 | tee "$OUT/bench.log" | tail -45
fi
log done

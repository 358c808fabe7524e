#!/usr/bin/env bash
# One device call: build, GPU tests, prefill benchmarks (logs under $OUT).
#   bench/device_prefill.sh [gtest filter] [bench filter] [extra: memcheck]
set -o pipefail
OUT=${OUT:-/tmp/out}; mkdir -p "$OUT"
GT_FILTER=${1:-*}; BENCH_FILTER=${2:-prefill}; EXTRA=${3:-}; PROFILE=${4:-}
cmake -S . -B build -G Ninja -DDSV4_CUDA=ON >"$OUT/cmake.log" 2>&1 || { tail -30 "$OUT/cmake.log"; exit 1; }
cmake --build build -j16 --target dsv4_gpu_tests dsv4 >"$OUT/build.log" 2>&1 || { grep -B5 -A20 error "$OUT/build.log" | head -80; exit 1; }
nvidia-smi --query-gpu=name,clocks.sm,clocks.max.sm,temperature.gpu,power.draw --format=csv | tee "$OUT/gpu.txt"
timeout 240 ./build/dsv4_gpu_tests --gtest_filter="$GT_FILTER" 2>&1 | tee "$OUT/tests.log" | grep -E "^\[  (FAILED|PASSED|SKIPPED) |Failure|error|got|^\[==" | head -60
timeout 200 ./build/dsv4 bench --filter "$BENCH_FILTER" --json "$OUT/bench.json" 2>&1 | tee "$OUT/bench.log"
if [ "$EXTRA" = memcheck ]; then
  SAN="compute-sanitizer --print-limit 5"
  F='SparsePrefillEdge.*:Shapes/SparsePrefillGrid.*H64_d512_topk512*:Shapes/SparsePrefillGrid.*H128_d576_topk64*-*BitIdentical*'
  timeout 150 $SAN --tool memcheck ./build/dsv4_gpu_tests --gtest_filter="$F" >"$OUT/memcheck.log" 2>&1; tail -3 "$OUT/memcheck.log"
  timeout 150 $SAN --tool racecheck --racecheck-report all ./build/dsv4_gpu_tests --gtest_filter="$F:*ManyItems*" >"$OUT/racecheck.log" 2>&1; tail -3 "$OUT/racecheck.log"
  grep -m 12 -A6 "Error\|Warning" "$OUT/racecheck.log" | head -60
fi
if [ "$PROFILE" = ncu ]; then
  for c in prefill_d512_h128_d512_topk2048_skv8192_sink prefill_flash_h64_d512_topk512_skv8192_sink; do
    timeout 120 ncu --kernel-name regex:sparse_prefill_kernel --launch-skip 1 --launch-count 1 \
      --section SpeedOfLight --section MemoryWorkloadAnalysis --section WarpStateStats --section SchedulerStats \
      ./build/dsv4 bench --filter "$c" --reps 20 --warmup 1 >"$OUT/ncu_$c.txt" 2>&1
    grep -E "Duration|Throughput|Hit Rate|L2 Cache|Stall|Issued|Eligible|Active Warps|Bandwidth" "$OUT/ncu_$c.txt" | head -40
  done
fi
if [ "$PROFILE" = ceil ]; then
  # Ceilings (PERF.md method): 8192^3 bf16 matmul and a 1 GiB device-to-device copy, median of 20.
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
  for c in prefill_d512_h128_d512_topk2048_skv8192 prefill_flash_h64_d512_topk512_skv8192; do
    ./build/dsv4 bench --filter "$c" --reps 50 2>&1 | grep prefill_ | tee -a "$OUT/bench_repeat.log"
  done
fi

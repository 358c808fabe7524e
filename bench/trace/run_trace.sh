#!/usr/bin/env bash
# Device call (after bench/trace/add_trace.py in the tree): normal + trace builds, GPU tests (unless
# `quick`), 50-run repeats of the two prefill bar cases, then one trace of each (summaries in $OUT).
set -o pipefail
OUT=${OUT:-/tmp/out}; mkdir -p "$OUT"; L=/tmp/logs; mkdir -p $L
log() { echo "== $(date +%T) $*"; }
MODE=${1:-full}
log build
cmake -S . -B build -G Ninja -DDSV4_CUDA=ON -DDSV4_PYTHON=OFF >"$L/cmake.log" 2>&1 || { tail -30 "$L/cmake.log"; exit 1; }
cmake -S . -B build-trace -G Ninja -DDSV4_CUDA=ON -DDSV4_PYTHON=OFF -DCMAKE_CUDA_FLAGS=-DDSV4_PREFILL_TRACE >"$L/cmake-trace.log" 2>&1 || { tail -30 "$L/cmake-trace.log"; exit 1; }
cmake --build build -j16 --target dsv4_gpu_tests dsv4 >"$L/build.log" 2>&1 || { grep -B5 -A20 error "$L/build.log" | head -60; exit 1; }
(cmake --build build-trace -j16 --target dsv4 >"$L/build-trace.log" 2>&1; echo "trace build rc=$?" > "$L/trace_build_rc.txt") &
TB=$!
grep -i "spill" "$L/build.log" | grep -i prefill | head
nvidia-smi --query-gpu=name,clocks.sm,clocks.max.sm,temperature.gpu --format=csv,noheader
if [ "$MODE" = full ]; then
  log gpu tests
  timeout 200 ./build/dsv4_gpu_tests --gtest_brief=1 2>&1 | tee "$L/gpu_tests.log" | tail -3
fi
log repeats
for c in prefill_d512_h128_d512_topk2048_skv8192_sink prefill_flash_h64_d512_topk512_skv8192_sink; do
  timeout 100 ./build/dsv4 bench --filter $c --reps 50 2>&1 | tee -a "$OUT/repeat.log" | grep prefill_
done
wait $TB; cat "$L/trace_build_rc.txt"; grep -iE "C75|spill" $L/build.log $L/build-trace.log | head -5
log traces
for c in prefill_d512_h128_d512_topk2048_skv8192_sink prefill_flash_h64_d512_topk512_skv8192_sink; do
  DSV4_PREFILL_TRACE=$OUT/trace_$c.txt timeout 60 ./build-trace/dsv4 bench --filter ${c%_sink}_nosink --reps 20 --warmup 2 2>&1 | grep prefill_
  python3 bench/trace/trace_summary.py $OUT/trace_$c.txt > $OUT/trace_$c.summary.txt 2>&1
done
log done

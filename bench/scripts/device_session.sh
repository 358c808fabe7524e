#!/usr/bin/env bash
# One device call for a development round (logs under $OUT): build the C++ library, GPU tests, CLI
# and Python extension for the device's python3; then the steps named on the command line, in
# order: graphs (the layer graph/residual GPU tests), quick (bench/scripts/layer_quick.py),
# gputests (the whole GPU suite), pytest (the Python tests), run (dsv4 run --backend cuda --check).
set -o pipefail
OUT=${OUT:-/tmp/out}; mkdir -p "$OUT"
log() { echo "== $(date +%T) $*"; }
PY=$(command -v python3)
export PYTHONPATH="$PWD/third_party/pylib${PYTHONPATH:+:$PYTHONPATH}"
log configure+build
cmake -S . -B build -G Ninja -DDSV4_CUDA=ON -DDSV4_PYTHON=ON -DPython_EXECUTABLE="$PY" >"$OUT/cmake.log" 2>&1 || { tail -30 "$OUT/cmake.log"; exit 1; }
cmake --build build -j16 --target dsv4_gpu_tests dsv4 _C >"$OUT/build.log" 2>&1 || { grep -B5 -A20 -E "error" "$OUT/build.log" | head -80; exit 1; }
nvidia-smi --query-gpu=name,driver_version,clocks.sm,temperature.gpu,power.limit --format=csv,noheader | tee "$OUT/gpu.txt"
export PYTHONPATH="$PWD/build/python:$PYTHONPATH"
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
    triton)
      log triton bench
      timeout "${TRITON_TIMEOUT:-120}" $PY bench/scripts/bench_triton.py ${TRITON_ARGS:-} --json "$OUT/triton.json" 2>&1 |
        tee "$OUT/triton.log" | tail -40 ;;
    run)
      log dsv4 run on the GPU
      timeout 200 ./build/dsv4 run --backend cuda --model v4-flash --layers 0,2,3 --requests 4 \
        --prompt-len 160,256,192,128 --decode-steps 8 --chunk 256 --check 2>&1 | tee "$OUT/run_cuda.log" | tail -14 ;;
  esac
done
log done

#!/usr/bin/env bash
# Issue 24's device calls: set-up, then the named parts, logs and results under $OUT.
# usage: bash bench/batching_session.sh PART...   (carry .whl: nvtx, sqlite-utils and deps, py-spy)
# parts: tests (batching + runtime GPU tests) quick (a short sweep) sweep (the full sweep) diag (bench/batch_diag.py)
#        pyspy (py-spy --gil of the batched runtime at Q=32)
export CUDA_DEVICE_MAX_CONNECTIONS=32
. bench/gpu_setup.sh
for part in "$@"; do
  s=$(date +%s)
  case $part in
    tests)
      timeout ${TESTS_TIMEOUT:-240} python3 -m pytest -q -m gpu tests/test_batching_gpu.py tests/test_runtime_gpu.py \
        -p no:cacheprovider -rs > "$OUT/gpu_tests_batching.log" 2>&1
      echo "tests rc=$?"; grep -E "passed|failed|Error|FAILED" "$OUT/gpu_tests_batching.log" | tail -15;;
    quick)
      OUT=$OUT NAME=quick.json QS=${QUICK_QS:-1,8,32,64} CONFIGS=${QUICK_CONFIGS:-handroll_prepacked,runtime_batched_call,runtime_batched_async} \
        DUR=1 timeout 300 python3 bench/serving_sweep.py > "$OUT/quick.log" 2>&1
      echo "quick rc=$?"; grep -v "^#" "$OUT/quick.log" | tail -30;;
    sweep)
      OUT=$OUT timeout ${SWEEP_TIMEOUT:-420} python3 bench/serving_sweep.py > "$OUT/sweep.log" 2>&1
      echo "sweep rc=$?"; tail -60 "$OUT/sweep.log";;
    diag)
      timeout 120 python3 bench/batch_diag.py > "$OUT/batch_diag.log" 2>&1
      echo "diag rc=$?"; tail -12 "$OUT/batch_diag.log";;
    pyspy)
      timeout 120 py-spy record --gil --threads -r 200 -f raw -o "$OUT/pyspy_batched_q32.txt" -- \
        python3 bench/serving_sweep.py --one runtime_batched_call 32 ${PYSPY_DUR:-6} > "$OUT/pyspy.log" 2>&1
      echo "pyspy rc=$?"; tail -3 "$OUT/pyspy.log";;
  esac
  echo "part $part $(( $(date +%s) - s )) s"
done

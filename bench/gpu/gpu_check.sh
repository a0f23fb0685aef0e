#!/usr/bin/env bash
# One device call that checks main on the GPU machine: set-up (wheels in .whl, libdw in
# .gpu-libs for nsys), every GPU test, profile --host-sample on the wide&deep workload, and a
# short serving sweep (eager, the pre-packed hand-roll, the runtime request path). Logs and results under $OUT.
# usage (carry .whl and .gpu-libs): bash bench/gpu_check.sh
. bench/gpu_setup.sh
cat "$OUT/env.json"
s=$(date +%s)
timeout ${TESTS_TIMEOUT:-330} python3 -m pytest -q -m gpu tests -p no:cacheprovider -rs > "$OUT/gpu_tests_all.log" 2>&1
echo "gpu tests rc=$? $(( $(date +%s) - s )) s"; grep -E "passed|failed|FAILED|Error" "$OUT/gpu_tests_all.log" | tail -12
s=$(date +%s)
timeout 150 recsys-doctor profile examples/wdl_workload.py --threads 4 --duration 2 --host-sample --no-baseline \
  --out /tmp/hs > "$OUT/host_sample.txt" 2>&1
echo "profile --host-sample rc=$? $(( $(date +%s) - s )) s"; grep -i -A14 "host\|GIL" "$OUT/host_sample.txt" | head -40
s=$(date +%s)
OUT=$OUT NAME=request_check.json QS=8 CONFIGS=eager,handroll_prepacked,runtime_request DUR=1 timeout 120 \
  python3 bench/serving_sweep.py > "$OUT/request_check.log" 2>&1
echo "sweep runtime_request rc=$? $(( $(date +%s) - s )) s"; grep -v "^#" "$OUT/request_check.log" | tail -6

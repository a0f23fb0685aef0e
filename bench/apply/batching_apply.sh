#!/usr/bin/env bash
# Issue 24's acceptance run of profile --apply with a latency budget, then every GPU test,
# on the GPU machine (carry .whl and .gpu-libs): results under $OUT.
# usage: bash bench/apply/batching_apply.sh
export CUDA_DEVICE_MAX_CONNECTIONS=32
. bench/gpu/gpu_setup.sh
W=/tmp/apply64
s=$(date +%s)
timeout ${APPLY_TIMEOUT:-330} recsys-doctor profile examples/wdl_workload.py --threads 64 --apply --p99-ms 8 \
  --no-history --out $W > "$OUT/apply64.txt" 2>&1
echo "apply rc=$? $(( $(date +%s) - s )) s"; tail -45 "$OUT/apply64.txt" | cut -c1-220
for f in apply.json plan.json compare.html; do [ -f $W/$f ] && cp $W/$f "$OUT/apply64_$f"; done
[ -f $W/program.log ] && tail -c 200000 $W/program.log > "$OUT/apply64_program_tail.log"
timeout ${TESTS_TIMEOUT:-200} python3 -m pytest -q -m gpu tests -p no:cacheprovider > "$OUT/gpu_tests_all.log" 2>&1
echo "gpu tests rc=$?"; tail -3 "$OUT/gpu_tests_all.log"

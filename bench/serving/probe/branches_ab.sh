#!/usr/bin/env bash
# Branch-parallel capture on the serving path (issue 24): the runtime's GPU tests, then one sweep with
# and without it (and the hand-roll both ways), each configuration in its own process.
# usage (GPU machine, repository root, .whl and .gpu-libs carried): bash bench/serving/probe/branches_ab.sh
export CUDA_DEVICE_MAX_CONNECTIONS=32
. bench/gpu/gpu_setup.sh
for f in ${TESTS-test_runtime_gpu test_batching_gpu}; do
  timeout 200 python3 -m pytest -q -m gpu tests/$f.py -p no:cacheprovider > "$OUT/$f.log" 2>&1
  echo "$f: $(tail -n 1 "$OUT/$f.log")"; grep -E "^(FAILED|ERROR)|Error" "$OUT/$f.log" | head -10
done
OUT=$OUT NAME=${NAME:-branches_ab.json} QS=${QS:-1,8,32,64} DUR=${DUR:-1.5} \
  CONFIGS=${CONFIGS:-handroll_prepacked,handroll_prepacked_branched,runtime_request,runtime_batched_call_b1,runtime_batched_call,runtime_batched_call_g8} \
  timeout ${SWEEP_TIMEOUT:-400} python3 bench/serving/serving_sweep.py > "$OUT/sweep.log" 2>&1
grep -v "^#" "$OUT/sweep.log" | cut -c1-200

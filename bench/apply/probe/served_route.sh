# Issue 25: the hook's batched calls served by the runtime (.served), on the GPU machine:
# the hook's GPU tests, then examples/plain_serving_script.py unhooked, under the hook's best
# unbatched plan (g4) and under batching plans (g1, g2, g4), one machine.
# OUT=/path bash bench/apply/probe/served_route.sh [TESTS=0 to skip the tests]
. bench/gpu/gpu_setup.sh >/dev/null 2>&1
export CUDA_DEVICE_MAX_CONNECTIONS=32
if [ "${TESTS:-1}" = 1 ]; then
  timeout 400 python3 -m pytest -q -m gpu tests/test_autoapply_gpu.py ${TESTS_K:+-k "$TESTS_K"} > $OUT/test_autoapply_gpu.log 2>&1
  tail -5 $OUT/test_autoapply_gpu.log
fi
S=examples/plain_serving_script.py
H="python3 bench/apply/hooked_run.py $OUT/hooked.jsonl"
for round in 1 2; do
  $H unhooked 0 $S --threads ${THREADS:-8} >> $OUT/hooked.log 2>&1
  $H g4 4 $S --threads ${THREADS:-8} >> $OUT/hooked.log 2>&1
  for G in ${BGROUPS:-1 2 4}; do
    RD_BATCHING=1 $H g${G}b $G $S --threads ${THREADS:-8} >> $OUT/hooked.log 2>&1
  done
done
cat $OUT/hooked.log | grep -v Warning | grep -v sync_debug

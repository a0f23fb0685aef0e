# One H200, session 31, fifth call: serve(batching=True) with two driver threads by default (working tree):
# the GPU tests that serve batched models (batching, runtime, apply, the hook's, whose batched calls keep
# one driver), then the batched call and coroutines at the default against _dr1, 2 rounds in alternating order.
export CUDA_DEVICE_MAX_CONNECTIONS=32
. bench/gpu/gpu_setup.sh >/dev/null 2>&1
STOP_AT=300
T=60 gpu_test batching_gpu tests/test_batching_gpu.py
T=90 gpu_test runtime_gpu tests/test_runtime_gpu.py
T=60 gpu_test apply_gpu tests/test_apply_gpu.py
T=100 gpu_test autoapply_gpu tests/test_autoapply_gpu.py
grep -h -E "^(FAILED|ERROR)" $OUT/*.log | head -20
C=runtime_batched_call,runtime_batched_call_dr1,runtime_batched_async,runtime_batched_async_dr1
R=runtime_batched_async_dr1,runtime_batched_async,runtime_batched_call_dr1,runtime_batched_call
for i in 1 2; do
  [ $SECONDS -lt 330 ] || break
  [ $i = 1 ] && CS=$C || CS=$R
  OUT=$OUT/sweep NAME=round$i.json QS=1,4,8,16,32,64,128 DUR=1 CONFIG_TIMEOUT=60 CONFIGS=$CS \
    timeout 120 python3 bench/serving/serving_sweep.py 2>&1 | grep '^#' | tr '\n' ' '; echo "[${SECONDS}s]"
done
python3 bench/serving/sweep_table.py $OUT/sweep/round*.json
(cd $OUT && tar czf sweep.tgz sweep && rm -rf sweep)
echo "done [${SECONDS}s]"

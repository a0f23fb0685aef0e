# One H200, session 30, third call: issue 24's serving sweep on the current runtime, Q = 1..128 with
# default settings (no hang, every request checked against eager): the hand-roll, request() (8 groups),
# the batched call (4 groups; 8 groups; a 0.2 ms switch interval) and 64-128 asyncio coroutines.
# (The summaries below were inline Python when the call ran; bench/apply/ab_means.py and
# bench/serving/sweep_table.py print the same tables from the same files.)
export CUDA_DEVICE_MAX_CONNECTIONS=32
. bench/gpu/gpu_setup.sh >/dev/null 2>&1
OUT=$OUT NAME=serving_sweep_h200.json QS=1,4,8,16,32,64,128 DUR=1 CONFIG_TIMEOUT=120 \
  CONFIGS=handroll_prepacked,runtime_request,runtime_batched_call,runtime_batched_call_g8,runtime_batched_call_si,runtime_batched_async \
  timeout 540 python3 bench/serving/serving_sweep.py 2>&1 | grep '^#' | cut -c1-200
python3 bench/serving/sweep_table.py $OUT/serving_sweep_h200.json
echo "done [${SECONDS}s]"

# One H200, session 30, sixth call: the default itself (0.5 ms, serve's default now that serving_sweep.py no
# longer passes None for a config without _si): the batching GPU tests, then the batched call at the default
# and at Python's 5 ms (_si5), Q = 1..128, one round each.
export CUDA_DEVICE_MAX_CONNECTIONS=32
. bench/gpu/gpu_setup.sh >/dev/null 2>&1
T=60 gpu_test batching_gpu tests/test_batching_gpu.py
OUT=$OUT NAME=default_vs_5ms.json QS=1,4,8,16,32,64,128 DUR=1 CONFIG_TIMEOUT=60 CONFIGS=runtime_batched_call,runtime_batched_call_si5 \
  timeout 120 python3 bench/serving/serving_sweep.py 2>&1 | grep '^#' | tr '\n' ' '; echo
python3 -c "
import json, os
rows = json.load(open(os.environ['OUT'] + '/default_vs_5ms.json'))
for c in ('runtime_batched_call', 'runtime_batched_call_si5'):
    print(c, [(r['Q'], round(r['qps']), r['p99_ms'], r['max_abs_err']) for r in rows if r['config'] == c and r.get('qps')])
"
echo "done [${SECONDS}s]"

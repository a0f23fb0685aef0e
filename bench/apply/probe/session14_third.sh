# The fourteenth session's third GPU call. (1) The lifetime rule's GPU test alone (in the second
# call it failed alone on looking the hook's module up before the hook was loaded; it passed in
# the whole file). (2) early_pool_serve at g4 placed at first calls (thread graphs) ran at 2.06k
# q/s against 2.55k at g2 placed at start (late groups, no thread graphs): the same g4 without
# thread graphs says whether the thread graphs are what costs; the DLRM script with and without
# them beside it, twice, alternating. (3) Issue 24's sweep, short (1 s a point), on the H200:
# the hand-roll, the batched call and asyncio, the unbatched call, Q = 1 ... 128.
. bench/gpu/gpu_setup.sh >/dev/null 2>&1
export SETUP_DONE=1 CUDA_DEVICE_MAX_CONNECTIONS=32
T=60 gpu_test lifetimes tests/test_autoapply_gpu.py -k one_request
J=$OUT/tg.jsonl
run() { [ $SECONDS -lt 230 ] || return 0; timeout 60 bash -c ". bench/apply/ab_cases.sh; ab_case $J $1 $2" 2>/dev/null | cut -c1-200; }
for i in 1 2; do for c in early4 early4n early2s dlrm2 dlrm2n; do run t$i $c; done; done
rm -f $OUT/tg.jsonl.log $OUT/setup.log
OUT=$OUT NAME=quick_h200.json QS=1,8,32,64,128 CONFIGS=handroll_prepacked,runtime_batched_call,runtime_batched_async,runtime_call \
  DUR=1 CONFIG_TIMEOUT=110 timeout $(( 590 - SECONDS )) python3 bench/serving/serving_sweep.py > $OUT/quick.log 2>&1
grep -v "^#" $OUT/quick.log | cut -c1-200 | tail -24

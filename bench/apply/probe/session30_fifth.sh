# One H200, session 30, fifth call: serve(batching=True) now holds a 0.2 ms GIL switch interval by default
# (runtime/_serve_batching.py). (1) the batching GPU tests on it; (2) serving_sweep.py, Q = 1..128, 2 rounds in
# alternating order: the batched call and coroutines at the new default and at Python's 5 ms (_si5, the code
# before), the batched call at 0.5 ms, the hand-roll; (3) the hook's experiment again (knob_ab.sh, DLRM g4 and
# MMoE g8 at 5 ms and 1 ms, 3 rounds), where MMoE lost in the fourth call.
# (The summaries below were inline Python when the call ran; bench/apply/ab_means.py and
# bench/serving/sweep_table.py print the same tables from the same files.)
export CUDA_DEVICE_MAX_CONNECTIONS=32
. bench/gpu/gpu_setup.sh >/dev/null 2>&1
T=90 gpu_test batching_gpu tests/test_batching_gpu.py
a=runtime_batched_call,runtime_batched_call_si5,runtime_batched_call_si0.5,runtime_batched_async,runtime_batched_async_si5,handroll_prepacked
b=handroll_prepacked,runtime_batched_async_si5,runtime_batched_async,runtime_batched_call_si0.5,runtime_batched_call_si5,runtime_batched_call
for r in 1 2; do
  c=$a; [ $r = 2 ] && c=$b
  OUT=$OUT/sweeps NAME=round$r.json QS=1,4,8,16,32,64,128 DUR=1 CONFIG_TIMEOUT=100 CONFIGS=$c \
    timeout 200 python3 bench/serving/serving_sweep.py 2>&1 | grep '^#' | tr '\n' ' '; echo
done
python3 bench/serving/sweep_table.py $OUT/sweeps/round*.json
echo "sweeps done [${SECONDS}s]"
CASES="dlrm4 mmoe8" KNOBS="- RECSYS_DOCTOR_SWITCH_INTERVAL_MS=1" AB_PIN="taskset -c 0-7" \
  timeout $((570 - SECONDS)) bash bench/apply/knob_ab.sh 3 2>&1 | grep -v "^setup\|^NVIDIA" | cut -c1-100 > $OUT/knob_ab.txt
python3 bench/apply/ab_means.py $OUT/knob_ab.jsonl
echo "done [${SECONDS}s]"
(cd $OUT && tar czf sweeps.tgz sweeps && rm -rf sweeps && tar czf logs.tgz $(ls | grep -E '\.log$') && rm -f $(ls | grep -E '\.log$'); ls)

# One H200, session 30, fourth call: the GIL switch interval again, wider. (1) knob_ab.sh: DLRM g4, MMoE g8,
# the plain script g4 and the two-tower g4 at 5 ms ("-"), 0.2 ms and 1 ms (RECSYS_DOCTOR_SWITCH_INTERVAL_MS,
# the working tree's experiment), 3 rounds, order alternating; (2) serving_sweep.py, Q = 1..128, each of the
# hand-roll, request() and the batched call and coroutines at 5 ms and at 0.2 ms (the hand-roll and request()
# set it for the whole process, as a user could), the batched call at 0.5 ms too.
# (The summaries below were inline Python when the call ran; bench/apply/ab_means.py and
# bench/serving/sweep_table.py print the same tables from the same files.)
export CUDA_DEVICE_MAX_CONNECTIONS=32
. bench/gpu/gpu_setup.sh >/dev/null 2>&1
CASES="dlrm4 mmoe8 plain4 tt4" KNOBS="- RECSYS_DOCTOR_SWITCH_INTERVAL_MS=0.2 RECSYS_DOCTOR_SWITCH_INTERVAL_MS=1" AB_PIN="taskset -c 0-7" \
  timeout 330 bash bench/apply/knob_ab.sh 3 2>&1 | grep -v "^setup\|^NVIDIA" | cut -c1-100 > $OUT/knob_ab.txt
python3 bench/apply/ab_means.py $OUT/knob_ab.jsonl
echo "knob_ab done [${SECONDS}s]"
OUT=$OUT NAME=serving_sweep_si_h200.json QS=1,4,8,16,32,64,128 DUR=1 CONFIG_TIMEOUT=100 \
  CONFIGS=handroll_prepacked,handroll_prepacked_si0.2,runtime_request,runtime_request_si0.2,runtime_batched_call,runtime_batched_call_si0.2,runtime_batched_call_si0.5,runtime_batched_async,runtime_batched_async_si0.2 \
  timeout $((585 - SECONDS)) python3 bench/serving/serving_sweep.py 2>&1 | grep '^#' | tr '\n' ' '; echo
python3 bench/serving/sweep_table.py $OUT/serving_sweep_si_h200.json
echo "done [${SECONDS}s]"
(cd $OUT && tar czf logs.tgz $(ls | grep -E '\.log$') && rm -f $(ls | grep -E '\.log$'); ls)

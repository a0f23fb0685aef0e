# One H200, session 30, second call: the GIL switch interval for a hooked script (an experiment:
# RECSYS_DOCTOR_SWITCH_INTERVAL_MS, set by the hook at start, in the working tree only). knob_ab.sh:
# DLRM g4 and MMoE g8, 4 threads, at the default 5 ms ("-"), 0.2 ms and 20 ms, back to back, 3 rounds,
# order alternating; checksums.
# (The summaries below were inline Python when the call ran; bench/apply/ab_means.py and
# bench/serving/sweep_table.py print the same tables from the same files.)
export CUDA_DEVICE_MAX_CONNECTIONS=32
. bench/gpu/gpu_setup.sh >/dev/null 2>&1
CASES="dlrm4 mmoe8" KNOBS="- RECSYS_DOCTOR_SWITCH_INTERVAL_MS=0.2 RECSYS_DOCTOR_SWITCH_INTERVAL_MS=20" AB_PIN="taskset -c 0-7" \
  timeout $((560 - SECONDS)) bash bench/apply/knob_ab.sh 3 2>&1 | grep -v "^setup\|^NVIDIA" | cut -c1-110
python3 bench/apply/ab_means.py $OUT/knob_ab.jsonl
echo "done [${SECONDS}s]"
(cd $OUT && tar czf logs.tgz $(ls | grep -E '\.log$|\.txt$') && rm -f $(ls | grep -E '\.log$|\.txt$'); ls)

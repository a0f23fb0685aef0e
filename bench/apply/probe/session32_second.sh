# One H200, session 32, second call (issue 24): the whole sweep at HEAD (final_sweep.sh's PART=all
# configurations, DUR=1.5, one run), now that coroutines' timeouts come from one timer a loop; then
# `profile examples/wdl_workload.py --threads 64 --apply --p99-ms 8` (batching_apply.sh's run, no tests).
export CUDA_DEVICE_MAX_CONNECTIONS=32
. bench/gpu/gpu_setup.sh >/dev/null 2>&1
C=eager,handroll_prepacked,handroll_prepacked_branched,runtime_call,runtime_request,runtime_batched_call,runtime_batched_submit,runtime_batched_async,runtime_batched_call_g8,runtime_batched_call_si5,handroll_prepacked_si0.5,runtime_batched_call_dr4,runtime_batched_call_b1,runtime_batched_call_dr1,runtime_batched_async_dr1
nvidia-smi --query-gpu=serial,uuid --format=csv,noheader > "$OUT/gpu_id.txt"
OUT=$OUT NAME=serving_sweep_h200.json CONFIGS=$C DUR=1.5 CONFIG_TIMEOUT=60 timeout 345 python3 bench/serving/serving_sweep.py > "$OUT/sweep.log" 2>&1
echo "sweep rc=$? [${SECONDS}s]"; grep -E "^# |errors\": \[\"" "$OUT/sweep.log" | cut -c1-200 | tr '\n' ' '; echo
python3 bench/serving/sweep_table.py $OUT/serving_sweep_h200.json
W=/tmp/apply64
timeout 225 recsys-doctor profile examples/wdl_workload.py --threads 64 --apply --p99-ms 8 --no-history --out $W > "$OUT/apply64.txt" 2>&1
echo "apply rc=$? [${SECONDS}s]"; tail -30 "$OUT/apply64.txt" | cut -c1-200
for f in apply.json plan.json; do [ -f $W/$f ] && cp $W/$f "$OUT/apply64_$f"; done
(cd $OUT && tar czf extra.tgz apply64_*.json sweep.log gpu_id.txt 2>/dev/null && rm -f apply64_*.json sweep.log gpu_id.txt)
echo "done [${SECONDS}s]"

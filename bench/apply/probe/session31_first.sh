# One H200, session 31, first call (issue 24): where the batched call's host time goes at the 0.5 ms default
# (py-spy --gil and --idle at 32 clients, attached after warm-up), then a grid of the batcher's settings at
# the default, 2 rounds in alternating order: groups (2/4/8), drivers (1/2), a 0.1 ms interval, the other APIs.
export CUDA_DEVICE_MAX_CONNECTIONS=32
. bench/gpu/gpu_setup.sh >/dev/null 2>&1
for Q in 32 64; do
  python3 bench/serving/serving_sweep.py --one runtime_batched_call $Q 12 > "$OUT/pyspy_run_q$Q.log" 2>&1 &
  P=$!; sleep 8
  py-spy record --gil --threads -r 250 -d 3 -f raw -p $P -o "$OUT/pyspy_gil_q$Q.txt" > /dev/null 2>&1
  py-spy record --idle --threads -r 250 -d 2 -f raw -p $P -o "$OUT/pyspy_idle_q$Q.txt" > /dev/null 2>&1
  wait $P; grep ROW "$OUT/pyspy_run_q$Q.log" | cut -c1-160
done
echo "pyspy done [${SECONDS}s]"
C=handroll_prepacked,runtime_request,runtime_batched_call,runtime_batched_call_g2,runtime_batched_call_g8,runtime_batched_call_dr2,runtime_batched_call_g8dr2,runtime_batched_call_si0.1,runtime_batched_submit,runtime_batched_async,runtime_batched_async_dr2
R=$(echo $C | tr ',' '\n' | tac | paste -sd,)
for i in 1 2; do
  [ $i = 1 ] && CS=$C || CS=$R
  OUT=$OUT/grid NAME=round$i.json QS=1,4,8,32,64,128 DUR=1 CONFIG_TIMEOUT=60 CONFIGS=$CS \
    timeout 280 python3 bench/serving/serving_sweep.py 2>&1 | grep '^#' | tr '\n' ' '; echo "[${SECONDS}s]"
done
python3 bench/serving/sweep_table.py $OUT/grid/round1.json $OUT/grid/round2.json
(cd $OUT && tar czf pyspy.tgz pyspy_* && rm -f pyspy_*.txt pyspy_run_*.log && tar czf grid.tgz grid && rm -rf grid)
echo "done [${SECONDS}s]"

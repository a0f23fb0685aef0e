# Issue 25: the plain script's loop on the runtime's batched served, against the script
# unhooked and under the hook's plans, one machine. OUT=/path bash bench/apply/probe/plain_batched_ceiling.sh
. bench/gpu/gpu_setup.sh >/dev/null 2>&1
export CUDA_DEVICE_MAX_CONNECTIONS=32
P=bench/apply/probe/plain_batched_ceiling.py
J=$OUT/ceiling.jsonl
for T in 8; do
  python3 $P eager $T >> $J 2>>$OUT/err.log
  for G in 1 2; do
    python3 $P served $T $G >> $J 2>>$OUT/err.log
    python3 $P served_to $T $G >> $J 2>>$OUT/err.log
    python3 $P served_dev $T $G >> $J 2>>$OUT/err.log
  done
done
python3 bench/apply/hooked_run.py $OUT/hooked.jsonl unhooked 0 examples/plain_serving_script.py --threads 8 >> $OUT/hooked.log 2>&1
python3 bench/apply/hooked_run.py $OUT/hooked.jsonl g4 4 examples/plain_serving_script.py --threads 8 >> $OUT/hooked.log 2>&1
RD_BATCHING=1 python3 bench/apply/hooked_run.py $OUT/hooked.jsonl g1b 1 examples/plain_serving_script.py --threads 8 >> $OUT/hooked.log 2>&1
RD_BATCHING=1 python3 bench/apply/hooked_run.py $OUT/hooked.jsonl g2b 2 examples/plain_serving_script.py --threads 8 >> $OUT/hooked.log 2>&1
cat $J $OUT/hooked.log; tail -3 $OUT/err.log

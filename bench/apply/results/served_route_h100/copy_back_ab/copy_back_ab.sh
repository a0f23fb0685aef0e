# Issue 25: a thread graph's output copied back by the graph (default) against cloned on the GPU
# (RECSYS_DOCTOR_COPY_BACK=0), alternated on one machine: examples/plain_serving_script.py, g4,
# 8 threads, ROUNDS rounds, and the script unhooked. OUT=/path bash bench/apply/probe/copy_back_ab.sh
. bench/gpu/gpu_setup.sh >/dev/null 2>&1
export CUDA_DEVICE_MAX_CONNECTIONS=32
S=examples/plain_serving_script.py
H="python3 bench/apply/hooked_run.py $OUT/copy_back_ab.jsonl"
for r in $(seq ${ROUNDS:-3}); do
  $H unhooked 0 $S >> $OUT/copy_back_ab.log 2>&1
  RECSYS_DOCTOR_COPY_BACK=0 $H clone 4 $S >> $OUT/copy_back_ab.log 2>&1
  $H copy_back 4 $S >> $OUT/copy_back_ab.log 2>&1
done
grep -v Warning $OUT/copy_back_ab.log | grep -v sync_debug | cut -c1-90

# The runtime's host-sync check as a dispatch mode of the capturing thread (not PyTorch's
# process-wide sync debug mode): the runtime's, batching and hook GPU tests, then the plain
# script under the hook's batching plan (the route to the runtime builds its served model while
# the other client threads synchronize). OUT=/path bash bench/apply/probe/sync_mode_check.sh
. bench/gpu/gpu_setup.sh >/dev/null 2>&1
export CUDA_DEVICE_MAX_CONNECTIONS=32
for f in test_runtime_gpu test_batching_gpu test_autoapply_gpu; do
  timeout 200 python3 -m pytest -q -m gpu tests/$f.py -p no:cacheprovider > $OUT/$f.log 2>&1
  echo "$f rc $? $(tail -1 $OUT/$f.log)"
done
for r in 1 2 3; do
  RD_BATCHING=1 timeout 100 python3 bench/apply/hooked_run.py $OUT/hooked.jsonl g4b 4 examples/plain_serving_script.py >> $OUT/hooked.log 2>&1
  RD_BATCHING=1 timeout 100 python3 bench/apply/hooked_run.py $OUT/hooked.jsonl g1b 1 examples/plain_serving_script.py >> $OUT/hooked.log 2>&1
done
grep -v Warning $OUT/hooked.log | grep -v sync_debug | cut -c1-200

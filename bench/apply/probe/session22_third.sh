# One H200: the GPU tests of the tree at the twenty-second session (apply, batching, runtime, capture
# and the hook's smaller files; autoapply ran in session22_first.sh), then two held-out scripts never
# run through profile --apply on a GPU before: own_batcher_serve.py and proc_pool_serve.py.
. bench/gpu/gpu_setup.sh >/dev/null 2>&1
export SETUP_DONE=1 CUDA_DEVICE_MAX_CONNECTIONS=32
for f in apply batching runtime capture autoapply_argwrites autoapply_config autoapply_multigpu \
         autoapply_own_graphs autoapply_pipeline autoapply_refresh autoapply_trainers; do
  T=120 gpu_test ${f}_gpu tests/test_${f}_gpu.py
done
export RECSYS_DOCTOR_WRITE_SUITE=$OUT/heldout_rows.json
STOP_AT=330 T=230 gpu_test heldout_apply tests/test_heldout_gpu.py -k "own_batcher or proc_pool" --basetemp=/tmp/bt1
find /tmp/bt1 -name "*.json" -size -400k | tar czf $OUT/bt1.tgz -T - 2>/dev/null
(cd $OUT && tar czf logs.tgz $(ls | grep -E '\.log$|\.txt$') && rm -f $(ls | grep -E '\.log$|\.txt$'); ls)

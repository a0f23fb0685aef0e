# One H200: five held-out scripts never run through profile --apply on a GPU before:
# own_batcher_serve.py, proc_pool_serve.py (left out of session22_third.sh by its time), triton_backend_serve.py, kjt_ranker_serve.py (every call eager: its KeyedJagged argument) and
# generative_decode_serve.py (a KV-cache decode loop that writes its caches in place).
. bench/gpu/gpu_setup.sh >/dev/null 2>&1
export SETUP_DONE=1 CUDA_DEVICE_MAX_CONNECTIONS=32
export RECSYS_DOCTOR_WRITE_SUITE=$OUT/heldout_rows.json
T=540 gpu_test heldout_apply tests/test_heldout_gpu.py -k "own_batcher or proc_pool or triton_backend or kjt_ranker or generative_decode" --basetemp=/tmp/bt1
find /tmp/bt1 -name "*.json" -size -400k | tar czf $OUT/bt1.tgz -T - 2>/dev/null
(cd $OUT && tar czf logs.tgz $(ls | grep -E '\.log$|\.txt$') && rm -f $(ls | grep -E '\.log$|\.txt$'); ls)

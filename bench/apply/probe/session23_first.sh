# One H200: the capture's SIGTERM handler (recsys_doctor/capture/term_exit.py) through profile --apply:
# proc_pool_serve.py (a spawn Pool its `with` block terminates; it failed before the change: "the
# trace has no kernels or copies") and mp_pool_serve.py (worker processes joined on their own, each
# with a thread pool: nothing should change), then the capture's GPU tests.
. bench/gpu/gpu_setup.sh >/dev/null 2>&1
export SETUP_DONE=1 CUDA_DEVICE_MAX_CONNECTIONS=32
export RECSYS_DOCTOR_WRITE_SUITE=$OUT/heldout_rows.json
T=400 gpu_test heldout_apply tests/test_heldout_gpu.py -k "proc_pool or mp_pool" --basetemp=/tmp/bt1
T=90 gpu_test capture_gpu tests/test_capture_gpu.py
find /tmp/bt1 -name "*.json" -size -400k | tar czf $OUT/bt1.tgz -T - 2>/dev/null
(cd $OUT && tar czf logs.tgz $(ls | grep -E '\.log$|\.txt$') && rm -f $(ls | grep -E '\.log$|\.txt$'); ls)

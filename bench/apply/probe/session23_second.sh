# One H200: the new held-out subprocess_server_serve.py and executor_procs_serve.py (a spawn
# ProcessPoolExecutor whose workers exit on their own) through profile --apply; subprocess_server_serve.py (a DeepFM in a server process the load
# generator starts with Popen and ends with terminate()): as it is and under g2 (the hook runs in
# every Python process of the program; the model calls are in the server's handler threads), then
# through profile --apply (test_heldout_gpu.py), whose "after" trace needs the server's activity
# kept when it is terminated (capture/term_exit.py); first the capture and apply GPU tests (nsys runs
# with the capture's generated sitecustomize).
. bench/gpu/gpu_setup.sh >/dev/null 2>&1
export SETUP_DONE=1 CUDA_DEVICE_MAX_CONNECTIONS=32
H=bench/apply/hooked_run.py; J=$OUT/hooked.jsonl; S="examples/heldout/subprocess_server_serve.py --threads 4 --queries 3000"
run() { timeout 100 python3 $H $J "$@" 2>&1 | tail -1 | cut -c1-300; }
T=60 gpu_test capture_gpu tests/test_capture_gpu.py
T=50 gpu_test apply_gpu tests/test_apply_gpu.py
run ref 0 $S; run g2 2 $S
export RECSYS_DOCTOR_WRITE_SUITE=$OUT/heldout_rows.json
STOP_AT=200 T=380 gpu_test heldout_apply tests/test_heldout_gpu.py -k "subprocess_server or executor_procs" --basetemp=/tmp/bt1
find /tmp/bt1 -name "*.json" -size -400k | tar czf $OUT/bt1.tgz -T - 2>/dev/null
(cd $OUT && tar czf logs.tgz $(ls | grep -E '\.log$|\.txt$') && rm -f $(ls | grep -E '\.log$|\.txt$'); ls)

# One H200, after the normal-tensor buffers: the optional-features script under the hook (fixed
# plans), the hook's GPU tests, and two of the new held-out scripts through profile --apply.
. bench/gpu/gpu_setup.sh >/dev/null 2>&1
export SETUP_DONE=1 CUDA_DEVICE_MAX_CONNECTIONS=32
H=bench/apply/hooked_run.py; J=$OUT/hooked.jsonl; E=examples/heldout
run() { timeout 100 python3 $H $J "$@" 2>&1 | tail -1 | cut -c1-200; }
S="$E/optional_features_serve.py --threads 4 --queries 3000"
run ref 0 $S; run g2 2 $S; RD_BATCHING=1 run g2b 2 $S
STOP_AT=330
T=150 gpu_test autoapply_gpu tests/test_autoapply_gpu.py
export RECSYS_DOCTOR_WRITE_SUITE=$OUT/heldout_rows.json
T=170 gpu_test heldout_new tests/test_heldout_gpu.py -k "exported_ranker or online_learning" --basetemp=/tmp/bt1
find /tmp/bt1 -name "*.json" -size -400k | tar czf $OUT/bt1.tgz -T - 2>/dev/null
grep -B2 -A12 "Traceback" $J.log | tail -c 3000 > $OUT/tracebacks.txt
rm -f $OUT/setup.log

# One H200: the new held-out replica_per_thread_serve.py (a model replica per worker thread, made by
# the pool's initializer inside the thread) as it is and under fixed plans, then it and optional
# features through profile --apply (test_heldout_gpu.py: outputs equal, speedup or declined).
. bench/gpu/gpu_setup.sh >/dev/null 2>&1
export SETUP_DONE=1 CUDA_DEVICE_MAX_CONNECTIONS=32
H=bench/apply/hooked_run.py; J=$OUT/hooked.jsonl; R="examples/heldout/replica_per_thread_serve.py --threads 4 --queries 3000"
run() { timeout 100 python3 $H $J "$@" 2>&1 | tail -1 | cut -c1-300; }
run ref 0 $R; run g2 2 $R; run g4 4 $R; RECSYS_DOCTOR_REPLAY_WINDOW=0 run g4_nodrop 4 $R
export RECSYS_DOCTOR_WRITE_SUITE=$OUT/heldout_rows.json
STOP_AT=400 T=190 gpu_test heldout_apply tests/test_heldout_gpu.py -k "replica_per_thread or optional_features" --basetemp=/tmp/bt1
find /tmp/bt1 -name "*.json" -size -400k | tar czf $OUT/bt1.tgz -T - 2>/dev/null
(cd $OUT && tar czf logs.tgz $(ls | grep -E '\.log$|\.txt$') && rm -f $(ls | grep -E '\.log$|\.txt$'); ls)

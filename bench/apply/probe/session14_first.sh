# For the next session's first GPU call: the thirteenth session's code written after its last GPU
# call. (1) The script's own pinned copies a thread graph serves, counted at their lines
# (thread_graphs.count_copies): test_apply_gpu.py and test_autoapply_gpu.py. (2) Threads started
# before CUDA placed in plan groups at their first model call (not a late group each on the
# default stream): examples/heldout/early_pool_serve.py unhooked, at g2 (first-call, the default)
# and at g2 placed at start (late groups), alternating; hook stats give threads / late_threads;
# then its held-out run through profile --apply.
. bench/gpu/gpu_setup.sh >/dev/null 2>&1
export SETUP_DONE=1 CUDA_DEVICE_MAX_CONNECTIONS=32
T=90 gpu_test apply_gpu tests/test_apply_gpu.py
T=120 gpu_test autoapply_gpu tests/test_autoapply_gpu.py
J=$OUT/early.jsonl
run() { [ $SECONDS -lt 360 ] || return 0; timeout 60 bash -c ". bench/apply/ab_cases.sh; ab_case $J $1 $2" 2>>$OUT/cases.err | cut -c1-220; }
for i in 1 2; do for c in early0 early2 early2s; do run e$i $c; done; done
# a spawn Pool of processes scoring on their main threads (late groups in the workers; their stats
# written every 0.5 s, the pool terminating them at the with-block's end): hook stats' processes
run p1 proc0; run p1 proc2
export RECSYS_DOCTOR_WRITE_SUITE=$OUT/heldout_rows.json
T=$(( 585 - SECONDS )) STOP_AT=450 gpu_test heldout_early tests/test_heldout_gpu.py -k early_pool

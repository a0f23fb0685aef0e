# The fourteenth session's second GPU call: threads that live one request each, or one wave of
# requests (examples/heldout/short_threads_serve.py). (1) The GPU test of the lifetime rule
# (thread_graphs.short_lived). (2) The script unhooked, at g2 (the rule), at g2 with every
# thread learning at once (RECSYS_DOCTOR_THREAD_GRAPH_MIN_CALLS=0: the code before the rule)
# and at g2 without thread graphs, twice, alternating; its wave mode once. (3) early_pool at g4
# (placed at first calls) against g2 placed at start (four late groups): the first call's g2
# ran 13% under the late groups. (4) The held-out run through profile --apply; the whole
# autoapply GPU file last.
. bench/gpu/gpu_setup.sh >/dev/null 2>&1
export SETUP_DONE=1 CUDA_DEVICE_MAX_CONNECTIONS=32
T=60 gpu_test lifetimes tests/test_autoapply_gpu.py -k one_request
J=$OUT/short.jsonl
run() { [ $SECONDS -lt 330 ] || return 0; timeout 70 bash -c ". bench/apply/ab_cases.sh; ab_case $J $1 $2" 2>>$OUT/cases.err | cut -c1-250; }
for i in 1 2; do for c in short0 short2 short2a short2n; do run s$i $c; done; done
for c in wave0 wave2 wave2a; do run w1 $c; done
run e1 early4; run e1 early2s
export RECSYS_DOCTOR_WRITE_SUITE=$OUT/heldout_rows.json
T=$(( 500 - SECONDS )) gpu_test heldout_short tests/test_heldout_gpu.py -k short_threads
T=$(( 590 - SECONDS )) gpu_test autoapply_gpu tests/test_autoapply_gpu.py

# For the next session's first GPU call: why own_graphs_serve.py --capture worker failed under the
# hook (KeyError: 2 on the H200, bench/apply/results/dynamo_import_h200/README.md section 5): the
# hooked run first, with the hook's debug tracebacks, every run's output kept beside the JSONL
# ($OUT/own.jsonl.log: the worker's own traceback) and the hook's thread_errors in the stats;
# then the script fixed to capture on each worker's stream, unhooked twice (its checksum must
# not move now) and hooked in both capture modes; its GPU test; then profile --apply on it.
. bench/gpu/gpu_setup.sh >/dev/null 2>&1
export SETUP_DONE=1 CUDA_DEVICE_MAX_CONNECTIONS=32
J=$OUT/own.jsonl
run() { [ $SECONDS -lt 420 ] || return 0; timeout 60 bash -c ". bench/apply/ab_cases.sh; ab_case $J $1 $2" 2>>$OUT/cases.err | cut -c1-150; }
RECSYS_DOCTOR_AUTOAPPLY_DEBUG=1 run d1 ownw2
for c in own0 own0 ownw0 own2 ownw2; do run s13 $c; done
T=150 STOP_AT=420 gpu_test own_graphs_gpu tests/test_autoapply_own_graphs_gpu.py
export RECSYS_DOCTOR_WRITE_SUITE=$OUT/heldout_rows.json
T=$(( 560 - SECONDS )) gpu_test heldout_own tests/test_heldout_gpu.py -k own_graphs
# the held-out training loop (AMP, accumulation, a validation pass the hook may graph): as it
# is and at 2 groups, then through profile --apply if time is left
run t1 train0; run t1 train2
T=$(( 580 - SECONDS )) STOP_AT=480 gpu_test heldout_train tests/test_heldout_gpu.py -k amp_accum
# the held-out server with its own dynamic batcher (one thread calls the model, row counts vary)
run b1 batch0; run b1 batch2

# Twelfth session, last short GPU call (H200, ~4 minutes of device time left): the held-out
# script that replays CUDA graphs of its own (examples/heldout/own_graphs_serve.py), captured in
# the main thread and by each worker, unhooked and under 2 groups (checksums must match); then,
# in what time is left, through profile --apply.
. bench/gpu/gpu_setup.sh >/dev/null 2>&1
export SETUP_DONE=1 CUDA_DEVICE_MAX_CONNECTIONS=32
J=$OUT/own_ab.jsonl
for c in own0 own2 ownw0 ownw2; do
  timeout 50 bash -c ". bench/apply/ab_cases.sh; ab_case $J s12 $c" 2>>$OUT/cases.err | cut -c1-150
done
export RECSYS_DOCTOR_WRITE_SUITE=$OUT/heldout_rows.json
T=$(( 235 - SECONDS )) gpu_test heldout_own tests/test_heldout_gpu.py -k own_graphs

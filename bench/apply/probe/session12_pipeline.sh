# Twelfth session, first GPU call (H200): the code written last session and not yet run on a
# GPU -- the argument-write check (_autoapply/argwrites.py), the index-output padding rule and
# first-call placement (RECSYS_DOCTOR_PLACE=first-call) -- through their GPU tests, then the
# two-stage pipeline script (examples/heldout/feature_pipeline_serve.py: a feature thread hands
# GPU tensors to model threads over a queue) with threads placed at start and at first call,
# the top-k script, and the cost of first-call placement on the keep-target, DLRM and MMoE
# scripts. Stops starting cases past 540 s so the call returns within the device's limit.
. bench/gpu/gpu_setup.sh >/dev/null 2>&1
export SETUP_DONE=1 CUDA_DEVICE_MAX_CONNECTIONS=32
cat $OUT/env.json
t() { gpu_test "$@"; }
t argwrites tests/test_autoapply_argwrites_gpu.py
t pipeline tests/test_autoapply_pipeline_gpu.py
J=$OUT/pipeline_ab.jsonl
run() { [ $SECONDS -lt 540 ] || return 0; timeout 60 bash -c ". bench/apply/ab_cases.sh; ab_case $J $1 $2" 2>>$OUT/cases.err | cut -c1-150; }
run r0 pipe0
for i in 1 2; do run r$i pipe2; run r$i pipe2f; run r$i pipe4; run r$i pipe4f; done
run t0 topk0; run t1 topk2
for c in plain4 plain4f dlrm2 dlrm2f mmoe8 mmoe8f; do run ab1 $c; done
echo "done [${SECONDS}s]"

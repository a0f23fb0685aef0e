# For the next session's second GPU call: should threads be placed at their first model call by
# default? Placed at their start (the default), a thread that never calls a model - a feature
# thread handing GPU tensors to model threads over a queue (examples/heldout/feature_pipeline_serve.py)
# - runs on a group stream with nothing ordering its kernels before the model threads' reads
# (outputs were equal in every H200 run, but nothing guarantees it); placed at first call it stays
# on the default stream, with which the blocking group streams are ordered. One run each on the
# H200 found first-call no slower (plain 3,220 vs 2,942 q/s, DLRM 1,933 vs 1,866, MMoE 1,721 vs
# 1,651). Here: the hook's GPU test files with first-call placement in the environment (every
# hooked run they make inherits it), then the keep-target and suite scripts alternating both.
. bench/gpu/gpu_setup.sh >/dev/null 2>&1
export SETUP_DONE=1 CUDA_DEVICE_MAX_CONNECTIONS=32
RECSYS_DOCTOR_PLACE=first-call T=150 STOP_AT=300 gpu_test autoapply_fc tests/test_autoapply_gpu.py
RECSYS_DOCTOR_PLACE=first-call T=100 STOP_AT=300 gpu_test apply_fc tests/test_apply_gpu.py
J=$OUT/placement.jsonl
run() { [ $SECONDS -lt 540 ] || return 0; timeout 60 bash -c ". bench/apply/ab_cases.sh; ab_case $J $1 $2" 2>>$OUT/cases.err | cut -c1-150; }
for i in 1 2; do for c in plain4 plain4f dlrm2 dlrm2f mmoe8 mmoe8f pipe2 pipe2f; do run p$i $c; done; done

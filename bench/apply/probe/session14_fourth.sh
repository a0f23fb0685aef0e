# The fourteenth session's fourth GPU call: forwards reading the host's clock or random numbers
# run eagerly (runtime/_hostvalues.py): the whole autoapply GPU file (its epsilon-greedy test
# among them), the apply GPU tests, the refresh test (modstate's records), and the suite's DLRM
# and MMoE scripts at fixed plans beside their unhooked runs (no model of theirs is flagged:
# graphs captured and replayed as before); the runtime serving such a model without graphs.
. bench/gpu/gpu_setup.sh >/dev/null 2>&1
export SETUP_DONE=1 CUDA_DEVICE_MAX_CONNECTIONS=32
T=120 gpu_test autoapply_gpu tests/test_autoapply_gpu.py
T=90 gpu_test apply_gpu tests/test_apply_gpu.py
T=120 gpu_test refresh_gpu tests/test_autoapply_refresh_gpu.py
T=60 gpu_test runtime_hv tests/test_runtime_gpu.py -k host_random
J=$OUT/hv.jsonl
run() { [ $SECONDS -lt 420 ] || return 0; timeout 60 bash -c ". bench/apply/ab_cases.sh; ab_case $J $1 $2" 2>/dev/null | cut -c1-200; }
for c in dlrm0 dlrm2 mmoe8 plain0 plain4; do run h1 $c; done
rm -f $OUT/hv.jsonl.log $OUT/setup.log

# Twelfth session, third GPU call (H200): the dispatch modes no longer import torch._dynamo
# (runtime/_modes.py): the top-k and pipeline scripts again, unhooked and hooked, alternating;
# then the hook's, apply's and the runtime's GPU test files, each alone. Stops starting work
# past 540 s.
. bench/gpu/gpu_setup.sh >/dev/null 2>&1
export SETUP_DONE=1 CUDA_DEVICE_MAX_CONNECTIONS=32
J=$OUT/check_ab.jsonl
run() { [ $SECONDS -lt 540 ] || return 0; timeout 60 bash -c ". bench/apply/ab_cases.sh; ab_case $J $1 $2" 2>>$OUT/cases.err | cut -c1-120; }
for i in 1 2; do run c$i topk0; run c$i topk2; run c$i pipe0; run c$i pipe2; done
run c1 pipe4; run c1 pipe2f
t() { STOP_AT=540 gpu_test "$@"; }
t autoapply tests/test_autoapply_gpu.py
t refresh tests/test_autoapply_refresh_gpu.py
t apply tests/test_apply_gpu.py
t argwrites tests/test_autoapply_argwrites_gpu.py
echo "done [${SECONDS}s]"

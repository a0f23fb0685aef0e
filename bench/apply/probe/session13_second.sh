# The second GPU call of session 13: own_graphs_serve.py --capture worker under the hook after
# the fix (the thread's cuBLAS handle is made before its first model call the hook may serve from
# a graph; the script's warm-up was served from the hook's graph, so its first eager matmul was
# inside its own capture), hooked twice against the unhooked run; its GPU test; the runtime's and
# the hook's GPU test files (last session's review refactors, unverified on the GPU).
. bench/gpu/gpu_setup.sh >/dev/null 2>&1
export SETUP_DONE=1 CUDA_DEVICE_MAX_CONNECTIONS=32
J=$OUT/own2.jsonl
run() { [ $SECONDS -lt 200 ] || return 0; timeout 60 bash -c ". bench/apply/ab_cases.sh; ab_case $J $1 $2" 2>>$OUT/cases.err | cut -c1-150; }
for c in ownw0 ownw2 ownw2; do run s13b $c; done
T=120 gpu_test own_graphs_gpu tests/test_autoapply_own_graphs_gpu.py
T=$(( 420 - SECONDS )) gpu_test autoapply_gpu tests/test_autoapply_gpu.py
T=$(( 590 - SECONDS )) gpu_test runtime_gpu tests/test_runtime_gpu.py

# One H200, session 29, sixth call: the hook's GPU tests on the review commit (steady_copy calls
# pageable_fast.same_copy again).
export CUDA_DEVICE_MAX_CONNECTIONS=32
. bench/gpu/gpu_setup.sh >/dev/null 2>&1
T=150 gpu_test autoapply_gpu tests/test_autoapply_gpu.py

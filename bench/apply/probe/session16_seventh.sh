# After Tensor.copy_ from host memory into the script's own GPU tensors is counted at its line
# (_autoapply/copyinto.py): the hook's and apply's GPU tests (a new one for the pattern).
. bench/gpu/gpu_setup.sh >/dev/null 2>&1
export SETUP_DONE=1 CUDA_DEVICE_MAX_CONNECTIONS=32
T=150 gpu_test autoapply_gpu tests/test_autoapply_gpu.py
T=100 gpu_test apply_gpu tests/test_apply_gpu.py
rm -f $OUT/setup.log

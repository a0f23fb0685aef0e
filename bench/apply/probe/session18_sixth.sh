# Two GPUs (nvidia-h200-x2), the session's final code (the guard's identity test for containers of
# tensors and models, this package's functions left unread): the guard's, the multi-GPU, the hook's
# and the refresh GPU tests.
. bench/gpu/gpu_setup.sh >/dev/null 2>&1
export SETUP_DONE=1 CUDA_DEVICE_MAX_CONNECTIONS=32
STOP_AT=300
T=100 gpu_test config_gpu tests/test_autoapply_config_gpu.py
T=120 gpu_test multigpu tests/test_autoapply_multigpu_gpu.py
T=100 gpu_test autoapply_gpu tests/test_autoapply_gpu.py
T=80 gpu_test refresh_gpu tests/test_autoapply_refresh_gpu.py
rm -f $OUT/setup.log

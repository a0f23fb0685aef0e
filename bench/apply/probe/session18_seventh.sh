# One H200, after the review (the scan keyed by holder and name, one _mutator_call): the guard's
# and the hook's GPU tests.
. bench/gpu/gpu_setup.sh >/dev/null 2>&1
export SETUP_DONE=1 CUDA_DEVICE_MAX_CONNECTIONS=32
STOP_AT=150
T=90 gpu_test config_gpu tests/test_autoapply_config_gpu.py
T=90 gpu_test autoapply_gpu tests/test_autoapply_gpu.py
rm -f $OUT/setup.log

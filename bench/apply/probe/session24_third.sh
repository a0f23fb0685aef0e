# One H200: the session's final code: the framework GPU test (a cuda-python program through profile)
# and the capture GPU tests (profile on the wide&deep workload and MMoE training, both backends).
. bench/gpu/gpu_setup.sh >/dev/null 2>&1
export SETUP_DONE=1
STOP_AT=300 T=150 gpu_test framework_gpu tests/test_framework_gpu.py
STOP_AT=420 T=170 gpu_test capture_gpu tests/test_capture_gpu.py

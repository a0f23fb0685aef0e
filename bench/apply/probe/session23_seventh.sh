# One H200: profile --host-sample's new start-up split on a real GPU run (tests/test_host_sample_gpu.py:
# the batch-scoring job, its main thread's import share and top frames), and the capture GPU tests.
. bench/gpu/gpu_setup.sh >/dev/null 2>&1
export SETUP_DONE=1 CUDA_DEVICE_MAX_CONNECTIONS=32
STOP_AT=200 T=150 gpu_test host_sample_gpu tests/test_host_sample_gpu.py -s
STOP_AT=230 T=70 gpu_test capture_gpu tests/test_capture_gpu.py
(cd $OUT && tar czf logs.tgz $(ls | grep -E '\.log$') && rm -f $(ls | grep -E '\.log$'); ls)

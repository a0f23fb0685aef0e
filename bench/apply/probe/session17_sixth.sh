# After serve()'s input check became one flatten_inputs (the example's inside the try): the
# runtime's and batching's GPU tests again.
. bench/gpu/gpu_setup.sh >/dev/null 2>&1
export SETUP_DONE=1 CUDA_DEVICE_MAX_CONNECTIONS=32
T=90 gpu_test runtime_gpu tests/test_runtime_gpu.py
T=90 gpu_test batching_gpu tests/test_batching_gpu.py
rm -f $OUT/setup.log

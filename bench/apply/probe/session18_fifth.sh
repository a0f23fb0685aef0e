# After the guard, the per-device groups and the devices note: the GPU tests of the runtime,
# batching, apply and the hook's refresh / pipeline / own-graphs scripts on one H200.
. bench/gpu/gpu_setup.sh >/dev/null 2>&1
export SETUP_DONE=1 CUDA_DEVICE_MAX_CONNECTIONS=32
STOP_AT=420
T=100 gpu_test runtime_gpu tests/test_runtime_gpu.py
T=100 gpu_test batching_gpu tests/test_batching_gpu.py
T=120 gpu_test apply_gpu tests/test_apply_gpu.py
T=100 gpu_test refresh_gpu tests/test_autoapply_refresh_gpu.py
T=100 gpu_test pipeline_gpu tests/test_autoapply_pipeline_gpu.py
T=80 gpu_test own_graphs_gpu tests/test_autoapply_own_graphs_gpu.py
rm -f $OUT/setup.log

# One H200, session 30, first call: every GPU test file of the project but the held-out scripts' and the
# scripts suite's (their profile --apply runs take ~70 s a script; the suite ran in session 29) on the
# session's first commit (fb72ef9: runtime/_request's memmove address read from ctypes.memmove), Python 3.12.
export CUDA_DEVICE_MAX_CONNECTIONS=32
. bench/gpu/gpu_setup.sh >/dev/null 2>&1
STOP_AT=520
T=90 gpu_test runtime_gpu tests/test_runtime_gpu.py
T=90 gpu_test batching_gpu tests/test_batching_gpu.py
T=120 gpu_test autoapply_gpu tests/test_autoapply_gpu.py
T=60 gpu_test apply_gpu tests/test_apply_gpu.py
T=40 gpu_test argwrites_gpu tests/test_autoapply_argwrites_gpu.py
T=80 gpu_test config_gpu tests/test_autoapply_config_gpu.py
T=60 gpu_test multigpu_gpu tests/test_autoapply_multigpu_gpu.py
T=70 gpu_test own_graphs_gpu tests/test_autoapply_own_graphs_gpu.py
T=80 gpu_test pipeline_gpu tests/test_autoapply_pipeline_gpu.py
T=70 gpu_test refresh_gpu tests/test_autoapply_refresh_gpu.py
T=120 gpu_test trainers_gpu tests/test_autoapply_trainers_gpu.py
T=60 gpu_test capture_gpu tests/test_capture_gpu.py
T=60 gpu_test framework_gpu tests/test_framework_gpu.py
T=40 gpu_test host_sample_gpu tests/test_host_sample_gpu.py
grep -h -E "^(FAILED|ERROR)" $OUT/*.log | head -20
echo "done [${SECONDS}s]"

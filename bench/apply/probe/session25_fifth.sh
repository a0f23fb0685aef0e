# One H200, session 25, on the session's code: the rest of the hook's GPU tests (apply through
# `profile --apply`, a model refreshed while it serves, the argument-write watch, scripts with
# graphs of their own, the runtime's).
. bench/gpu/gpu_setup.sh >/dev/null 2>&1
export SETUP_DONE=1 CUDA_DEVICE_MAX_CONNECTIONS=32
STOP_AT=400 T=200 gpu_test apply_gpu tests/test_apply_gpu.py
STOP_AT=450 T=100 gpu_test refresh_gpu tests/test_autoapply_refresh_gpu.py
STOP_AT=480 T=60 gpu_test argwrites_gpu tests/test_autoapply_argwrites_gpu.py
STOP_AT=500 T=60 gpu_test own_graphs_gpu tests/test_autoapply_own_graphs_gpu.py
STOP_AT=520 T=60 gpu_test runtime_gpu tests/test_runtime_gpu.py
(cd $OUT && tar czf logs.tgz $(ls | grep -E '\.log$|\.txt$') && rm -f $(ls | grep -E '\.log$|\.txt$'); ls)

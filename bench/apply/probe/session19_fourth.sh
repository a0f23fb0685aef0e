# One H200, the session's last code: the GPU tests of the hook's other paths (regression) and the
# exported-model held-out script through profile --apply (its first try was cut by the timeout).
. bench/gpu/gpu_setup.sh >/dev/null 2>&1
export SETUP_DONE=1 CUDA_DEVICE_MAX_CONNECTIONS=32
STOP_AT=260
T=60 gpu_test apply_gpu tests/test_apply_gpu.py
T=60 gpu_test batching_gpu tests/test_batching_gpu.py
T=60 gpu_test runtime_gpu tests/test_runtime_gpu.py
T=70 gpu_test refresh_gpu tests/test_autoapply_refresh_gpu.py
T=70 gpu_test config_gpu tests/test_autoapply_config_gpu.py
T=70 gpu_test pipeline_gpu tests/test_autoapply_pipeline_gpu.py
STOP_AT=300
export RECSYS_DOCTOR_WRITE_SUITE=$OUT/heldout_rows.json
T=220 gpu_test heldout_exported tests/test_heldout_gpu.py -k "exported_ranker" --basetemp=/tmp/bt1
rm -f $OUT/setup.log

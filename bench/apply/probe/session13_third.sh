# The third GPU call of session 13: placement at the first model call made the default (with
# CUDA graphs), and the copies a thread makes before it counted as PyTorch's (_autoapply/unplaced.py).
# The hook's GPU test files, each alone, with the new default; then DLRM and MMoE of the suite
# through profile --apply (rows to $OUT/suite_rows.json).
. bench/gpu/gpu_setup.sh >/dev/null 2>&1
export SETUP_DONE=1 CUDA_DEVICE_MAX_CONNECTIONS=32
T=90 gpu_test apply_gpu tests/test_apply_gpu.py
T=120 gpu_test autoapply_gpu tests/test_autoapply_gpu.py
T=90 gpu_test own_graphs_gpu tests/test_autoapply_own_graphs_gpu.py
T=120 gpu_test pipeline_gpu tests/test_autoapply_pipeline_gpu.py
T=90 gpu_test argwrites_gpu tests/test_autoapply_argwrites_gpu.py
T=90 STOP_AT=360 gpu_test refresh_gpu tests/test_autoapply_refresh_gpu.py
export RECSYS_DOCTOR_WRITE_SUITE=$OUT/suite_rows.json
T=$(( 585 - SECONDS )) STOP_AT=440 gpu_test suite_gpu tests/test_scripts_suite_gpu.py -k "dlrm or mmoe"

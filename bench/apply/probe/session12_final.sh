# Twelfth session, last GPU call (H200): the runtime's GPU tests after its dispatch modes
# changed (runtime/_modes.py: host_syncs and the branch capture), the batching, capture and
# pipeline GPU tests, each file alone; then the top-k held-out script through profile --apply
# (rows in $OUT/heldout_rows.json): it loses at fixed plans, so profile --apply must decline.
. bench/gpu/gpu_setup.sh >/dev/null 2>&1
export SETUP_DONE=1 CUDA_DEVICE_MAX_CONNECTIONS=32
cat $OUT/env.json
t() { T=${T:-100} gpu_test "$@"; }
t test_runtime_gpu tests/test_runtime_gpu.py
t test_batching_gpu tests/test_batching_gpu.py
t test_capture_gpu tests/test_capture_gpu.py
t test_autoapply_pipeline_gpu tests/test_autoapply_pipeline_gpu.py
export RECSYS_DOCTOR_WRITE_SUITE=$OUT/heldout_rows.json
T=$(( 470 - SECONDS )) t test_heldout_topk tests/test_heldout_gpu.py -k topk

# The guard on values a forward reads from outside its module (runtime/_watched.py): its GPU
# tests (in-process waves with and without the guard; config_reload_serve.py under 1/2 groups
# and batching), the hook's GPU tests after the change, and the held-out script through
# profile --apply on the H200.
. bench/gpu/gpu_setup.sh >/dev/null 2>&1
export SETUP_DONE=1 CUDA_DEVICE_MAX_CONNECTIONS=32
STOP_AT=420
T=200 gpu_test config_gpu tests/test_autoapply_config_gpu.py
T=170 gpu_test autoapply_gpu tests/test_autoapply_gpu.py
export RECSYS_DOCTOR_WRITE_SUITE=$OUT/heldout_rows.json
T=170 gpu_test heldout_config tests/test_heldout_gpu.py -k config_reload --basetemp=/tmp/bt1
find /tmp/bt1 -name "*.json" -size -400k | tar czf $OUT/bt1.tgz -T - 2>/dev/null
rm -f $OUT/setup.log

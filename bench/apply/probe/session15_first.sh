# For the next session's first GPU call: the fourteenth session's code written after its last
# GPU call. (1) The hook's GPU tests whole (a thread's calls now counted at every top-level call;
# a forward changing Python state of its module runs eagerly; the grad-on note). (2) The held-out
# script that prints no throughput (examples/heldout/log_only_serve.py) through profile --apply:
# measured by the hook's meter (RECSYS_DOCTOR_METER, _autoapply/meter.py), every run's checksum
# equal, the notes saying so. (3) The short-lived-threads script through profile --apply again
# (the lifetime rule with the call count moved).
. bench/gpu/gpu_setup.sh >/dev/null 2>&1
export SETUP_DONE=1 CUDA_DEVICE_MAX_CONNECTIONS=32
T=90 gpu_test apply_gpu tests/test_apply_gpu.py
T=120 gpu_test autoapply_gpu tests/test_autoapply_gpu.py
T=40 gpu_test runtime_hv tests/test_runtime_gpu.py -k host_random
export RECSYS_DOCTOR_WRITE_SUITE=$OUT/heldout_rows.json
T=$(( 560 - SECONDS )) STOP_AT=420 gpu_test heldout_silent tests/test_heldout_gpu.py -k "log_only or short_threads"
rm -f $OUT/setup.log

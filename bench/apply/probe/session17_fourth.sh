# After the hook walks dataclass arguments and serve() refuses inputs holding objects: the hook's
# GPU tests (a new dataclass test), the runtime's and batching's GPU tests (a new refusal test),
# then the held-out multi-tenant PLE service through profile --apply.
. bench/gpu/gpu_setup.sh >/dev/null 2>&1
export SETUP_DONE=1 CUDA_DEVICE_MAX_CONNECTIONS=32
STOP_AT=330
T=150 gpu_test autoapply_gpu tests/test_autoapply_gpu.py
T=150 gpu_test runtime_gpu tests/test_runtime_gpu.py
T=120 gpu_test batching_gpu tests/test_batching_gpu.py
export RECSYS_DOCTOR_WRITE_SUITE=$OUT/heldout_rows.json
T=230 gpu_test heldout_tenant tests/test_heldout_gpu.py -k tenant_ple --basetemp=/tmp/bt1
find /tmp/bt1 -name "*.json" -size -400k | tar czf $OUT/bt1.tgz -T - 2>/dev/null
rm -f $OUT/setup.log

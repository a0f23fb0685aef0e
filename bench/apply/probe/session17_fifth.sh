# The held-out dataclass-batch DLRM (the hook now walks dataclass arguments) and the
# DataParallel-wrapped wide&deep through profile --apply on the H200.
. bench/gpu/gpu_setup.sh >/dev/null 2>&1
export SETUP_DONE=1 CUDA_DEVICE_MAX_CONNECTIONS=32
STOP_AT=270
export RECSYS_DOCTOR_WRITE_SUITE=$OUT/heldout_rows.json
T=250 gpu_test heldout_dataclass tests/test_heldout_gpu.py -k dataclass_batch --basetemp=/tmp/bt1
T=250 gpu_test heldout_dataparallel tests/test_heldout_gpu.py -k dataparallel --basetemp=/tmp/bt2
for d in bt1 bt2; do find /tmp/$d -name "*.json" -size -400k | tar czf $OUT/$d.tgz -T - 2>/dev/null; done
rm -f $OUT/setup.log

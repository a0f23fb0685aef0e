# Two GPUs (nvidia-h200-x2), after the hook's per-device groups: the replica-per-GPU script under
# the hook's fixed plans and through profile --apply; the hook's GPU tests on GPU 0 of this machine.
. bench/gpu/gpu_setup.sh >/dev/null 2>&1
export SETUP_DONE=1 CUDA_DEVICE_MAX_CONNECTIONS=32
STOP_AT=330
T=200 gpu_test multigpu tests/test_autoapply_multigpu_gpu.py --basetemp=/tmp/bt0
export RECSYS_DOCTOR_WRITE_SUITE=$OUT/heldout_rows.json
T=220 gpu_test heldout_multigpu tests/test_heldout_gpu.py -k multi_gpu --basetemp=/tmp/bt1
T=100 gpu_test autoapply_gpu tests/test_autoapply_gpu.py
grep -hE "^E " $OUT/multigpu.log $OUT/heldout_multigpu.log | head -20
find /tmp/bt0 /tmp/bt1 -name "*.json" -size -400k | tar czf $OUT/bt.tgz -T - 2>/dev/null
rm -f $OUT/setup.log

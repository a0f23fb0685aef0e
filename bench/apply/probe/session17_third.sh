# The held-out one-rank DDP training loop through profile --apply on the H200 (NCCL under the
# hook: gradients on, so declined; outputs must equal), and the hook's GPU tests after the
# host-argument reason names PyTorch's function (pack_padded_sequence).
. bench/gpu/gpu_setup.sh >/dev/null 2>&1
export SETUP_DONE=1 CUDA_DEVICE_MAX_CONNECTIONS=32
STOP_AT=330
export RECSYS_DOCTOR_WRITE_SUITE=$OUT/heldout_rows.json
T=300 gpu_test heldout_ddp tests/test_heldout_gpu.py -k ddp_train --basetemp=/tmp/bt1
T=150 gpu_test autoapply_gpu tests/test_autoapply_gpu.py
find /tmp/bt1 -name "*.json" -size -400k | tar czf $OUT/bt1.tgz -T - 2>/dev/null
rm -f $OUT/setup.log

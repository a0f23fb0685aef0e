# The sixteenth session's last hook changes, CPU-tested only then (pinned async copies before
# placement, the needs-host note of profile --apply, the script-line hints of a failed capture):
# the hook's and apply's GPU tests, then the held-out seqrec_serve.py through profile --apply
# (its report should carry the needs-host note and PyTorch's line).
. bench/gpu/gpu_setup.sh >/dev/null 2>&1
export SETUP_DONE=1 CUDA_DEVICE_MAX_CONNECTIONS=32
STOP_AT=330
T=150 gpu_test autoapply_gpu tests/test_autoapply_gpu.py
T=100 gpu_test apply_gpu tests/test_apply_gpu.py
T=230 RECSYS_DOCTOR_WRITE_SUITE=$OUT/heldout_rows.json gpu_test heldout_seqrec tests/test_heldout_gpu.py -k seqrec --basetemp=/tmp/bt
tar czf $OUT/bt.tgz -C /tmp bt 2>/dev/null
rm -f $OUT/setup.log

# After asynchronous copies from pinned memory that no thread graph takes are counted at their
# lines as PyTorch's: the hook's and apply's GPU tests, then event_timed_serve.py (new pinned
# tensors every query) and pinned_stream_serve.py (reused pinned buffers) through profile --apply.
. bench/gpu/gpu_setup.sh >/dev/null 2>&1
export SETUP_DONE=1 CUDA_DEVICE_MAX_CONNECTIONS=32
T=150 gpu_test autoapply_gpu tests/test_autoapply_gpu.py
T=100 gpu_test apply_gpu tests/test_apply_gpu.py
export RECSYS_DOCTOR_WRITE_SUITE=$OUT/heldout_rows.json
T=250 gpu_test heldout_event tests/test_heldout_gpu.py -k event_timed --basetemp=/tmp/bt
T=$(( 570 - SECONDS )) STOP_AT=380 gpu_test heldout_pinned tests/test_heldout_gpu.py -k pinned_stream --basetemp=/tmp/bt2
cd /tmp && find bt bt2 -name 'apply.json' 2>/dev/null | head -20 > /tmp/list
tar czf $OUT/bt.tgz -T /tmp/list 2>/dev/null; rm -f $OUT/setup.log

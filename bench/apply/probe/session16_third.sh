# The hook's GPU tests whole (a capture that needs the host makes its module eager at once; a
# frozen model called with gradients on is graphed under no_grad), then the new held-out
# frozen_pool_serve.py (torch.set_grad_enabled(False) at the top, a frozen checkpoint scored by
# pool threads with gradients on) as it is and through profile --apply.
. bench/gpu/gpu_setup.sh >/dev/null 2>&1
export SETUP_DONE=1 CUDA_DEVICE_MAX_CONNECTIONS=32
T=150 gpu_test autoapply_gpu tests/test_autoapply_gpu.py
python3 examples/heldout/frozen_pool_serve.py --threads 4 --queries 4000 > $OUT/frozen_plain.txt 2>&1; tail -1 $OUT/frozen_plain.txt
export RECSYS_DOCTOR_WRITE_SUITE=$OUT/heldout_rows.json
T=$(( 575 - SECONDS )) gpu_test heldout_frozen tests/test_heldout_gpu.py -k frozen_pool --basetemp=/tmp/bt
cd /tmp && find bt -name 'apply.json' -o -name '*.log' 2>/dev/null | head -60 > /tmp/list
tar czf $OUT/bt.tgz -T /tmp/list 2>/dev/null; rm -f $OUT/setup.log

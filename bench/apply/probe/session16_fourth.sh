# After the third call: the hook's GPU tests again (the uncapturable model's test no longer bounds
# how many calls see which reason; a group whose call got past the module's record re-checks it
# before capturing), the apply GPU tests, and the held-out data-dependent-branch DLRM
# (fresh_boost_dlrm.py: a forward that syncs on its data) through profile --apply.
. bench/gpu/gpu_setup.sh >/dev/null 2>&1
export SETUP_DONE=1 CUDA_DEVICE_MAX_CONNECTIONS=32
T=150 gpu_test autoapply_gpu tests/test_autoapply_gpu.py
T=120 gpu_test apply_gpu tests/test_apply_gpu.py
export RECSYS_DOCTOR_WRITE_SUITE=$OUT/heldout_rows.json
T=$(( 575 - SECONDS )) gpu_test heldout_fresh tests/test_heldout_gpu.py -k fresh_boost --basetemp=/tmp/bt
cd /tmp && find bt -name 'apply.json' -o -name '*.log' 2>/dev/null | head -60 > /tmp/list
tar czf $OUT/bt.tgz -T /tmp/list 2>/dev/null; rm -f $OUT/setup.log

# One H200, session 25, on the final code (45152f3: a model call's site cached by the script frame
# found): the hook's GPU tests again, and the DLRM script hooked (g4) against unhooked once, with
# the checksum.
. bench/gpu/gpu_setup.sh >/dev/null 2>&1
export SETUP_DONE=1 CUDA_DEVICE_MAX_CONNECTIONS=32
STOP_AT=120 T=120 gpu_test autoapply_gpu tests/test_autoapply_gpu.py
STOP_AT=150 T=60 gpu_test apply_gpu tests/test_apply_gpu.py
. bench/apply/ab_cases.sh
[ "$SECONDS" -lt 170 ] && { ab_case $OUT/final.jsonl unhooked dlrm0; ab_case $OUT/final.jsonl hooked dlrm4; }
(cd $OUT && tar czf logs.tgz $(ls | grep -E '\.log$|\.txt$') && rm -f $(ls | grep -E '\.log$|\.txt$'); ls)

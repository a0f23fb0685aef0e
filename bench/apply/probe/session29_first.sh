# One H200, session 29, first call (session 28's eighth, which could not start, renamed): the hook's and apply's GPU
# tests on 2f09cc8 (a9d8cdf + review) (accounting keyed by the call's instruction, memmove without a result object),
# then DLRM g4 against e7bcfb8 (old_tree), 2 rounds, order alternating, while time is left.
. bench/gpu/gpu_setup.sh >/dev/null 2>&1
export CUDA_DEVICE_MAX_CONNECTIONS=32
STOP_AT=100 T=90 gpu_test autoapply_gpu tests/test_autoapply_gpu.py
STOP_AT=130 T=40 gpu_test apply_gpu tests/test_apply_gpu.py
[ "$SECONDS" -lt 140 ] && CASES="dlrm4" AB_PIN="taskset -c 0-7" timeout $((215 - SECONDS)) bash bench/apply/hook_ab.sh old_tree 2 2>&1 | grep -v "^setup\|^NVIDIA" | cut -c1-110
echo "done [${SECONDS}s]"
(cd $OUT && tar czf logs.tgz $(ls | grep -E '\.log$|\.txt$') && rm -f $(ls | grep -E '\.log$|\.txt$'); ls)

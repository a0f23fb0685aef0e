# One H200, session 26, first call, on 63c247c (the review's refactor of the hook's steady path,
# not yet run on a GPU): the hook's GPU tests; then issue 25's two closest scripts (DLRM, MMoE)
# unhooked and under a fixed plan at 4, 8 and 16 client threads (the acceptance asks >= 4): is
# the hooked run bound by the GIL (then more threads add nothing) or by each query's chain of
# GIL hand-offs (the hooked DLRM held the GIL ~50% of the time on the H100: more threads fill it)?
. bench/gpu/gpu_setup.sh >/dev/null 2>&1
export SETUP_DONE=1 CUDA_DEVICE_MAX_CONNECTIONS=32
STOP_AT=100 T=130 gpu_test autoapply_gpu tests/test_autoapply_gpu.py
STOP_AT=240 T=60 gpu_test apply_gpu tests/test_apply_gpu.py
J=$OUT/threads.jsonl
run() { [ "$SECONDS" -lt 560 ] && timeout 120 python3 bench/apply/hooked_run.py "$J" "$@"; }
for th in 4 8 16; do
  run "t$th" 0 examples/scripts/dlrm_numpy_serve.py --threads $th --queries 3000
  run "t$th" 4 examples/scripts/dlrm_numpy_serve.py --threads $th --queries 6000
done
run t16 8 examples/scripts/dlrm_numpy_serve.py --threads 16 --queries 6000
for th in 4 16; do
  run "t$th" 0 examples/scripts/mmoe_ranker.py --threads $th --queries 3000
  run "t$th" 8 examples/scripts/mmoe_ranker.py --threads $th --queries 6000
done
echo "done [${SECONDS}s]"
(cd $OUT && tar czf logs.tgz $(ls | grep -E '\.log$|\.txt$') && rm -f $(ls | grep -E '\.log$|\.txt$'); ls)

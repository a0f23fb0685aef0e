# One H200, session 31, second call (issue 24): callers staging their own queries (runtime/_prestage.py, in the
# working tree) against HEAD (old_tree, a git archive laid out as installed and put first on PYTHONPATH):
# the batching GPU tests on the new tree, then the sweep, 2 rounds in alternating order.
export CUDA_DEVICE_MAX_CONNECTIONS=32
. bench/gpu/gpu_setup.sh >/dev/null 2>&1
T=120 gpu_test batching_gpu tests/test_batching_gpu.py
pkg=$(realpath old_tree).pkg; rm -rf $pkg; mkdir -p $pkg; cp -r old_tree/recsys_doctor $pkg/
for d in analyzers runtime reports; do cp -r old_tree/$d $pkg/recsys_doctor/$d; done
C=runtime_batched_call,runtime_batched_submit,runtime_batched_call_dr2
sweep() {  # label round
  OUT=$OUT/ab NAME=$1_r$2.json QS=1,4,8,32,64,128 DUR=1 CONFIG_TIMEOUT=60 CONFIGS=$C \
    timeout 150 python3 bench/serving/serving_sweep.py 2>&1 | grep '^#' | tr '\n' ' '; echo "$1 r$2 [${SECONDS}s]"
}
for i in 1 2; do
  if [ $i = 1 ]; then sweep new $i; PYTHONPATH=$pkg sweep old $i; else PYTHONPATH=$pkg sweep old $i; sweep new $i; fi
done
OUT=$OUT/ab NAME=hand.json QS=1,4,8,32,64,128 DUR=1 CONFIGS=handroll_prepacked timeout 60 python3 bench/serving/serving_sweep.py > /dev/null 2>&1
for l in new old; do echo "== $l"; python3 bench/serving/sweep_table.py $OUT/ab/${l}_r1.json $OUT/ab/${l}_r2.json; done
python3 bench/serving/sweep_table.py $OUT/ab/hand.json
(cd $OUT && tar czf ab.tgz ab && rm -rf ab)
echo "done [${SECONDS}s]"
